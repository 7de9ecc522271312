"""Context parallelism's ring attention: the buffers one attention backward allocates beyond a
one-device SDPA backward, per device (torch 2.13
torch/distributed/tensor/experimental/_context_parallel/_attention.py, the implementation
torchtitan's `context_parallel` runs).

Defaults (`_ContextParallelOptions`, :70-78): convert_to_f32 True, rotate_method ALL_GATHER.
In `_templated_ring_attention_backward` (:488-650), with T local tokens (b s / cp), Q = query
width and KV = key (= value) width per tp rank, cb the attention dtype's bytes:
- the gradient accumulators `grad_query / grad_key / grad_value = zeros_like(..., float32)`
  (:512-515): 4 T (Q + 2 KV);
- the K/V rotation (`_AllGatherRotater`, :273-297): `torch.cat([key, value])` sent (:533) and
  one all-gather of every rank's K and V (`all_gather_single`, :285-291), kept until the
  attention ends: cb 2 T KV (1 + cp);
- the dK/dV rotation (`_AllToAllRotater`, forced at :520): the fp32 `torch.cat([grad_key,
  grad_value])` (:625) and `permute_tensor`'s received copy (:261-265): 2 x 4 x 2 T KV.
The forward (`_templated_ring_attention`, :317-485) allocates the same K/V gather and an fp32
merged output (`_SDPAMerger`, convert_to_f32), less than the backward, and at a moment (a
layer's forward or recompute) the backward's transient already covers, so the backward's is
the one counted, on top of the recompute peak of one layer. K/V are taken at the model's
key/value heads (the estimator's SDPA path, `activations._attention_core`); a model that
repeats K/V to every query head before SDPA (torchtitan's llama `repeat_kv`) passes wider
K/V, which this leaves out.
"""

from __future__ import annotations

from estimator.dtypes import FP32
from estimator.parallel.layout import Layout
from estimator.spec import ModelSpec


def ring_backward_extra_per_token(spec: ModelSpec, layout: Layout, cb: int) -> float:
    """Bytes per local token of one attention backward's ring buffers (module docstring);
    0 without context parallelism or without softmax attention heads."""
    cp = layout.cp
    if cp <= 1 or not spec.num_heads or not spec.head_dim:
        return 0.0
    q = spec.num_heads * spec.head_dim / layout.tp
    kv = (spec.num_kv_heads or spec.num_heads) * spec.head_dim / layout.tp
    accumulators = FP32 * (q + 2 * kv)
    kv_rotation = cb * 2 * kv * (1 + cp)
    dkv_rotation = 2 * FP32 * 2 * kv
    return accumulators + kv_rotation + dkv_rotation
