"""Saved activations of gpt-oss's MoE block (bytes per token), hooked into
`activations._mlp` for specs whose `MoEGeometry.activation` is `clamped_swiglu`.

transformers v5 `modeling_gpt_oss` (k = experts per token, m = intermediate_size, h = hidden):
- GptOssTopKRouter: F.linear over the block input (saved when the router trains), `topk` saves
  its int64 indices (k), the softmax over the top-k logits its output (k, compute dtype);
- the experts (`integrations/moe.grouped_mm_experts_forward`, transformers' default
  `experts_implementation`): the tokens gathered per expert (k * h, saved when the banks
  train), the routing weight per copy (k), int64 indices of k per token kept by the gathers
  (`perm // top_k` for the tokens, `perm` for the routing weights, the one of the scatter back
  to the tokens, and `expert_ids_g` of the per-row bias gather when the banks train), the fused
  gate_up output
  (2m per copy, kept by the clamps), then `GptOssExperts._apply_gate`: clamp(gate), sigmoid,
  gate * sigmoid, up + 1, their product — four m-wide tensors saved, plus down_proj's input
  (m) when the banks train — and the weighted expert output (k * h).
Equal to torch's saved-tensor hooks on a tiny GptOssMLP, full fine-tuning and frozen experts
(tests/estimator/test_architectures_paths.py; CPU `grouped_mm`).
"""

from __future__ import annotations

from estimator.dtypes import INT64
from estimator.memory.activations import Context, expert_bytes, inputs_saved
from estimator.spec import ModelSpec


def gpt_oss_experts(ctx: Context, spec: ModelSpec) -> tuple[float, float]:
    """(saved bytes per token, widest intermediate per token) of one MoE block."""
    assert spec.moe is not None and spec.hidden
    cb = ctx.compute_bytes
    eb = expert_bytes(ctx, spec)  # the grouped_mm experts' dtype (the router's stays cb)
    k, m, h = spec.moe.experts_per_token, spec.moe.expert_intermediate, spec.hidden
    banks_train = ctx.full or ctx.expert_lora
    saved = inputs_saved(ctx, ["router"], h) + INT64 * k + cb * k  # router input, topk, softmax
    saved += cb * k + 3 * INT64 * k  # routing weight per copy; token, weight, scatter indices
    if banks_train:
        saved += eb * k * h + INT64 * k  # gathered tokens (gate_up matmul); bias gather index
    saved += eb * k * 2 * m + 4 * eb * k * m  # gate_up output; clamp, sigmoid, glu, up + 1
    if banks_train:
        saved += eb * k * m  # down_proj's input
    saved += eb * k * h  # expert output, kept by the routing-weight multiply
    return saved, float(k * 2 * m)  # the fused gate_up gradient is the widest
