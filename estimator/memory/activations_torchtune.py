"""Moments of torchtune 0.6.1's RMSNorm outside a decoder layer's own (stack fact
`torchtune_modules`, see `activations.torchtune_modules`).

torchtune's RMSNorm is `F.rms_norm(x.float(), weight=self.scale).to(x.dtype)`
(modules/rms_norm.py), which torch runs as the composite on a bf16 scale (aten/src/ATen/native/
layer_norm.cpp `rms_norm_composite`: `pow(x, 2).mean(-1, keepdim).add_(eps)`, `rsqrt`,
`x.mul(rsqrt)`, `.mul(weight)`), so its backward is autograd's, op by op (torch
tools/autograd/derivatives.yaml): the cast's backward makes the fp32 gradient, `mul(weight)`'s
`grad * weight` (fp32), `mul(x, rsqrt)`'s `grad * rsqrt` (kept for the sum with the pow branch)
and `grad * x` (summed to a row, freed), `mean`'s backward `grad.expand(...) / n` (a full
tensor, FunctionsManual.cpp mean_backward), and `pow`'s `grad * (2 * x.pow(1))` (pow_backward:
`x.pow(1)`, `2 * ...`, `grad * ...`): five fp32 hidden-wide tensors alive together at its last
multiply, with the norm's saved fp32 input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from estimator.dtypes import FP32
from estimator.memory.activations import Context, rms_norm_saved
from estimator.spec import ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

NORM_BACKWARD_TENSORS = 5  # fp32 hidden-wide, alive together (module docstring)


def final_norm_backward(ctx: Context, spec: ModelSpec) -> float:
    """Bytes per token of the model's last norm's backward besides what the decoder layers
    saved: its saved fp32 input and the five fp32 tensors of its backward. It runs before any
    layer's backward, so without checkpointing every layer's saved tensors are alive with it
    (measured on `--stack torchtune` LoRA of small-llama: the activations' most)."""
    if not ctx.torchtune:
        return 0.0
    return float(FP32 * (spec.hidden or 0) * (1 + NORM_BACKWARD_TENSORS))


def first_norm_unsaved(ctx: Context, spec: ModelSpec, setup: TrainingSetup) -> float:
    """Bytes per token the first layer's input norm does not save: with the embedding frozen
    (adapters) its input needs no gradient and its scale trains not, so autograd records no
    graph for it (no input requires grad). Only without checkpointing, where every layer's
    saved tensors are counted (a checkpointed layer's worst is any other layer)."""
    if not ctx.torchtune or not setup.is_adapter or setup.train_embeddings:
        return 0.0
    return rms_norm_saved(ctx, spec.hidden or 0)
