"""A checkpoint bitsandbytes stored quantized (config.json `quantization_config`, as Unsloth's
and others' `*-bnb-4bit` repos ship): read as transformers writes the config, trained only as
transformers can train it (adapters on the base as stored), its own double quantization
counted; anything else is bad input naming the field (exit 2 / 422), never an estimate of a run
that cannot happen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup
from trainfit.cli import main

transformers = pytest.importorskip("transformers")

PROFILE = load_profile("default")


def _stored(**bnb: Any) -> dict[str, Any]:
    """Llama-3.1-8B's config.json with the `quantization_config` transformers writes for a
    `BitsAndBytesConfig(**bnb)` (its own `to_dict()`)."""
    quant = transformers.BitsAndBytesConfig(**bnb).to_dict()
    config: dict[str, Any] = json.loads(json.dumps(preset_config("llama-3.1-8b"), default=str))
    config["quantization_config"] = json.loads(json.dumps(quant, default=str))
    return config


def test_the_stored_base_is_read_as_transformers_writes_it() -> None:
    four = spec_from_config(_stored(load_in_4bit=True, bnb_4bit_quant_type="nf4"))
    assert (four.stored_quantization, four.stored_double_quant) == ("nf4", False)
    double = spec_from_config(_stored(load_in_4bit=True, bnb_4bit_use_double_quant=True))
    assert (double.stored_quantization, double.stored_double_quant) == ("nf4", True)
    assert "double quant" in double.notes[-1]
    eight = spec_from_config(_stored(load_in_8bit=True))
    assert eight.stored_quantization == "int8"
    plain = spec_from_config(preset_config("llama-3.1-8b"))
    assert plain.stored_quantization is None
    fp8 = dict(preset_config("llama-3.1-8b"), quantization_config={"quant_method": "fp8"})
    assert spec_from_config(fp8).stored_quantization is None  # not bitsandbytes: not read here


def test_a_malformed_quantization_config_names_its_field() -> None:
    config = _stored(load_in_4bit=True)
    config["quantization_config"]["load_in_4bit"] = "yes"
    with pytest.raises(EstimatorInputError) as err:
        spec_from_config(config)
    assert err.value.field == "config.quantization_config.load_in_4bit"


def test_the_checkpoint_s_double_quantization_is_what_is_counted() -> None:
    stored = spec_from_config(_stored(load_in_4bit=True, bnb_4bit_use_double_quant=True))
    plain = spec_from_config(preset_config("llama-3.1-8b"))
    asked = TrainingSetup(method="qlora", double_quant=False)
    as_stored = memory_breakdown(stored, asked, 4096.0, 1, PROFILE)
    single = memory_breakdown(plain, asked, 4096.0, 1, PROFILE)
    double = memory_breakdown(
        plain, TrainingSetup(method="qlora", double_quant=True), 4096.0, 1, PROFILE
    )
    assert as_stored.components["weights"] == double.components["weights"]
    assert as_stored.components["weights"] < single.components["weights"]


@pytest.mark.parametrize(
    ("bnb", "setup", "field"),
    [
        ({"load_in_4bit": True}, {"method": "full"}, "setup.method"),
        ({"load_in_4bit": True}, {"method": "lora"}, "setup.base"),
        ({"load_in_8bit": True}, {"method": "qlora"}, "setup.base"),
        ({"load_in_8bit": True}, {"method": "full"}, "setup.method"),
    ],
)
def test_a_setup_the_stored_checkpoint_cannot_train_is_refused(
    bnb: dict[str, Any], setup: dict[str, Any], field: str
) -> None:
    spec = spec_from_config(_stored(**bnb))
    with pytest.raises(EstimatorInputError) as err:
        memory_breakdown(spec, TrainingSetup(**setup), 4096.0, 1, PROFILE)
    assert err.value.field == field
    ok = {"method": "qlora"} if "load_in_4bit" in bnb else {"method": "lora", "base": "int8"}
    assert memory_breakdown(spec, TrainingSetup(**ok), 4096.0, 1, PROFILE).peak > 0


@pytest.mark.parametrize("command", ["estimate", "max-seq", "recommend"])
def test_the_command_line_says_so_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_stored(load_in_4bit=True)))
    args = [command, "--model", str(path), "--seq", "4096"]
    args += ["--gpu", "h100-80gb"] if command != "recommend" else []
    capsys.readouterr()
    assert main(args) == 2  # the solvers would otherwise skip it as a setting that fits nowhere
    err = capsys.readouterr().err
    assert "setup.method:" in err and "use method qlora" in err
    assert main([*args, "--method", "qlora"]) == 0
