"""Saved activations of DeepSeek-V3's MoE block (bytes per token), hooked into
`activations._mlp` for specs whose `MoEGeometry.router` is `grouped_sigmoid`.

transformers v5 `modeling_deepseek_v3` (h hidden, E experts, k per token,
m = moe_intermediate_size, s = the shared experts' width):
- DeepseekV3TopkRouter: F.linear in fp32 over an fp32 copy of the block input (saved when the
  router weight trains), the sigmoid scores (E, fp32), the int64 indices of the final top-k
  (k, kept by the gather of the weights), and the normalisation (the k fp32 weights and their
  fp32 sum). Under autocast F.linear (on its lower-precision list, torch 2.13.0
  aten/src/ATen/autocast_mode.h) casts both fp32 copies to bf16 and saves those, so the saved
  input, the logits and everything the router derives from them are bf16 (`router_bytes`; the
  fake trace of small GLM-4.5's bf16 step under autocast: (256, 256) and (256, 8) bf16 casts
  at modeling_glm4_moe.py:284, bf16 sigmoid scores at :285). The group-limited selection
  (per-group top-2, group top-k, the bool mask) only feeds indices: its graph does not reach
  the output and its saved tensors are freed at once;
- the experts (`integrations/moe.grouped_mm_experts_forward`): the gathered tokens (k * h, when
  the banks train), three int64 gather / scatter indices of k, the fp32 routing weight per copy
  (k), the fused gate_up output (2m per copy), silu's output (m), down_proj's input (m, when the
  banks train), and the expert output (k * h);
- shared_experts (DeepseekV3MLP): the block input (when they train), gate and up outputs,
  silu's output, down_proj's input (when it trains) (`shared_expert_saved`). The block adds
  them last (modeling_deepseek_v3.py:220 `hidden_states + self.shared_experts(residuals)`;
  glm4_moe :391, glm4_moe_lite :481), so they are not yet made when the routed experts'
  recomputed forward applies the routing weights, and their backward, whose nodes are the
  newest of the block, runs before the routed experts' (autograd runs the ready node of the
  highest sequence number first): at the combine's backward and the routed experts' own they
  are freed (activations.py `shared_after_routed`). Found in the fake trace of small
  GLM-4.5's full fine-tuning, whose activations peak at the combine's backward without them
  (+6.4 % before).
Equal to torch's saved-tensor hooks on a tiny DeepseekV3MoE, full fine-tuning and frozen
(tests/estimator/test_architectures_paths.py; CPU `grouped_mm`).
"""

from __future__ import annotations

from estimator.dtypes import BF16, FP32, INT64
from estimator.memory import liger
from estimator.memory.activations import Context, expert_bytes, inputs_saved
from estimator.spec import ModelSpec


def deepseek_moe(ctx: Context, spec: ModelSpec) -> tuple[float, float]:
    """(saved bytes per token, widest intermediate per token) of one MoE block."""
    moe = spec.moe
    assert moe is not None and spec.hidden
    h = spec.hidden
    k, m, s, e = (
        moe.experts_per_token,
        moe.expert_intermediate,
        moe.shared_intermediate,
        moe.num_experts,
    )
    banks_train = ctx.full or ctx.expert_lora
    rb = router_bytes(ctx)
    saved = rb * h if ctx.full or "gate" in ctx.targets else 0.0  # the router's saved input
    saved += rb * e + INT64 * k
    saved += rb * k + rb  # normalised weights and their sum
    eb = expert_bytes(ctx, spec)  # the grouped_mm experts' dtype
    if ctx.liger and liger.fused_experts(
        spec
    ):  # LigerExperts (liger-kernel 0.8.5 monkey_patch.py:3723; memory/liger.py)
        saved += liger.fused_moe_saved(spec, eb, rb)  # the router's top-k weights
    else:
        saved += 3 * INT64 * k + rb * k  # gather / scatter indices, routing weight per copy
        saved += _grouped_mm_saved(eb, k, h, m, banks_train)
    saved += shared_expert_saved(ctx, spec)
    return saved, float(k * 2 * m + s)


def router_bytes(ctx: Context) -> int:
    """Bytes per element of the router's saved input, scores and weights (module docstring):
    fp32 as written, bf16 under autocast."""
    return BF16 if ctx.autocast else FP32


def shared_expert_saved(ctx: Context, spec: ModelSpec) -> float:
    """Bytes per token the shared experts save (module docstring), 0 without them."""
    assert spec.moe is not None
    s, h = spec.moe.shared_intermediate, spec.hidden or 0
    if not s:
        return 0.0
    saved = inputs_saved(ctx, ["gate_proj", "up_proj"], h)
    return saved + 3 * ctx.compute_bytes * s + inputs_saved(ctx, ["down_proj"], s)


def _grouped_mm_saved(eb: int, k: int, h: int, m: int, banks_train: bool) -> float:
    """transformers' grouped_mm routed experts: bytes per token saved in the experts' dtype."""
    saved = 0.0
    if banks_train:
        saved += eb * k * h + eb * k * m  # gathered tokens, down_proj's input
    saved += eb * k * 2 * m + eb * k * m + eb * k * h  # gate_up output, silu, expert output
    return saved
