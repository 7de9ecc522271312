"""Moments of the model's first and last norms outside a decoder layer's own, which count
without checkpointing only (every layer's saved tensors alive with them).

torchtune 0.6.1's RMSNorm is `F.rms_norm(x.float(), weight=self.scale).to(x.dtype)`
(modules/rms_norm.py), which torch runs as the composite on a bf16 scale (aten/src/ATen/native/
layer_norm.cpp `rms_norm_composite`: `pow(x, 2).mean(-1, keepdim).add_(eps)`, `rsqrt`,
`x.mul(rsqrt)`, `.mul(weight)`), so its backward is autograd's, op by op (torch
tools/autograd/derivatives.yaml): the cast's backward makes the fp32 gradient, `mul(weight)`'s
`grad * weight` (fp32), `mul(x, rsqrt)`'s `grad * rsqrt` (kept for the sum with the pow branch)
and `grad * x` (summed to a row, freed), `mean`'s backward `grad.expand(...) / n` (a full
tensor, FunctionsManual.cpp mean_backward), and `pow`'s `grad * (2 * x.pow(1))` (pow_backward:
`x.pow(1)`, `2 * ...`, `grad * ...`): five fp32 hidden-wide tensors alive together at its last
multiply, with the norm's saved fp32 input.

transformers' LlamaRMSNorm (`LLAMA_RMS_NORMS`: `hidden_states.to(torch.float32)`, `pow(2).mean`,
`hidden_states * torch.rsqrt(variance + eps)`, `self.weight * hidden_states.to(input_dtype)`;
transformers 5.25.0 models/llama/modeling_llama.py:60-67, copied op for op by the types listed)
runs the same fp32 ops: with its weight frozen (adapters) the trace of its backward at the start
of an un-checkpointed LoRA step holds the same five fp32 hidden-wide tensors (`aten.mul` x2,
`div`, `pow`, `mul.Scalar`) beside the saved fp32 input (fake trace of small Qwen3-MoE, LoRA,
no checkpointing, 1024 tokens: the activations' most, bench/results/accuracy_hf_2026-12-07.md).
The hybrid models' Gemma norm (`HYBRID_GEMMA_NORMS`: `x.float()`,
`x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`,
`output * (1.0 + self.weight.float())`, `type_as(x)`; models/qwen3_5/modeling_qwen3_5.py:921-931)
leaves the same five at that moment (fake trace of small Qwen3.5's full bf16 fine-tuning
without checkpointing), beside its saved fp32 input and, for a trained weight, its fp32
normalised tensor (`Context.norm_product_fp32`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from estimator.dtypes import BF16, FP32
from estimator.memory.activations import HYBRID_GEMMA_NORMS, Context, rms_norm_saved
from estimator.spec import ModelSpec
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

NORM_BACKWARD_TENSORS = 5  # fp32 hidden-wide, alive together (module docstring)

# model types whose RMSNorm is LlamaRMSNorm op for op (transformers 5.25.0: the RMSNorm class
# of each models/<type>/modeling_<type>.py; gpt-oss and OLMo 2 multiply the weight in fp32,
# Llama 4, Gemma and Qwen3.5 / Qwen3-Next normalise in another order)
LLAMA_RMS_NORMS = frozenset(
    {
        "llama",
        "mistral",
        "ministral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "phi3",
        "granite",
        "smollm3",
        "glm4",
        "glm4_moe",
        "glm4_moe_lite",
        "deepseek_v3",
        "qwen2_vl_text",
        "qwen2_5_vl_text",
        "qwen3_vl_text",
        # vision-language composites: the spec keeps the composite's type, the language model
        # is one of the above (Mistral 3: MistralModel)
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "mistral3",
    }
)


def _hf_rms_norms(ctx: Context, spec: ModelSpec, setup: TrainingSetup) -> bool:
    """transformers' own LlamaRMSNorm (or the hybrid models' Gemma norm) with bf16 compute, on
    a stack that replaces no norm (not torchtune's / torchtitan's / Liger's, not Unsloth's fast
    RMSNorm on its models, stack fact `fused_kernels`; no compiled layers). Under AMP's fp32
    weights the residual stream is fp32 and the norm's casts are identities (its saved input is
    the stream itself, its normalised tensor fp32: `rms_norm_saved(stream=True)`); the fp32
    compute of `prepare_model_for_kbit_training` was not traced here and is left as before."""
    if ctx.torchtune or ctx.torch_norm or ctx.liger or ctx.compiled:
        return False
    if spec.model_type not in LLAMA_RMS_NORMS | HYBRID_GEMMA_NORMS:
        return False
    if ctx.compute_bytes != BF16:
        return False
    return spec.model_type not in (load_stack(setup.stack).get("fused_kernels") or ())


def final_norm_backward(ctx: Context, spec: ModelSpec, setup: TrainingSetup) -> float:
    """Bytes per token of the model's last norm's backward besides what the decoder layers
    saved: its saved tensors and the five fp32 tensors of its backward. It runs before any
    layer's backward, so without checkpointing every layer's saved tensors are alive with it
    (measured on `--stack torchtune` LoRA of small-llama, and on the hf stack's LoRA of small
    Qwen3-MoE and full bf16 and AMP fine-tuning of small Llama: the activations' most).
    transformers' norm saves its fp32 input, the rsqrt per row and, with its weight trained,
    the normalised tensor in the input's dtype (`rms_norm_saved`)."""
    h = spec.hidden or 0
    if ctx.torchtune:
        return float(FP32 * h * (1 + NORM_BACKWARD_TENSORS))
    if _hf_rms_norms(ctx, spec, setup):
        return float(rms_norm_saved(ctx, h, stream=True) + FP32 * h * NORM_BACKWARD_TENSORS)
    return 0.0


def first_norm_unsaved(ctx: Context, spec: ModelSpec, setup: TrainingSetup) -> float:
    """Bytes per token the first layer's input norm does not save: with the embedding frozen
    (adapters) its input needs no gradient and its scale trains not, so autograd records no
    graph for it (no input requires grad). Only without checkpointing, where every layer's
    saved tensors are counted (a checkpointed layer's worst is any other layer). On the hf
    stack nothing makes the embedding's output require grad then: transformers calls
    `enable_input_require_grads` from `gradient_checkpointing_enable` (5.25.0
    modeling_utils.py:3192-3200) and peft when the model checkpoints as it is wrapped (0.21.2
    peft_model.py:184-185, 728-735) or from `prepare_model_for_kbit_training` with
    `use_gradient_checkpointing` (utils/other.py:222-233). Fake traces of the hf stack's
    un-checkpointed LoRA (small Llama, small Qwen3-MoE): three of the four layer norms' fp32
    inputs alive at the forward's end."""
    if not setup.is_adapter or setup.train_embeddings:
        return 0.0
    if not (ctx.torchtune or _hf_rms_norms(ctx, spec, setup)):
        return 0.0
    return rms_norm_saved(ctx, spec.hidden or 0)
