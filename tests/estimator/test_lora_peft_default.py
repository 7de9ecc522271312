"""`peft-default` targets: what peft adapts when `target_modules` is None (TRL's ModelConfig with
no `lora_target_modules`). Before, a TRL config without targets was priced on every Linear
(trainfit's all-linear) with a warning, where peft adapts q_proj and v_proj of a Llama."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.lora import PEFT_DEFAULT, PEFT_DEFAULT_TARGETS, REGEX, lora_params
from estimator.model_source import resolve_model
from estimator.request import ModelInput
from estimator.setup import TrainingSetup
from estimator.train_config import read_train_config_text
from tests.estimator.test_architectures import TINY
from tests.estimator.test_lora import peft_model


def test_the_table_is_peft_s_own() -> None:
    constants = pytest.importorskip("peft.utils.constants")
    mapping = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    for model_type, targets in PEFT_DEFAULT_TARGETS.items():
        theirs = mapping[model_type]
        expected = (f"{REGEX}{theirs}",) if isinstance(theirs, str) else tuple(theirs)
        assert targets == expected, model_type


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "mistral", "qwen2", "gemma2"])
def test_trainable_count_equals_peft_s_with_no_targets(model_type: str) -> None:
    import transformers

    config = transformers.CONFIG_MAPPING[model_type](**TINY[model_type]).to_dict()
    spec = spec_from_config(config)
    assert spec.config_model_type == model_type
    setup = TrainingSetup(method="lora", lora_rank=4, lora_targets=[PEFT_DEFAULT])
    wrapped = peft_model(model_type, 4, target_modules=None)
    theirs = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert lora_params(spec, setup) == theirs
    everything = TrainingSetup(method="lora", lora_rank=4, lora_targets=["all-linear"])
    assert lora_params(spec, setup) < lora_params(spec, everything)


def test_a_model_type_peft_has_no_default_for_names_the_field() -> None:
    """gemma-3-27b's config is the composite `gemma3`: peft looks that type up, not
    gemma3_text, finds nothing and raises."""
    spec = resolve_model(ModelInput(preset="gemma-3-27b"))
    assert spec.config_model_type == "gemma3"
    setup = TrainingSetup(method="lora", lora_rank=8, lora_targets=[PEFT_DEFAULT])
    with pytest.raises(EstimatorInputError) as info:
        lora_params(spec, setup)
    assert info.value.field == "setup.lora_targets"
    assert "gemma3" in str(info.value)


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_moe_models_peft_remaps_have_no_default_as_in_peft(model_type: str) -> None:
    """With transformers v5 peft remaps an MoE model's targets before looking up its default,
    turning None into an empty set: get_peft_model raises, and so does the estimate."""
    import transformers

    peft_error = pytest.importorskip("peft.utils.error")
    with pytest.raises(peft_error.NoMatchingPeftModuleError):
        peft_model(model_type, 4, target_modules=None)
    spec = spec_from_config(transformers.CONFIG_MAPPING[model_type](**TINY[model_type]).to_dict())
    setup = TrainingSetup(method="lora", lora_rank=4, lora_targets=[PEFT_DEFAULT])
    with pytest.raises(EstimatorInputError) as info:
        lora_params(spec, setup)
    assert info.value.field == "setup.lora_targets"


def test_it_stands_alone() -> None:
    with pytest.raises(ValueError, match="stands alone"):
        TrainingSetup(method="lora", lora_targets=[PEFT_DEFAULT, "o_proj"])


def test_a_trl_config_without_targets_asks_for_peft_s() -> None:
    text = "model_name_or_path: meta-llama/Llama-3.1-8B\nuse_peft: true\nlora_r: 8\n"
    mapping = read_train_config_text(text)
    assert mapping.setup["lora_targets"] == [PEFT_DEFAULT]
    assert not [w for w in mapping.warnings if "lora_target_modules" in w]
    named = read_train_config_text(text + "lora_target_modules: [q_proj, k_proj]\n")
    assert named.setup["lora_targets"] == ["q_proj", "k_proj"]


def test_the_cli_prices_peft_s_targets(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trainfit.cli import main

    base = ["estimate", "--model", "llama-3.1-8b", "--method", "lora", "--format", "json"]
    counts = []
    for targets in (PEFT_DEFAULT, "q_proj,v_proj"):
        capsys.readouterr()
        assert main([*base, "--lora-targets", targets, "--gpu", "h100-80gb"]) == 0
        counts.append(json.loads(capsys.readouterr().out)["model"]["params_trainable"])
    # q_proj 4096 -> 4096 and v_proj 4096 -> 1024 at the default rank 16, 32 layers
    assert counts[0] == counts[1] == 32 * 16 * ((4096 + 4096) + (4096 + 1024))


def test_the_document_names_the_modules_it_resolved(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trainfit.cli import main

    base = ["estimate", "--method", "lora", "--gpu", "h100-80gb"]
    assert main([*base, "--model", "llama-3.1-8b", "--lora-targets", PEFT_DEFAULT]) == 0
    text = capsys.readouterr().out
    assert (
        "note: lora_targets peft-default: q_proj, v_proj (peft's targets for model_type 'llama')"
        in text
    )
    assert (
        main(
            [
                *base,
                "--model",
                "llama-3.1-8b",
                "--lora-targets",
                "q_proj,v_proj",
                "--format",
                "json",
            ]
        )
        == 0
    )
    named = json.loads(capsys.readouterr().out)["model"]["notes"]
    assert not any("peft-default" in n for n in named)  # only the word is explained
