"""LoRA on the fused MoE expert banks named as peft `target_parameters` (axolotl's
`lora_target_parameters`, an adapter_config.json's `target_parameters`): trainfit's targets
`experts`, `experts.gate_up_proj`, `experts.down_proj`. Before, such configs were a warning
(axolotl) or "not modelled" (peft) and the banks' adapters, with their gradients, optimizer
states and merged banks, were missing from the estimate (Qwen3-30B-A3B, r16: 629 M trainable
parameters). Counts are checked against peft itself on tiny models (meta device)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.lora import lora_params
from estimator.memory.states import MIN_8BIT_SIZE, small_tensor_params
from estimator.setup import TrainingSetup
from estimator.train_config import read_train_config_text
from tests.estimator.test_architectures import TINY
from tests.estimator.test_lora import peft_model

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
PEFT_TOKENS = [
    (["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], ["experts"]),
    (["experts.down_proj"], ["experts.down_proj"]),
    (["experts.gate_up_proj"], ["experts.gate_up_proj"]),
]


def _peft_model(model_type: str, parameters: list[str], rank: int) -> Any:
    return peft_model(model_type, rank, target_modules=ATTENTION, target_parameters=parameters)


def _spec(model_type: str) -> Any:
    transformers = pytest.importorskip("transformers")
    return spec_from_config(transformers.CONFIG_MAPPING[model_type](**TINY[model_type]).to_dict())


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize(("parameters", "tokens"), PEFT_TOKENS)
def test_trainable_counts_match_peft(
    model_type: str, parameters: list[str], tokens: list[str]
) -> None:
    wrapped = _peft_model(model_type, parameters, 4)
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    setup = TrainingSetup(method="lora", lora_rank=4, lora_targets=ATTENTION + tokens)
    assert lora_params(_spec(model_type), setup) == sum(p.numel() for p in trainable)
    # the tensors an 8-bit optimizer keeps at 32 bits: those under 4096 values
    small = sum(p.numel() for p in trainable if p.numel() < MIN_8BIT_SIZE)
    assert small_tensor_params(_spec(model_type), setup) == small


def test_what_peft_cannot_run_is_refused_naming_the_field() -> None:
    dense = _spec("llama")
    with pytest.raises(EstimatorInputError) as err:
        lora_params(dense, TrainingSetup(method="lora", lora_targets=["q_proj", "experts"]))
    assert err.value.field == "setup.lora_targets"
    moe = _spec("qwen3_moe")
    dropped = TrainingSetup(method="lora", lora_targets=["experts"], lora_dropout=0.05)
    with pytest.raises(EstimatorInputError) as err:
        lora_params(moe, dropped)
    assert err.value.field == "setup.lora_dropout"  # ParamWrapper refuses dropout


def test_axolotl_s_lora_target_parameters() -> None:
    text = (
        "base_model: Qwen/Qwen3-30B-A3B\nadapter: qlora\nload_in_4bit: true\n"
        "lora_target_modules: [q_proj, k_proj, v_proj, o_proj]\n"
        "lora_target_parameters:\n  - mlp.experts.gate_up_proj\n  - mlp.experts.down_proj\n"
    )
    mapping = read_train_config_text(text)
    assert mapping.setup["lora_targets"] == [*ATTENTION, "experts"]
    assert not [w for w in mapping.warnings if w.startswith("lora_target_parameters")]
    other = read_train_config_text(text.replace("mlp.experts.down_proj", "router.weight"))
    assert other.setup["lora_targets"] == [*ATTENTION, "experts.gate_up_proj"]
    assert "lora_target_parameters" in {i.key for i in other.ignored}


def test_peft_s_own_adapter_config() -> None:
    peft = pytest.importorskip("peft")
    saved = peft.LoraConfig(
        r=8, target_modules=ATTENTION, target_parameters=["experts.down_proj"]
    ).to_dict()
    text = json.dumps(
        {k: sorted(v) if isinstance(v, set) else v for k, v in saved.items()}, default=str
    )
    mapping = read_train_config_text(text)
    assert sorted(mapping.setup["lora_targets"]) == sorted([*ATTENTION, "experts.down_proj"])
    assert "target_parameters" not in {i.key for i in mapping.ignored}


def test_the_adapted_banks_count_in_the_estimate() -> None:
    from estimator.memory import memory_breakdown
    from estimator.presets import preset_config
    from estimator.profile import load_profile

    spec = spec_from_config(preset_config("qwen3-30b-a3b"))
    peaks = []
    for targets in (ATTENTION, [*ATTENTION, "experts"]):
        setup = TrainingSetup(method="qlora", lora_rank=16, lora_targets=targets)
        peaks.append(memory_breakdown(spec, setup, 4096.0, 1, load_profile("default")).peak)
    # 629 M more trainable parameters: at least their weights and two AdamW states, alive
    # through the step (gradients come and go with the backward), bf16 since TRL's SFTTrainer
    # casts a quantized model's adapters (tests/estimator/test_trl_quantized_adapters.py)
    assert peaks[1] - peaks[0] > 629e6 * 6
