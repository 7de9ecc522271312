"""Liger's RMSNorm, SwiGLU and RoPE kernels (setup `liger_kernels`): what they keep for the
backward instead of transformers' eager modules. Read in liger-kernel 0.8.5 (the PyPI wheel;
the same functions save the same tensors in linkedin/Liger-Kernel v0.8.2@000be609) and
transformers 5.17.0; bench/results/liger_kernels_2026-12-05.md has the whole reading.

transformers' Trainer with `use_liger_kernel=True` calls `_apply_liger_kernel_to_instance`
(trainer.py:1452-1453, integrations/liger.py:28-53) with Liger's defaults, for llama RoPE,
RMSNorm, SwiGLU and fused linear cross-entropy (monkey_patch.py:259-266; the loss is
`loss=liger`, estimator/memory/logits.py). Per decoder layer, bytes per token:
- RMSNorm (`LigerRMSNormFunction`, ops/rms_norm.py:674 `ctx.save_for_backward(X, W, RSTD)`,
  RSTD fp32, :465-466): its input X as is and one fp32 inverse rms per row; no fp32 copy of
  the input and no normalised tensor (eager: `rms_norm_saved`). The input layernorm's X is the
  layer's input itself (the checkpoint under checkpointing); the post-attention norm's X is
  the residual sum, which the eager layer holds until its last add but does not save.
- SwiGLU (`LigerSiLUMulFunction`, ops/swiglu.py:272 saves (a, b)): the gate and up outputs;
  silu(gate) is recomputed in the backward, which writes d(gate) and d(up) into a and b
  (:104-105). Eager `act_fn(gate) * up` saves silu's output too, one MLP-wide tensor more,
  and its backward makes two MLP-wide gradients.
- RoPE (`LigerRopeFunction`, ops/rope.py:289 saves (cos, sin); q and k rotated in place,
  :153-198): nothing per token, as the eager `apply_rotary_pos_emb` (cos, sin only).
The LoRA path is untouched: `LigerSwiGLUMLP` calls the module's own (peft-wrapped) gate_proj,
up_proj and down_proj (transformers/swiglu.py:34-35).

Liger patches the model types of `MODEL_TYPE_TO_APPLY_LIGER_FN` (monkey_patch.py:3904); for
any other `_apply_liger_kernel_to_instance` changes nothing, so trainfit refuses the setting.

MoE experts: under transformers 5, `swiglu=True` replaces the fused expert banks' module with
`LigerExperts` (`FUSED_EXPERT_MODEL_TYPES`), whose forward is one `LigerFusedMoEFunction`
(transformers/swiglu.py:75-115, ops/fused_moe.py:160-430): `fused_moe_saved` and
`fused_moe_backward` (DeepSeek-V3's routed experts too, activations_deepseek.py). Shared experts
keep their eager SwiGLU terms (Liger's SwiGLU, patched on some of them, keeps one fewer).
"""

from __future__ import annotations

from estimator.dtypes import FP32
from estimator.errors import EstimatorInputError
from estimator.spec import ModelSpec

# liger-kernel 0.8.5 transformers/monkey_patch.py:3904 MODEL_TYPE_TO_APPLY_LIGER_FN
LIGER_MODEL_TYPES = frozenset(
    {
        "deepseek_v2", "deepseek_v3", "deepseek_v4", "exaone4", "falcon_h1", "gemma", "gemma2",
        "gemma3", "gemma3_text", "gemma4", "gemma4_text", "glm4", "glm4v", "glm4v_moe",
        "gpt_oss", "granite", "hunyuan_v1_dense", "hunyuan_v1_moe", "internvl", "llama",
        "llama4", "llama4_text", "llava", "ministral", "mistral", "mixtral", "mllama",
        "mllama_text_model", "muse_glimmer", "nemotron", "olmo2", "olmo3", "paligemma", "phi3",
        "pixtral", "qwen2", "qwen2_5_vl", "qwen2_5_vl_text", "qwen2_vl", "qwen2_vl_text",
        "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe",
        "qwen3_next", "qwen3_vl", "qwen3_vl_moe", "qwen3_vl_moe_text", "qwen3_vl_text",
        "smollm3", "smolvlm",
    }
)  # fmt: skip


