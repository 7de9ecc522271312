"""TRL's SFTTrainer casts a quantized model's trainable parameters to bf16 (trl 1.16.0
trl/trainer/sft_trainer.py:908-911), whoever applied peft; it runs the hf stack's chunked loss.
So on the hf stack QLoRA (and LoRA on an int8 base) with the chunked loss trains bf16 adapters
(stack fact `quantized_adapter_dtype`); transformers' own Trainer (`--loss full`) keeps peft's
fp32 default. Before, the hf stack counted fp32 adapters: their gradients and AdamW states twice
(measured by tests/probe/test_trl_loss_accuracy.py on the CPU)."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

SPEC = spec_from_config(preset_config("llama-3.1-8b"))
PROFILE = load_profile("default")


@pytest.mark.parametrize(
    ("fields", "dtype"),
    [
        ({"method": "qlora"}, "bf16"),
        ({"method": "lora", "base": "int8"}, "bf16"),
        ({"method": "qlora", "loss": "full"}, "fp32"),  # transformers' Trainer
        ({"method": "qlora", "adapter_dtype": "fp32"}, "fp32"),  # asked for
        ({"method": "lora"}, "fp32"),  # not quantized
        ({"method": "qlora", "stack": "unsloth"}, "fp32"),  # not TRL's cast
    ],
)
def test_the_adapter_dtype_the_trainer_gives(fields: dict[str, str], dtype: str) -> None:
    setup = TrainingSetup(**fields)
    assert setup.adapter_dtype == dtype
    assert TrainingSetup.model_validate(setup.model_dump()) == setup  # a stored setup


def test_bf16_adapters_halve_the_trainable_states() -> None:
    bf16 = TrainingSetup(method="qlora")
    fp32 = bf16.model_copy(update={"adapter_dtype": "fp32"})
    states = [
        float(memory_breakdown(SPEC, s, [2048], 1, PROFILE).components["trainable_states"][0])
        for s in (bf16, fp32)
    ]
    # (fused AdamW's fp32 step counters do not halve)
    assert states[0] == pytest.approx(states[1] / 2, rel=1e-3)
