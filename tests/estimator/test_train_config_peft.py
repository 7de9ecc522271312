"""A PEFT adapter_config.json as a training config (`estimator/train_config/peft.py`): read as
peft itself writes and reads it (its configs are made here by peft's own `LoraConfig`), on the
command line (`--adapter-config`: it fills what a `--train-config` does not state, options given
win) and in the service (`train_config` with format `peft`, or detected)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.lora import lora_params
from estimator.setup import TrainingSetup
from estimator.train_config import detect_format, read_train_config_text, read_train_configs
from estimator.train_config.peft import NOT_MODELLED
from tests.estimator.test_architectures import TINY
from trainfit.cli import main

peft = pytest.importorskip("peft")

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _saved(**kwargs: Any) -> dict[str, Any]:
    """What `save_pretrained` writes for a LoraConfig (its `to_dict()`, sets as lists)."""
    config = peft.LoraConfig(**kwargs).to_dict()
    for key, value in config.items():
        if isinstance(value, set):
            config[key] = sorted(value)
    parsed: dict[str, Any] = json.loads(json.dumps(config, default=str))
    return parsed


def _doc(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["estimate", "--gpu", "h100-80gb", "--format", "json", *args]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_peft_s_own_configs_are_detected_and_read() -> None:
    saved = _saved(
        r=32,
        lora_alpha=64,
        lora_dropout=0.05,
        target_modules=ALL,
        modules_to_save=["lm_head"],
        task_type="CAUSAL_LM",
    )
    assert detect_format(saved) == "peft"
    mapping = read_train_config_text(json.dumps(saved))
    assert mapping.format == "peft"
    setup = mapping.setup
    assert setup["method"] == "lora"
    assert (setup["lora_rank"], setup["lora_alpha"], setup["lora_dropout"]) == (32, 64, 0.05)
    assert sorted(setup["lora_targets"]) == sorted(ALL)
    assert setup["train_embeddings"] is True
    assert mapping.ignored == [] and mapping.warnings == []


def test_fields_left_out_take_peft_s_defaults() -> None:
    defaults = peft.LoraConfig()
    mapping = read_train_config_text(json.dumps({"peft_type": "LORA", "target_modules": ALL}))
    setup = mapping.setup
    assert setup["lora_rank"] == defaults.r
    assert setup["lora_alpha"] == defaults.lora_alpha
    assert setup["lora_dropout"] == defaults.lora_dropout
    assert "peft's default" in mapping.origin["lora_rank"]


def test_a_string_target_is_a_regex_as_peft_reads_it() -> None:
    text = json.dumps(_saved(target_modules=r".*\.(q|v)_proj"))
    assert read_train_config_text(text).setup["lora_targets"] == [r"re:.*\.(q|v)_proj"]
    text = json.dumps(_saved(target_modules="all-linear"))
    assert read_train_config_text(text).setup["lora_targets"] == ["all-linear"]


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"exclude_modules": ["model.layers.0.mlp.down_proj"]}, "exclude_modules"),
        ({"layers_to_transform": [0, 1]}, "layers_to_transform"),
        ({"rank_pattern": {"q_proj": 64}}, "rank_pattern"),
        ({"use_dora": True}, "use_dora"),
        ({"bias": "all"}, "bias"),
    ],
)
def test_what_is_not_modelled_is_reported_not_guessed(kwargs: dict[str, Any], key: str) -> None:
    mapping = read_train_config_text(json.dumps(_saved(target_modules=ALL, **kwargs)))
    assert [i.key for i in mapping.ignored] == [key]
    assert mapping.ignored[0].reason == NOT_MODELLED.get(key, mapping.ignored[0].reason)


def test_another_peft_method_is_refused_naming_the_field() -> None:
    with pytest.raises(EstimatorInputError) as err:
        read_train_config_text(json.dumps({"peft_type": "IA3", "target_modules": ["k_proj"]}))
    assert err.value.field == "train_config.peft_type"


def test_the_adapter_config_s_dropout_counts_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The case that was under: the file's lora_dropout (peft examples: 0.05) keeps a mask per
    adapted Linear; `--adapter-config` read only r and the targets before."""
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps(_saved(r=16, lora_dropout=0.05, target_modules=ALL)))
    common = ("--model", "llama-3.1-8b", "--seq", "8192", "--checkpointing", "none")
    read = _doc(capsys, *common, "--adapter-config", str(path))
    stated = _doc(
        capsys,
        *common,
        "--method",
        "lora",
        "--lora-targets",
        ",".join(ALL),
        "--lora-dropout",
        "0.05",
    )
    undropped = _doc(capsys, *common, "--method", "lora", "--lora-targets", ",".join(ALL))
    peak = [d["rows"][0]["peak_bytes"] for d in (read, stated, undropped)]
    assert peak[0] == peak[1] > peak[2]
    assert read["setup"]["lora_dropout"] == 0.05
    assert read["train_config"]["format"] == "peft"