def liger_applies(spec: ModelSpec, liger_kernels: bool | None) -> bool:
    """Whether Liger's kernels change this model's layers; a model type Liger has no patch
    for is refused (the setting would change nothing in the run)."""
    if not liger_kernels:
        return False
    if spec.model_type not in LIGER_MODEL_TYPES:
        raise EstimatorInputError(
            "setup.liger_kernels",
            f"Liger has no kernels for model_type {spec.model_type!r} "
            "(liger-kernel 0.8.5 MODEL_TYPE_TO_APPLY_LIGER_FN)",
        )
    return True


def norm_saved(input_bytes: int, width: int, rows: int = 1) -> float:
    """Bytes per token `LigerRMSNormFunction` keeps: its input X (`input_bytes` per value) and
    an fp32 inverse rms per row."""
    return float(input_bytes * width + FP32 * rows)


# liger-kernel 0.8.5 transformers/monkey_patch.py: under transformers >= 5 (:64) `swiglu=True`
# sets the model's experts module to LigerExperts for these types (mixtral :881, qwen3_moe
# :1916, qwen3_vl_moe :2335, qwen3_next :3174, qwen3_5_moe :3385, hunyuan_v1_moe :3523), and on
# a built model swaps each layer's `mlp.experts` (e.g. :1932 `_patch_swiglu_module`); deepseek_v3
# :3723 (its router's top-k weights are fp32: estimator/memory/activations_deepseek.py)
FUSED_EXPERT_MODEL_TYPES = frozenset(
    {
        "mixtral", "qwen3_moe", "qwen3_vl_moe", "qwen3_vl_moe_text", "qwen3_next",
        "qwen3_5_moe", "qwen3_5_moe_text", "hunyuan_v1_moe", "deepseek_v3",
    }
)  # fmt: skip
INDEX = 4  # int32 routing metadata (ops/fused_moe.py:102-104)


def fused_experts(spec: ModelSpec) -> bool:
    """Liger's `LigerExperts` replaces this model's routed experts (softmax-routed SwiGLU
    banks of `FUSED_EXPERT_MODEL_TYPES`)."""
    return spec.moe is not None and spec.model_type in FUSED_EXPERT_MODEL_TYPES


def fused_moe_saved(spec: ModelSpec, value_bytes: int, weight_bytes: int) -> float:
    """Bytes per token `LigerFusedMoEFunction` saves for its backward besides the router's
    terms (ops/fused_moe.py:258-270 `ctx.save_for_backward`): its input x (tokens x hidden;
    `value_bytes`, the experts' dtype), `pre_act` (the gate and up outputs, top_k x 2 x expert
    width per token, :206), the routing weights flattened (top_k per token in the router's
    output dtype, `weight_bytes`) and three int32 routing indices per routed token
    (x_gather_idx, s_scatter_idx, s_reverse_scatter_idx, :102-104). `post_act` and the down
    outputs `Y` are freed after the forward (:207, :233); the backward recomputes them."""
    assert spec.moe is not None and spec.hidden
    k, me = spec.moe.experts_per_token, spec.moe.expert_intermediate
    routed = k * (2 * me * value_bytes + weight_bytes + 3 * INDEX)
    return float(value_bytes * spec.hidden + routed)


def fused_moe_backward(spec: ModelSpec, value_bytes: int) -> tuple[float, float]:
    """`LigerFusedMoEFunction.backward` (ops/fused_moe.py:285-430): (bytes per token, bytes
    per layer) alive when it returns, all of its buffers held to the end: d_pre_act (top_k x 2
    x expert width), weighted_act (top_k x expert width), dS (top_k), dx_expanded (top_k x
    hidden) and dx (hidden) per token (:312-314, :371, :394), and the whole banks' gradients
    `zeros_like(down_proj)` and `zeros_like(gate_up_proj)` (:347, :411), made whether the
    banks are trained or not. `value_bytes`: the experts' dtype (activations.py expert_bytes),
    both x's, whose dtype the per-token buffers take, and the banks', whose the gradients take:
    bf16 both, or fp32 both under AMP full fine-tuning's fp32 stream and banks."""
    assert spec.moe is not None and spec.hidden
    k, me, h = spec.moe.experts_per_token, spec.moe.expert_intermediate, spec.hidden
    per_token = value_bytes * (k * (3 * me + 1 + h) + h)
    banks = value_bytes * spec.moe.num_experts * 3 * h * me
    return float(per_token), float(banks)
