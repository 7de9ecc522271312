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
Dense MLPs only: MoE expert MLPs keep their eager terms (an overestimate where Liger patches
them).
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
