"""MLP target names on MoE models whose expert banks peft 0.22.0 remaps (transformers v5's
qwen2_moe conversion pattern: Qwen2-MoE, Qwen3-MoE, Qwen3-Next, DeepSeek-V3, GLM-4.5): bare
gate_proj, up_proj and down_proj adapt the fused expert parameters and the dense-MLP or
shared-expert Linears of those names (peft 0.21.2 adapted the banks only); a dotted name
(`mlp.down_proj`) adapts those Linears only; naming one of gate_proj / up_proj alone, or any
bank with dropout, is what peft refuses. Each case is checked against peft on the model
transformers builds on the meta device.
Before: Qwen3-MoE with the seven usual names counted 8,064 adapter parameters where peft makes
27,904 (the experts' adapters were missing)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.lora import lora_params
from estimator.setup import TrainingSetup
from tests.estimator.test_architectures import TINY
from trainfit.cli import main

SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MLA = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
CASES = [
    ("qwen3_moe", SEVEN),
    ("qwen3_moe", ["q_proj", "v_proj", "gate_proj", "up_proj"]),
    ("qwen3_moe", ["q_proj", "mlp.down_proj"]),
    ("qwen3_moe", [r"re:.*\.(q_proj|gate_proj|up_proj)"]),
    ("qwen3_next", ["q_proj", "gate_proj", "up_proj", "down_proj"]),
    ("deepseek_v3", [*MLA, "gate_proj", "up_proj", "down_proj"]),
    ("glm4_moe", SEVEN),
    ("glm4_moe_lite", [*MLA, "gate_proj", "up_proj", "down_proj"]),
    ("glm4_moe", ["q_proj", "down_proj"]),
    ("qwen2_moe", SEVEN),  # remapped since peft 0.22.0: banks and shared expert
    ("mixtral", SEVEN),  # mixtral's remapped names are w1 / w3 / w2
]


def _peft_model(model_type: str, targets: list[str], dropout: float = 0.0) -> Any:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    transformers.logging.set_verbosity_error()
    config = transformers.CONFIG_MAPPING[model_type](**TINY[model_type])
    modules: Any = list(targets)
    if targets[0].startswith("re:") or targets == ["all-linear"]:
        modules = targets[0].removeprefix("re:")  # peft's string forms
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config)
        lora = peft.LoraConfig(r=4, target_modules=modules, lora_dropout=dropout)
        return peft.get_peft_model(model, lora), config.to_dict()


def _setup(targets: list[str], dropout: float = 0.0) -> TrainingSetup:
    return TrainingSetup(method="lora", lora_rank=4, lora_targets=targets, lora_dropout=dropout)


@pytest.mark.parametrize("model_type, targets", CASES)
def test_named_mlp_targets_adapt_what_peft_adapts(model_type: str, targets: list[str]) -> None:
    wrapped, config = _peft_model(model_type, targets)
    expected = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert lora_params(spec_from_config(config), _setup(targets)) == expected


def test_gate_proj_without_up_proj_is_refused_as_peft_refuses_it() -> None:
    targets = ["q_proj", "gate_proj"]
    with pytest.raises(ValueError, match="without also targeting up_proj"):
        _peft_model("qwen3_moe", targets)
    spec = spec_from_config(_peft_model("qwen3_moe", ["q_proj"])[1])
    with pytest.raises(EstimatorInputError) as err:
        lora_params(spec, _setup(targets))
    assert err.value.field == "setup.lora_targets" and "up_proj" in str(err.value)


@pytest.mark.parametrize("targets", [["all-linear"], SEVEN, ["q_proj", "down_proj"]])
def test_dropout_on_adapted_expert_banks_is_refused_as_peft_refuses_it(
    targets: list[str],
) -> None:
    with pytest.raises(ValueError, match="lora_dropout"):
        _peft_model("glm4_moe", targets, dropout=0.05)
    spec = spec_from_config(_peft_model("glm4_moe", ["q_proj"])[1])
    with pytest.raises(EstimatorInputError) as err:
        lora_params(spec, _setup(targets, dropout=0.05))
    assert err.value.field == "setup.lora_dropout"


def test_attention_only_targets_keep_their_dropout() -> None:
    """No bank adapted, no ParamWrapper: peft runs dropout on the attention Linears."""
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    wrapped, config = _peft_model("glm4_moe", targets, dropout=0.05)
    expected = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert lora_params(spec_from_config(config), _setup(targets, dropout=0.05)) == expected


def test_cli_names_the_dropout_for_qwen3_moe_with_all_linear(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["estimate", "--model", "qwen3-30b-a3b", "--method", "lora", "--gpu", "h100-80gb"]
    assert main([*args, "--lora-dropout", "0.05"]) == 2
    assert "lora_dropout" in capsys.readouterr().err
    assert main([*args, "--lora-dropout", "0"]) == 0


def test_qwen3_30b_a3b_with_the_seven_usual_names_equals_peft() -> None:
    """The README's figure: 994,836,480 adapter parameters at r=16 (13,369,344 before, the
    attention's alone), equal to peft's on the model built from the preset's config.json."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from estimator.presets import preset_config

    raw = preset_config("qwen3-30b-a3b")
    config = transformers.AutoConfig.for_model(**raw)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config)
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules=SEVEN))
    expected = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    setup = TrainingSetup(method="lora", lora_rank=16, lora_targets=SEVEN)
    assert lora_params(spec_from_config(raw), setup) == expected == 994_836_480
