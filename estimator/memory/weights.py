"""`weights`: the model's parameters as they sit on the device during the step."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from estimator.dtypes import BF16, FP32, int8_bytes_per_param, nf4_bytes_per_param
from estimator.errors import EstimatorInputError
from estimator.profile import Profile
from estimator.spec import ModelSpec
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup


def counted_params(spec: ModelSpec, profile: Profile) -> int:
    """Parameters the weights are computed from: the text decoder, plus the `extras` (vision
    tower, MTP head) the profile names in `weights_include_extras`, optionally rounded to
    `params_significant_digits` as a hand calculation would (seed 000 rounds to 27.8 B)."""
    include = set(profile.get("memory", "weights_include_extras"))
    total = spec.params_total + sum(g.params for g in spec.extras if g.name in include)
    digits = profile.get("memory", "params_significant_digits")
    if digits:
        magnitude = 10 ** (int(math.floor(math.log10(total))) - int(digits) + 1)
        total = int(round(total / magnitude) * magnitude)
    return total


# torch's CUDA caching allocator rounds every allocation up to 512 bytes (torch 2.13
# c10/core/AllocatorConfig.h:17-25 kMinBlockSize; `memory/reserved.py` K_MIN_BLOCK), which
# max_memory_allocated counts.
MIN_BLOCK = 512


def _blocks(nbytes: int) -> int:
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def rope_buffer_bytes(spec: ModelSpec, setup: TrainingSetup) -> float:
    """Device buffers of the stack's rotary embedding that are not parameters (stack fact
    `rope_cache_buffers`). torchtune (v0.6.1 and 1814feb17 alike) builds one RoPE module per
    model, shared by every layer's attention (models/llama3_1/_component_builders.py:85, :98;
    llama3_2/_component_builders.py:89, :102), with `max_seq_len` = the named builders' 131072
    for Llama 3.1/3.2 (llama3_1/_model_builders.py:34, llama3_2/_model_builders.py:37), i.e.
    the config's `max_position_embeddings`. Its `rope_init` registers two non-persistent fp32
    buffers on the model's device (models/llama3_1/_position_embeddings.py:62-101): `theta`
    (head_dim/2 values) and `cache` = (max_seq_len, head_dim/2, 2) cos and sin: 32 MiB for
    Llama 3.2 1B (head_dim 64), 64 MiB for Llama 3.1 8B (head_dim 128). Not sharded by FSDP
    (fully_shard shards parameters, not buffers): every rank holds them."""
    if not load_stack(setup.stack).get("rope_cache_buffers"):
        return 0.0
    if not spec.max_positions or not spec.head_dim:
        return 0.0
    half = spec.head_dim // 2
    return float(_blocks(spec.max_positions * half * 2 * FP32) + _blocks(half * FP32))


def quantized_base(setup: TrainingSetup) -> bool:
    return setup.is_adapter and setup.base in ("nf4", "int8")


def check_stored_quantization(spec: ModelSpec, setup: TrainingSetup) -> None:
    """A checkpoint bitsandbytes stored quantized (`spec.stored_quantization`) trains only with
    adapters (transformers 5.25.0 trainer_utils.py:129-135: "You cannot perform fine-tuning on
    purely quantized models") and on the base as stored (quantizers/auto.py:244-247): any
    other setup is bad input naming the field, not an estimate of a run that cannot happen."""
    stored = spec.stored_quantization
    if stored is None:
        return
    what = "4 bits" if stored == "nf4" else "8 bits"
    use = "method qlora" if stored == "nf4" else "method lora with base int8"
    if not setup.is_adapter:
        raise EstimatorInputError(
            "setup.method",
            f"{spec.name} is stored in {what} by bitsandbytes: transformers trains it only "
            f"with adapters; use {use}",
        )
    if setup.base != stored:
        raise EstimatorInputError(
            "setup.base",
            f"{spec.name} is stored in {what} by bitsandbytes and loads so whatever the run "
            f"asks (base {setup.base}); use {use}",
        )


def kbit_fp32(setup: TrainingSetup) -> bool:
    """peft's prepare_model_for_kbit_training (peft 0.22.0 utils/other.py:234-238) casts every
    fp16/bf16 parameter that is not Params4bit to fp32: norms, embeddings, lm_head and any
    unquantized weight; bnb's Linear4bit then returns its input's dtype (bitsandbytes 0.50.2
    nn/modules.py:626-637), so the residual stream is fp32 too."""
    return quantized_base(setup) and bool(setup.kbit_prepare)


# Set while a `parallel` layout prices its one-device base
# (estimator/memory/sharded.py): those layouts keep bf16 compute copies of fp32 masters.
_MASTERS_LAYOUT: ContextVar[bool] = ContextVar("masters_layout", default=False)


@contextmanager
def masters_layout(on: bool) -> Iterator[None]:
    """Within: `mixed` is bf16 weights + fp32 masters on every stack (see `amp_full`)."""
    token = _MASTERS_LAYOUT.set(on)
    try:
        yield
    finally:
        _MASTERS_LAYOUT.reset(token)


def amp_full(setup: TrainingSetup) -> bool:
    """Full fine-tuning at `mixed` precision on a stack whose mixed precision is torch AMP
    (`mixed_precision: "amp"`, the hf stack: accelerate 1.x accelerator.py:1791-1801 wraps
    model.forward in torch.autocast and never casts the weights). The weights stay in the load
    dtype, fp32: fp32 gradients and optimizer states, no master copy; autocast makes the bf16
    copies (`autocast_layer_casts`). Other stacks' `mixed` is bf16 weights + fp32 masters, and
    so is the hf stack's under sharding: FSDP's MixedPrecision keeps fp32 flat parameters with
    bf16 compute copies (accelerate 1.16.0 accelerator.py:1960-2023 upcasts the flat
    parameters to fp32), ZeRO keeps fp32 partitions; so do `parallel` layouts
    (`masters_layout`), whose bf16 compute copies estimator/parallel/data.py models (DDP under
    AMP would keep fp32 replicas: not modelled yet)."""
    return (
        not setup.is_adapter
        and setup.precision == "mixed"
        and setup.autocast is not False
        and setup.sharding in ("none", "device_map")
        and not setup.parallel
        and not _MASTERS_LAYOUT.get()
        and load_stack(setup.stack).get("mixed_precision") == "amp"
    )


def quantized_params(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, float]:
    """(parameters, bytes) of the Linear weights the quantizer replaces. With `quantize_experts`
    false (the hf stack's default: transformers 5 + bnb replace nn.Linear only) the fused 3-D
    expert banks stay in the load dtype; true (axolotl's quantize_moe_experts) they are NF4 as
    well. LLM.int8: 1 byte + an fp32 scale per output row."""
    quantize_experts = bool(setup.quantize_experts)
    chosen = [
        lin
        for lin in spec.linears
        if lin.group != "head" and (lin.experts == 1 or quantize_experts)
    ]
    params = sum(lin.params for lin in chosen)
    if setup.base == "int8":
        return params, sum(lin.params * int8_bytes_per_param(lin.in_features) for lin in chosen)
    # a checkpoint stored quantized keeps its own double quantization (`check_stored_quantization`)
    double = spec.stored_double_quant if spec.stored_quantization else setup.double_quant
    return params, params * nf4_bytes_per_param(bool(double))


def weight_bytes(spec: ModelSpec, setup: TrainingSetup, profile: Profile) -> float:
    """Full fine-tuning: the compute copy (bf16 for `mixed`/`bf16`, fp32 for `fp32`; the fp32
    master of `mixed` is a trainable state, as in the ZeRO paper's 2+2+12 split). Under AMP
    (`amp_full`) the fp32 weights themselves are trained: 4 bytes each.
    LoRA: the frozen base in bf16 (fp32 if precision fp32).
    QLoRA / LLM.int8 LoRA: the quantized Linear weights (QLoRA paper; bitsandbytes), the rest
    (embeddings, norms, lm_head, unquantized expert banks) in bf16, or fp32 after peft's
    prepare_model_for_kbit_training (`kbit_prepare`).
    The stack's RoPE buffers (`rope_buffer_bytes`) are added by the callers, unsharded."""
    params = counted_params(spec, profile)
    dense_bytes = FP32 if setup.precision == "fp32" or amp_full(setup) else BF16
    if not quantized_base(setup) or not spec.geometry_known:
        return params * dense_bytes
    quantized, qbytes = quantized_params(spec, setup)
    quantized = min(quantized, params)
    rest = FP32 if kbit_fp32(setup) else BF16
    return qbytes + (params - quantized) * rest
