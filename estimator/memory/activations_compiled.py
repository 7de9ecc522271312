"""Saved activations of a decoder layer compiled with torch.compile (inductor).

AOTAutograd partitions the layer's joint graph, decomposed with inductor's table
(torch/_inductor/decomposition.py select_decomp_table; SDPA stays one op that saves its output
and a logsumexp), with `min_cut_rematerialization_partition` (torch 2.13
torch/_functorch/partitioners.py): fusible elementwise ops are recomputed in the
backward, but matmuls and SDPA are never recomputed and, with the default
`ban_recompute_reductions` / `ban_recompute_long_fusible_chains` (torch/_functorch/config.py),
neither are the norms' reductions nor long fusible chains, so what crosses to the backward is
the matmuls' outputs and inputs in the compute dtype: no fp32 norm upcasts, no rotary fp32
copies, no silu output. `bench/compile_saved.py` runs that partitioner on transformers'
`LlamaDecoderLayer` (bf16, SDPA) and lists the tensors it keeps; per token:

- weights trained: the layer input, the two norm outputs, the attention residual sum (h each),
  q and k after rotary, v, SDPA's output and o_proj's input (q, k, v widths), the gate and up
  outputs and down's input (3 x intermediate), plus the two norms' fp32 rsqrt and SDPA's fp32
  logsumexp per head;
- weights frozen: the layer input and the attention residual sum, q, k, v, SDPA's output, the
  gate and up outputs; an adapted projection adds its input (recomputed from what is kept only
  when that input is itself kept) and lora_A's output.

A stack whose attention repeats K/V to the query heads before SDPA (`repeats_kv`, stack fact
`sdpa_repeats_kv`: torchtitan@9dec370 models/llama/model.py:201-202) has SDPA's k and v
inputs saved at the query width: bench/titan_sac_saved.py compiles torchtitan@9dec370's own
TransformerBlock without checkpointing and the partition keeps q, k and v at its 8 query heads,
not its 2 kv heads, with every other tensor above (bench/results/titan_sac_saved_2026-12-04.txt:
18,728 B/token = this count's 18,472 + the rotary table's complex64 conjugate, 256 B per
position, which is not counted). torchtune 0.6.1's layer (`torchtune_modules`: attention.py:285-291
expands k and v to num_heads) the same, trained and frozen: bench/tune_compiled_saved.py runs
its own TransformerSelfAttentionLayer, 18,472 B/token trained and 12,328 frozen besides its rope
cache buffer (bench/results/tune_compiled_saved_2026-12-04.txt), this count with k, v at the
query width.
"""

from __future__ import annotations

from estimator.dtypes import FP32
from estimator.spec import ModelSpec

# Decoder inputs each adapted projection reads: (targets, width name).
_ADAPTER_INPUTS = (
    (("q_proj", "k_proj", "v_proj", "qkv_proj"), "hidden"),
    (("gate_proj", "up_proj", "gate_up_proj"), "hidden"),
    (("down_proj",), "intermediate"),
)
_ALL_ADAPTED = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj")


def compiled_layer_saved(
    spec: ModelSpec,
    compute_bytes: int,
    full: bool,
    targets: frozenset[str],
    rank_bytes: int,
    repeats_kv: bool = False,
) -> float:
    """Bytes per token a compiled dense decoder layer keeps for its backward (module note).
    `rank_bytes` x rank per adapter is lora_A's output (the caller adds it); `repeats_kv`: k
    and v saved at the query heads (module note)."""
    assert spec.num_heads and spec.head_dim and spec.num_kv_heads is not None
    cb = compute_bytes
    h, m = spec.hidden or 0, spec.intermediate or 0
    q = spec.num_heads * spec.head_dim
    kv = q if repeats_kv else spec.num_kv_heads * spec.head_dim
    rows = FP32 * (2 + spec.num_heads)  # two rsqrt per row, logsumexp per head
    if full:
        return cb * (4 * h + 3 * q + 2 * kv + 3 * m) + rows
    saved = cb * (2 * h + 2 * q + 2 * kv + 2 * m) + rows
    widths = {"hidden": h, "intermediate": m}
    for names, width in _ADAPTER_INPUTS:
        if any(n in targets for n in names):
            saved += cb * widths[width]
    if "o_proj" in targets:
        saved += cb * q
    return saved


def adapted_count(targets: frozenset[str]) -> int:
    """How many adapted projections of a dense layer (one lora_A output each)."""
    return sum(1 for n in (*_ALL_ADAPTED, "down_proj") if n in targets)
