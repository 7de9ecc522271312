"""`weights`: the model's parameters as they sit on the device during the step."""

from __future__ import annotations

import math

from estimator.dtypes import BF16, FP32, nf4_bytes_per_param
from estimator.profile import Profile
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec


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


def weight_bytes(spec: ModelSpec, setup: TrainingSetup, profile: Profile) -> float:
    """Full fine-tuning: the compute copy (bf16 for `mixed`/`bf16`, fp32 for `fp32`; the fp32
    master of `mixed` is a trainable state, as in the ZeRO paper's 2+2+12 split).
    LoRA: the frozen base in bf16 (fp32 if precision fp32).
    QLoRA: decoder Linear weights in NF4 with double-quant constants (QLoRA paper; bitsandbytes
    keeps embeddings, norms and lm_head in bf16)."""
    params = counted_params(spec, profile)
    dense_bytes = FP32 if setup.precision == "fp32" else BF16
    if setup.method != "qlora" or not spec.geometry_known:
        return params * dense_bytes
    quantized = min(spec.params_linear, params)
    return quantized * nf4_bytes_per_param() + (params - quantized) * BF16
