"""LLaMA-Factory's v1 YAML (`estimator/train_config/llamafactory_v1.py`). The configs below are
written in the shape of LLaMA-Factory ff6d4d12's examples/v1/*.yaml. Before this reader such a
file fell through to the HF Trainer reader, which did not read `peft_config`: a LoRA run was
estimated as full fine-tuning, with a warning only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from estimator.errors import EstimatorInputError
from estimator.train_config import detect_format, read_file, read_train_config_text
from estimator.train_config.llamafactory_v1 import SHIFTED_LOSS
from trainfit.cli import main

LORA_FSDP2 = """\
model: Qwen/Qwen3-4B
model_class: llm
peft_config:
  name: lora
  r: 16
  lora_alpha: 32
  lora_dropout: 0.05
  target_modules: all
kernel_config:
  name: auto
dist_config:
  name: fsdp2
  dcp_path: null
train_dataset: data/v1_sft_demo.yaml
output_dir: ./outputs/test_lora
micro_batch_size: 1
cutoff_len: 2048
learning_rate: 1.0e-4
max_steps: 10
"""


def _read(text: str, fmt: str | None = None) -> dict[str, Any]:
    mapping = read_train_config_text(text, fmt)
    assert mapping.format == "llamafactory-v1"
    doc: dict[str, Any] = mapping.as_dict()
    return doc


def test_a_v1_lora_config_is_read_as_lora_not_as_a_trainer_config() -> None:
    import yaml

    assert detect_format(yaml.safe_load(LORA_FSDP2)) == "llamafactory"
    doc = _read(LORA_FSDP2)
    setup = doc["setup"]
    assert doc["model"] == {"preset": "qwen3-4b"}  # the repo a preset was taken from
    assert doc["seq_lens"] == [2048]
    assert setup["method"] == "lora"
    assert (setup["lora_rank"], setup["lora_alpha"], setup["lora_dropout"]) == (16, 32, 0.05)
    assert setup["lora_targets"] == ["all-linear"]
    assert (setup["parallel"], setup["sharding"]) == ("fsdp", "fsdp")
    # FSDP2's bf16 MixedPrecisionPolicy computes the fp32 adapters in bf16
    assert setup["autocast"] is True
    assert setup["checkpointing"] == "gpu"
    assert (setup["optimizer"], setup["optimizer_impl"]) == ("adamw", "foreach")
    assert setup["loss"] == "full"
    assert {"key": "loss", "reason": SHIFTED_LOSS} in doc["ignored"]
    assert not [w for w in doc["warnings"] if "not read" in w]


def test_left_out_fields_take_v1_s_defaults() -> None:
    doc = _read("model: acme/model-x\npeft_config:\n  name: lora\n")
    setup = doc["setup"]
    assert (setup["lora_rank"], setup["lora_alpha"], setup["lora_dropout"]) == (8, 16, 0.05)
    assert setup["lora_targets"] == ["all-linear"]
    assert setup["batch"] == 1 and doc["seq_lens"] == [2048]
    assert setup["autocast"] is False  # no FSDP2, no autocast: adapter inputs cast to fp32
    assert setup["checkpointing"] == "gpu"
    assert "default" in doc["origin"]["lora_dropout"]


def test_no_model_is_v1_s_default_model() -> None:
    # detected only with `model:`; named as LLaMA-Factory, a file without one is v1's default
    doc = _read("micro_batch_size: 2\ncutoff_len: 4096\n", "llamafactory")
    assert doc["model"] == {"hub": "Qwen/Qwen3-4B-Instruct-2507"}
    assert doc["setup"]["batch"] == 2 and doc["seq_lens"] == [4096]
    assert doc["setup"]["method"] == "full"


@pytest.mark.parametrize(
    ("extra", "precision"),
    [
        ("", "fp32"),  # model_engine.py:207 casts to fp32; no autocast, no FSDP2 policy
        ("dist_config:\n  name: fsdp2\n", "mixed"),  # bf16 compute copies of fp32 shards
        ("bf16: false\ndist_config:\n  name: fsdp2\n", "fp32"),
    ],
)
def test_full_tuning_precision_follows_the_loop(extra: str, precision: str) -> None:
    doc = _read("model: acme/model-x\nmicro_batch_size: 1\n" + extra)
    assert doc["setup"]["method"] == "full"
    assert doc["setup"]["precision"] == precision
    assert doc["setup"]["autocast"] is False


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ("  name: bnb\n", {"method": "qlora", "double_quant": True}),  # bnb: 4 bits by default
        (
            "  name: bnb\n  quantization_bit: 4\n  double_quantization: false\n",
            {"double_quant": False},
        ),
        ("  name: auto\n  quantization_bit: 8\n", {"method": "lora", "base": "int8"}),
        ("  name: auto\n", {"method": "lora"}),  # auto without bits quantizes nothing
    ],
)
def test_quantization(quant: str, expected: dict[str, Any]) -> None:
    doc = _read("model: x/y\npeft_config:\n  name: lora\nquant_config:\n" + quant)
    for key, value in expected.items():
        assert doc["setup"][key] == value, key
    assert doc["setup"].get("kbit_prepare", False) is False  # v1 never calls peft's prepare


def test_what_is_not_modelled_is_reported() -> None:
    doc = _read(
        "model: x/y\npeft_config:\n  name: freeze\nquant_config:\n  name: bnb\n"
        "dist_config:\n  name: fsdpturbo\ncp_size: 2\noptim_config:\n  name: muon\n"
    )
    keys = {i["key"] for i in doc["ignored"]}
    assert {"peft_config.name", "quant_config.quantization_bit", "dist_config.name"} <= keys
    assert {"cp_size", "optim_config.name"} <= keys


def test_a_deepspeed_config_file_is_followed(tmp_path: Path) -> None:
    (tmp_path / "ds_z3.json").write_text(
        json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}})
    )
    path = tmp_path / "train.yaml"
    path.write_text("model: x/y\ndist_config:\n  name: deepspeed\n  config_file: ds_z3.json\n")
    mapping = read_file(path)
    assert mapping.setup["parallel"] == "zero3"
    assert mapping.setup["stack"] == "deepspeed"
    assert mapping.sources == [str(path), str(tmp_path / "ds_z3.json")]
    text = read_train_config_text("model: x/y\ndist_config:\n  name: deepspeed\n")
    assert "dist_config.config_file" in {i.key for i in text.ignored}


def test_global_batch_size() -> None:
    assert _read("model: x/y\nglobal_batch_size: 1\n")["setup"]["grad_accum"] == 1
    doc = _read("model: x/y\nglobal_batch_size: 64\nmicro_batch_size: 2\n")
    assert "grad_accum" not in doc["setup"]
    assert any(w.startswith("global_batch_size: 64") for w in doc["warnings"])


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("model: x/y\ncutoff_len: 4k\n", "train_config.cutoff_len"),
        ("model: x/y\nmicro_batch_size: 0\n", "train_config.micro_batch_size"),
        ("model: x/y\npeft_config:\n  name: lora\n  r: 0\n", "train_config.peft_config.r"),
    ],
)
def test_bad_values_name_the_key(text: str, field: str) -> None:
    with pytest.raises(EstimatorInputError) as err:
        read_train_config_text(text)
    assert err.value.field == field


def test_a_v0_config_is_still_read_by_the_v0_reader() -> None:
    mapping = read_train_config_text(
        "model_name_or_path: x/y\nstage: sft\nfinetuning_type: lora\ncutoff_len: 1024\n"
    )
    assert mapping.format == "llamafactory"


def test_the_estimate_is_lora_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "train_lora_sft.yaml"
    path.write_text(LORA_FSDP2)
    capsys.readouterr()
    args = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--format", "json"]
    assert main([*args, "--train-config", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["setup"]["method"] == "lora"
    assert doc["train_config"]["format"] == "llamafactory-v1"
    assert main([*args, "--method", "full"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert doc["rows"][0]["peak_bytes"] < full["rows"][0]["peak_bytes"]
