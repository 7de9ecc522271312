"""Context parallelism's ring attention: the buffers one attention backward allocates beyond a
one-device SDPA backward, per device (torch 2.6.0
torch/distributed/tensor/experimental/_attention.py, the implementation torchtitan@9dec370's
`context_parallel` runs (torchtitan/utils.py:171-192); torch 2.13's
_context_parallel/_attention.py has the same buffers).

Defaults (`_ContextParallelOptions`, 2.6.0 :53-59): convert_to_f32 True, enable_load_balance
True, rotate_method ALL_GATHER; torchtitan@9dec370 config_manager.py:365-367 passes "allgather"
(`set_rotate_method`, :1305-1324). In `_templated_ring_attention_backward` (:606-772), with T
local tokens (b s / cp), Q = query width and KV = the width of the key (= value) SDPA receives
per tp rank, cb the attention dtype's bytes:
- the gradient accumulators `grad_query / grad_key / grad_value = zeros_like(..., float32)`
  (:633-635): 4 T (Q + 2 KV);
- the K/V rotation (`_AllGatherRotater`, :301-326): `torch.cat([key, value])` sent (:653) and
  one all-gather of every rank's K and V (`ft_c.all_gather_tensor`, :317-319), kept until the
  attention ends: cb 2 T KV (1 + cp), the term that grows with the cp degree;
- the dK/dV rotation (`_AllToAllRotater`, forced at :640): the fp32 `torch.cat([grad_key,
  grad_value])` (:745) and `permute_tensor`'s received copy (:294): 2 x 4 x 2 T KV.
The forward (`_templated_ring_attention`, :358-528) allocates the same K/V gather and an fp32
merged output (`_SDPAMerger`, :156, :184), less than the backward, and at a moment (a layer's
forward or recompute) the backward's transient already covers, so the backward's is the one
counted, on top of the recompute peak of one layer.

KV: the model's key/value heads (SDPA with native GQA, the estimator's SDPA path,
`activations._attention_core`), or the query heads where the stack's attention repeats K/V to
every query head before SDPA (stack fact `sdpa_repeats_kv`: torchtitan@9dec370
torchtitan/models/llama/model.py:201-202 `keys = repeat_kv(xk, self.n_rep)`, `values =
repeat_kv(xv, self.n_rep)` -> (bs, seqlen, n_local_heads, head_dim), then :209
`F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)`): the ring all-gathers and
accumulates what SDPA receives.
"""

from __future__ import annotations

from estimator.dtypes import FP32
from estimator.parallel.layout import Layout
from estimator.spec import ModelSpec


def ring_backward_extra_per_token(
    spec: ModelSpec, layout: Layout, cb: int, repeats_kv: bool = False
) -> float:
    """Bytes per local token of one attention backward's ring buffers (module docstring);
    0 without context parallelism or without softmax attention heads. `repeats_kv`: K/V reach
    SDPA at the query heads (stack fact `sdpa_repeats_kv`)."""
    cp = layout.cp
    if cp <= 1 or not spec.num_heads or not spec.head_dim:
        return 0.0
    q = spec.num_heads * spec.head_dim / layout.tp
    kv_heads = spec.num_heads if repeats_kv else (spec.num_kv_heads or spec.num_heads)
    kv = kv_heads * spec.head_dim / layout.tp
    accumulators = FP32 * (q + 2 * kv)
    kv_rotation = cb * 2 * kv * (1 + cp)
    dkv_rotation = 2 * FP32 * 2 * kv
    return accumulators + kv_rotation + dkv_rotation
