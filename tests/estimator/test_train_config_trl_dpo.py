"""A `trl dpo --config` YAML (TRL 1.16's DPOConfig, estimator/train_config/trl_dpo.py) is priced
as DPO: `objective`, the fused LM head's loss whatever `loss_type`, `max_length` (default 1024),
LoRA dropout off (`disable_dropout`), and what is not modelled reported by key. Before, the keys
DPOConfig alone has went unread and the file was priced as SFT of one sequence a row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from estimator.train_config import read_train_config_text
from trainfit.cli import main

DPO = (
    "model_name_or_path: meta-llama/Llama-3.1-8B\nuse_peft: true\nlora_target_modules: all-linear\n"
    "beta: 0.1\nper_device_train_batch_size: 2\n"
)


def test_a_dpo_config_is_priced_as_dpo() -> None:
    m = read_train_config_text(DPO)
    assert m.setup["objective"] == "dpo"
    assert m.setup["loss"] == "chunked"  # TRL's fused LM head (dpo_trainer.py:959, 1299)
    assert m.seq_lens == [1024] and "DPOConfig default" in m.origin["seq_lens"]
    assert m.setup["lora_dropout"] == 0.0 and m.origin["lora_dropout"].startswith("disable")
    assert m.setup["checkpointing"] == "gpu" and m.setup["autocast"] is True
    assert not m.warnings and not m.ignored


@pytest.mark.parametrize(
    "extra, field, value",
    [
        ("precompute_ref_log_probs: true\n", "objective", "dpo-precomputed"),
        ("disable_dropout: false\n", "lora_dropout", 0.05),  # TRL's LoRA default stands
        ("use_liger_kernel: true\n", "loss", "chunked"),  # Liger's layer kernels only
        ("use_liger_kernel: true\n", "liger_kernels", True),
        ("max_length: 4096\n", "seq_lens", [4096]),
    ],
)
def test_dpo_keys(extra: str, field: str, value: Any) -> None:
    m = read_train_config_text(DPO + extra)
    assert (m.seq_lens if field == "seq_lens" else m.setup[field]) == value


@pytest.mark.parametrize(
    "text",
    [
        "model_name_or_path: x/y\nloss_type: sigmoid\n",
        "model_name_or_path: x/y\nloss_type: [sigmoid, sft]\nloss_weights: [0.8, 0.2]\n",
    ],
)
def test_a_dpo_loss_type_alone_says_dpo(text: str) -> None:
    assert read_train_config_text(text).setup["objective"] == "dpo"


def test_an_sft_config_stays_sft() -> None:
    m = read_train_config_text("model_name_or_path: x/y\nloss_type: nll\nmax_length: 2048\n")
    assert "objective" not in m.setup and m.setup["loss"] == "chunked"


@pytest.mark.parametrize("key", ["padding_free", "eval_strategy"])
def test_what_dpo_does_not_model_is_reported(key: str) -> None:
    value = "steps" if key == "eval_strategy" else "true"
    m = read_train_config_text(DPO + f"{key}: {value}\n")
    assert key in {i.key for i in m.ignored}
    assert "eval_batch" not in m.setup


def test_the_cli_prices_the_file_as_the_stated_dpo_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dpo.yaml"
    path.write_text(DPO)

    def peak(*args: str) -> int:
        capsys.readouterr()
        assert main(["estimate", "--gpu", "h100-80gb", "--format", "json", *args]) == 0
        doc = json.loads(capsys.readouterr().out)
        return int(doc["rows"][0]["peak_bytes"])

    stated = ("--model", "llama-3.1-8b", "--method", "lora", "--lora-alpha", "32")
    stated += ("--seq", "1024", "--batch", "2", "--objective", "dpo", "--lora-dropout", "0")
    assert peak("--train-config", str(path)) == peak(*stated)