def test_options_given_win_and_a_training_config_wins_over_the_adapter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adapter = tmp_path / "adapter_config.json"
    adapter.write_text(
        json.dumps(
            _saved(
                r=64,
                lora_dropout=0.1,
                target_modules=ALL,
                base_model_name_or_path="meta-llama/Llama-3.1-8B",
            )
        )
    )
    given = _doc(capsys, "--adapter-config", str(adapter), "--lora-rank", "8")
    assert given["setup"]["lora_rank"] == 8  # the option given
    assert given["setup"]["lora_dropout"] == 0.1  # the file
    assert given["model"]["name"] == "llama-3.1-8b"  # its base model, a preset's repo
    axolotl = tmp_path / "axolotl.yml"
    axolotl.write_text(
        "base_model: meta-llama/Llama-3.1-8B\nadapter: qlora\nload_in_4bit: true\n"
        "lora_r: 16\nlora_target_linear: true\nsequence_len: 2048\n"
    )
    both = _doc(capsys, "--train-config", str(axolotl), "--adapter-config", str(adapter))
    assert both["setup"]["method"] == "qlora"  # the training config's
    assert both["setup"]["lora_rank"] == 16
    assert both["setup"]["lora_dropout"] == 0.0  # axolotl's default, stated by it
    mapping = read_train_configs([axolotl], adapter)
    assert mapping.sources == [str(axolotl), str(adapter)]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{not json", "train_config"),
        ("[1, 2]", "train_config"),
        ('{"peft_type": "LOHA", "r": 8}', "train_config.peft_type"),
    ],
)
def test_a_bad_adapter_config_is_exit_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, field: str
) -> None:
    path = tmp_path / "adapter_config.json"
    path.write_text(text)
    args = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--adapter-config", str(path)]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{field}:" in err and "Traceback" not in err


def _peft_trainable(config: Any) -> int:
    """Trainable parameters peft itself gives a tiny llama for this LoraConfig (meta device)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model_config = transformers.CONFIG_MAPPING["llama"](**TINY["llama"])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(model_config)
        wrapped = peft.get_peft_model(model, config)
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


def _trainfit_trainable(saved: dict[str, Any]) -> tuple[int, list[str]]:
    import transformers

    spec = spec_from_config(transformers.CONFIG_MAPPING["llama"](**TINY["llama"]).to_dict())
    mapping = read_train_config_text(json.dumps(saved))
    setup = TrainingSetup(**{k: v for k, v in mapping.setup.items() if k != "lora_alpha"})
    return lora_params(spec, setup), [i.key for i in mapping.ignored]


def test_excluded_kinds_are_left_out_as_peft_leaves_them() -> None:
    kwargs: dict[str, Any] = {"r": 4, "target_modules": ALL, "exclude_modules": ["down_proj"]}
    ours, ignored = _trainfit_trainable(_saved(**kwargs))
    assert ours == _peft_trainable(peft.LoraConfig(**kwargs))
    assert "exclude_modules" not in ignored
    with pytest.raises(EstimatorInputError) as err:
        read_train_config_text(
            json.dumps(_saved(target_modules=["q_proj"], exclude_modules=["q_proj"]))
        )
    assert err.value.field == "train_config.exclude_modules"


def test_an_exclusion_of_some_layers_is_reported_and_overestimated() -> None:
    kwargs: dict[str, Any] = {
        "r": 4,
        "target_modules": ALL,
        "exclude_modules": ["model.layers.0.mlp.down_proj"],
    }
    ours, ignored = _trainfit_trainable(_saved(**kwargs))
    assert "exclude_modules" in ignored
    assert ours > _peft_trainable(peft.LoraConfig(**kwargs))  # counted as adapted: over
