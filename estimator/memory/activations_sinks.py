"""Saved activations of gpt-oss attention with sinks (bytes per token), hooked into
`activations.layer_activations` for specs with `attention_sinks`.

transformers v5 `modeling_gpt_oss.eager_attention_forward` (the path `sdpa` falls back to, see
`ModelSpec.requires_eager`): QK^T saves q and the repeated k; the sinks are concatenated as one
more logit column; `combined_logits.max(dim=-1)` saves its int64 indices (one per head and
query); `F.softmax(..., dtype=combined_logits.dtype)` keeps its output in the compute dtype
(bf16), s + 1 wide, and no fp32 copy (unlike the Llama-style eager softmax in fp32 plus a
bf16 copy); the PV matmul saves a view of it and the repeated v. Dropout with p = 0 returns its
input (ATen `dropout`). Everything else is the generic attention core. Flash kernels that take
sinks save what any flash kernel saves (the generic core). Equal to torch's saved-tensor hooks
on a tiny GptOssAttention (tests/estimator/test_architectures_paths.py).
"""

from __future__ import annotations

from estimator.dtypes import INT64  # torch.max(dim=...) indices
from estimator.memory.activations import Context, _attention_core
from estimator.spec import ModelSpec


def sinks_attention(ctx: Context, spec: ModelSpec) -> tuple[float, float]:
    """(bytes per token, bytes per token per sequence position) of one attention layer."""
    saved, per_seq = _attention_core(ctx, spec)
    if not ctx.eager:
        return saved, per_seq
    heads = spec.num_heads or 0
    per_seq = heads * ctx.compute_bytes  # the softmax output, in the compute dtype only
    saved += heads * ctx.compute_bytes + INT64 * heads  # its sink column; max's indices
    return saved, per_seq
