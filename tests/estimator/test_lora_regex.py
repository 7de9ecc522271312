"""peft's regex `target_modules` (a string: `re.fullmatch` against whole module names; the
`re:` targets of estimator/lora.py) and the module names trainfit gives each Linear kind,
checked against the models transformers builds on the meta device."""

from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path

import pytest

from estimator.architectures import SUPPORTED_MODEL_TYPES, spec_from_config
from estimator.errors import EstimatorInputError
from estimator.lora import lora_params, lora_targets, module_names
from estimator.presets import preset_config
from estimator.setup import TrainingSetup
from estimator.train_config.load import read_train_config_text
from trainfit.cli import main

LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
GEMMA3 = spec_from_config(preset_config("gemma-3-27b"))  # Gemma3ForConditionalGeneration
SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# axolotl's own examples write these (examples/llama-3-vision/lora-11b.yaml,
# examples/lfm2/..., examples/ebft/qwen35-4b-ebft-structured.yaml)
LANGUAGE_MODEL = (
    r"model.language_model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj"
)
LAYERS = r"model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj"
SOME_LAYERS = (
    r".*\.layers\.(3|7|11|15|19|23|27|31)\.self_attn\.(q|k|v|o)_proj|.*\.mlp\.(gate|up|down)_proj"
)


def _lora(targets: list[str]) -> TrainingSetup:
    return TrainingSetup.model_validate({"method": "lora", "lora_targets": targets})


_MODEL_TYPES_WITHOUT_A_MODEL = (
    "qwen2_5_vl_text",
    "qwen2_vl_text",
    "qwen3_vl_text",
)  # only nested in a composite
# Glm4MoeConfig's defaults (hidden 4096, 96 heads, no head_dim) leave transformers to floor
# 4096 / 96; trainfit refuses such a config (test_architectures), the published ones say 128
# MinistralConfig's default head_dim is None, which its attention cannot build with
_DEFAULT_OVERRIDES = {"glm4_moe": {"head_dim": 128}, "ministral": {"head_dim": 128}}


@pytest.mark.parametrize(
    "model_type", [t for t in SUPPORTED_MODEL_TYPES if t not in _MODEL_TYPES_WITHOUT_A_MODEL]
)
def test_module_names_are_the_decoder_layers_linears_transformers_builds(model_type: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    transformers.logging.set_verbosity_error()
    config = transformers.AutoConfig.for_model(model_type, **_DEFAULT_OVERRIDES.get(model_type, {}))
    spec = spec_from_config(config.to_dict())
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        try:
            model = transformers.AutoModelForImageTextToText.from_config(config)
        except ValueError:
            model = transformers.AutoModelForCausalLM.from_config(config)
    built = {
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear | Conv1D)
        and re.search(r"\.\d+\.", name)  # in a numbered layer: not lm_head
        and not any(part in name for part in ("vision", "visual", "multi_modal"))
    }
    ours = {
        name
        for lin in spec.linears
        if lin.group != "head" and lin.experts == 1 and lin.nn_linear
        for name in module_names(spec, lin)
    }
    assert ours == built


def test_a_regex_over_every_layer_adapts_what_the_names_do() -> None:
    by_regex = _lora([f"re:{LAYERS}"])
    by_names = _lora(SEVEN)
    assert lora_targets(LLAMA8B, by_regex) == lora_targets(LLAMA8B, by_names)
    assert lora_params(LLAMA8B, by_regex) == lora_params(LLAMA8B, by_names)
    only_attention = _lora([r"re:model\.layers\.\d+\.self_attn\.(q|v)_proj"])
    assert [lin.name for lin in lora_targets(LLAMA8B, only_attention)] == ["q_proj", "v_proj"]


def test_a_multimodal_models_language_model_is_matched_by_its_own_path() -> None:
    setup = _lora([f"re:{LANGUAGE_MODEL}"])
    assert {lin.name for lin in lora_targets(GEMMA3, setup)} == set(SEVEN)
    with pytest.raises(EstimatorInputError, match="model.layers.0.self_attn.q_proj"):
        lora_targets(LLAMA8B, setup)  # no language_model in a LlamaForCausalLM: peft fails too


def test_a_regex_that_adapts_some_layers_only_is_refused_naming_the_field() -> None:
    with pytest.raises(EstimatorInputError, match="in 8 of its 32 layers") as err:
        lora_targets(LLAMA8B, _lora([f"re:{SOME_LAYERS}"]))
    assert err.value.field == "setup.lora_targets"


def test_a_pattern_that_is_not_a_regex_is_refused_when_the_setup_is_read() -> None:
    with pytest.raises(ValueError, match="not a regular expression"):
        _lora(["re:model.layers.(q_proj"])
    with pytest.raises(ValueError, match="1 to 1000 characters"):
        _lora(["re:" + "a" * 1001])
    args = ["estimate", "--model", "llama-3.1-8b", "--method", "lora", "--gpu", "h200"]
    assert main([*args, "--lora-targets", "re:(q_proj"]) == 2
    assert main([*args, "--lora-targets", f"re:{LAYERS}"]) == 0


def test_a_hostile_pattern_is_stopped_not_left_to_run() -> None:
    started = time.monotonic()
    with pytest.raises(EstimatorInputError, match="too long"):
        lora_targets(LLAMA8B, _lora(["re:(.*){1,32000}[bc]"]))
    assert time.monotonic() - started < 10  # the budget is 0.5 s; generous for a busy machine


def test_axolotls_string_target_is_peft_regex_and_a_list_stays_names() -> None:
    text = "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_r: 16\n"
    regex = read_train_config_text(text + f"lora_target_modules: '{LAYERS}'\n")
    assert regex.setup["lora_targets"] == [f"re:{LAYERS}"]
    names = read_train_config_text(text + "lora_target_modules: [q_proj, v_proj]\n")
    assert names.setup["lora_targets"] == ["q_proj", "v_proj"]
    joined = read_train_config_text(text + "lora_target_modules: q_proj,v_proj\n")
    assert joined.setup["lora_targets"] == ["q_proj", "v_proj"]


def test_an_adapter_configs_string_target_modules_is_read_as_peft_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def echoed(target_modules: object) -> list[str]:
        path = tmp_path / "adapter_config.json"
        path.write_text(json.dumps({"r": 8, "target_modules": target_modules}))
        args = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--format", "json"]
        capsys.readouterr()
        assert main([*args, "--adapter-config", str(path)]) == 0
        setup = json.loads(capsys.readouterr().out)["setup"]
        assert setup["method"] == "lora" and setup["lora_rank"] == 8
        return list(setup["lora_targets"])

    assert echoed(LAYERS) == [f"re:{LAYERS}"]
    assert echoed(["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    assert echoed("all-linear") == ["all-linear"]


def test_typed_targets_split_on_commas_but_a_pattern_keeps_them() -> None:
    from estimator.lora import split_targets

    assert split_targets("q_proj, v_proj\nk_proj") == ["q_proj", "v_proj", "k_proj"]
    assert split_targets(r" re:model\.layers\.\d{1,2}\.self_attn\.q_proj ") == [
        r"re:model\.layers\.\d{1,2}\.self_attn\.q_proj"
    ]
    args = ["estimate", "--model", "llama-3.1-8b", "--method", "lora", "--gpu", "h200"]
    assert main([*args, "--lora-targets", r"re:model\.layers\.\d{1,2}\.self_attn\.q_proj"]) == 0
