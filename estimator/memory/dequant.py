"""The dequantized weight a quantized base's matmul makes, forward and backward (stack fact
`nf4_dequant`).

torchtune's QLoRA (`nf4_dequant: "torchao"`): every quantized projection, LoRA-wrapped or not,
calls torchao's `linear_nf4` (torchtune 0.6.1 modules/peft/lora.py:129-130,
modules/low_precision/nf4_linear.py:66), whose autograd function dequantizes the weight for the
forward matmul and again for the backward one (torchao 0.11.0 dtypes/nf4tensor.py:964-975
`LinearNF4`: `F.linear(input, weight.to(input.dtype))`, `grad_output @
weight.to(grad_output.dtype)`; it saves the NF4 weight, not a dequantized copy). `weight.to(dtype)`
is `get_original_weight()` (:1006-1016 `function_to_dtype`), whose locals are all alive at its
last line (:756-782), for a weight of n elements in dtype d (the dtype it was quantized from, the
recipe's `dtype`):

    first_elements, second_elements   (quantized_data >> 4 / & 0b1111).to(torch.long)  2 x 4n
    dequantized_first, _second        nf4[...] (the table in dtype d, :577-598)         2 x d n/2
    scalers                           dequantize_scalers (:691-714), one per block      d n/64
    scaled_first, scaled_second       dequantized_* x repeated.flatten()                2 x d n/2
    torch.stack([...])                the bf16 weight returned (reshape is a view)        d n

8n + 3dn + dn/64 bytes (`repeated.flatten()`'s copy, d n/2, is freed before the second one is
made); the stacked weight alone lives on through the matmul. One Linear at a time.

Where in the step: the largest quantized Linear of a decoder layer is the MLP's down projection
(SwiGLU: hidden x intermediate, as gate and up), and its forward is the layer's last matmul, so
its dequantization happens when the layer has saved everything but the down projection's own
LoRA branch. Under checkpointing that is the layer's recompute inside the backward: what
`activations._forward_transient` counts there besides the saved tensors (the two gradients, the
residual, the MLP input), less the down projection's base output, which the matmul makes only
after the dequantization. Its backward dequantizes again with the layer's saved tensors and one
incoming gradient alive, less than that. Checked on `--stack torchtune` QLoRA of small-llama at
256 tokens (the tracker's live storages at the activations' most, bench/accuracy.py): the
recompute's down projection, the 8 get_original_weight tensors above (2,528,768 B) on the
layer's saved tensors. Without checkpointing the moment is the first forward's last layer:
no gradients yet, but the layer's input, which the decoder's loop holds (torchtune 0.6.1
modules/transformer.py `for layer in self.layers: h = layer(h, ...)`; a checkpoint otherwise),
with its attention output and residual (modules/transformer.py TransformerSelfAttentionLayer:
`attn_out`, `h = attn_out + x`, both bound until the layer returns): 3 x hidden (measured the
same way, QLoRA without checkpointing, 256 tokens). The loss has none (the output projection
is a plain bf16 Linear, torchtune 0.6.1 models/llama3_2/_component_builders.py:266-268).

Not modelled: `compile` (inductor fuses the dequantization into the layer's graph) and the
FSDP2 paths (memory/sharded.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from estimator.memory.activations import Context, _forward_transient
from estimator.spec import ModelSpec
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

LONG = 8  # torch.long, the unpacked 4-bit codes
BLOCK = 64  # torchao 0.11.0 nf4tensor.py:988 to_nf4(block_size=64), what torchtune calls


def nf4_dequant_peak(numel: int, dtype_bytes: int, block: int = BLOCK) -> float:
    """Bytes alive at the end of torchao 0.11's `get_original_weight` for a weight of `numel`
    elements quantized from a `dtype_bytes` dtype (module docstring)."""
    return float(LONG * numel + 3 * dtype_bytes * numel + dtype_bytes * numel / block)


def dequant_peak(spec: ModelSpec, setup: TrainingSetup, dtype_bytes: int) -> float:
    """The largest dequantization transient of a decoder layer's quantized Linears (0 when the
    stack dequantizes none this way, or under `compile`)."""
    kind = load_stack(setup.stack).get_optional("nf4_dequant", None)
    if kind != "torchao" or setup.base != "nf4" or not setup.is_adapter or setup.compile:
        return 0.0
    sizes = [
        lin.in_features * lin.out_features
        for lin in spec.linears
        if lin.group != "head" and lin.experts == 1
    ]
    return nf4_dequant_peak(max(sizes), dtype_bytes) if sizes else 0.0


def dequant_terms(ctx: Context, spec: ModelSpec, setup: TrainingSetup) -> tuple[float, float]:
    """(bytes per token besides a layer's saved tensors, bytes) when its quantized down
    projection dequantizes in the forward (module docstring); (0, 0) without one."""
    peak = dequant_peak(spec, setup, ctx.compute_bytes)
    if not peak:
        return 0.0, 0.0
    width = ctx.compute_bytes * (spec.hidden or 0)
    held = _forward_transient(ctx, spec) - width  # the base output comes after the dequant
    if setup.checkpointing == "none":
        held -= width  # no gradients (2 x hidden) yet, but the layer's input (the loop holds it)
    return held, peak


def dequant_moment(ctx: Context, spec: ModelSpec, setup: TrainingSetup, tokens: Any) -> Any:
    """`dequant_terms` at `tokens` tokens (0 without a dequantization)."""
    held, peak = dequant_terms(ctx, spec, setup)
    return tokens * held + peak if peak else tokens * 0.0
