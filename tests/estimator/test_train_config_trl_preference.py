"""TRL 1.0-1.9's KTOConfig, CPOConfig and ORPOConfig files (estimator/train_config/
trl_preference.py): each dump carries `beta` and `disable_dropout`, which DPOConfig has too, so
before they read as DPO (TRL 1.16's fused head and a reference forward each step); a key only
that config has now names its trainer, priced with the full logits."""

from __future__ import annotations

from typing import Any

import pytest

from estimator.train_config import read_train_config_text
from estimator.train_config.load import detect_format

BASE = "model_name_or_path: x/y\nper_device_train_batch_size: 2\nbf16: true\nbeta: 0.1\n"


@pytest.mark.parametrize(
    ("extra", "objective"),
    [
        ("desirable_weight: 1.0\nundesirable_weight: 1.0\n", "kto"),
        ("undesirable_weight: 1.33\ntrain_sampling_strategy: sequential\n", "kto"),
        ("cpo_alpha: 1.0\nloss_type: simpo\n", "cpo"),
        ("simpo_gamma: 0.5\n", "cpo"),  # CPOConfig's cpo_alpha default 1.0
        ("cpo_alpha: 0\nloss_type: simpo\n", "simpo"),
        ("simpo_gamma: 0.5\nloss_type: alphapo\n", "simpo"),  # alphapo sets cpo_alpha 0
        ("max_completion_length: 512\ngenerate_during_eval: false\n", "orpo"),
        ("is_encoder_decoder: false\n", "orpo"),
    ],
)
def test_the_config_names_its_trainer(extra: str, objective: str) -> None:
    text = BASE + "use_peft: true\nlora_dropout: 0.05\ndisable_dropout: true\n" + extra
    mapping = read_train_config_text(text)
    setup = mapping.setup
    assert (setup["objective"], setup["loss"], setup["lora_dropout"]) == (objective, "full", 0.0)
    assert mapping.seq_lens == [1024]  # the three configs' max_length default
    assert not mapping.ignored


def test_a_dpo_config_stays_dpo() -> None:
    mapping = read_train_config_text(BASE + "precompute_ref_log_probs: false\n")
    assert (mapping.setup["objective"], mapping.setup["loss"]) == ("dpo", "chunked")


@pytest.mark.parametrize(
    "extra",
    [
        "train_sampling_strategy: random\n",  # transformers 5's TrainingArguments has it
        "max_completion_length: 256\nnum_generations: 8\n",  # GRPOConfig has it
    ],
)
def test_keys_other_configs_share_name_no_trainer(extra: str) -> None:
    mapping = read_train_config_text("model_name_or_path: x/y\nbf16: true\n" + extra)
    assert mapping.setup.get("objective") not in ("kto", "cpo", "simpo", "orpo")


def test_a_bare_preference_dump_is_read_as_trl() -> None:
    assert detect_format({"desirable_weight": 1.0, "beta": 0.1}) == "trl"
    assert detect_format({"cpo_alpha": 0.0}) == "trl"


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("use_liger_kernel: true\n", "use_liger_kernel"),
        ("precompute_ref_log_probs: true\n", "precompute_ref_log_probs"),
        ("loss_type: apo_zero_unpaired\n", "loss_type"),
    ],
)
def test_what_kto_does_not_model_is_reported(extra: str, key: str) -> None:
    """Each of these lowers KTOTrainer's memory or FLOPs; the estimate stays an upper bound."""
    mapping = read_train_config_text(BASE + "desirable_weight: 1.0\n" + extra)
    assert mapping.setup["objective"] == "kto" and mapping.setup["loss"] == "full"
    assert key in {i.key for i in mapping.ignored}


def test_the_cli_prices_a_kto_dump_as_the_stated_run(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from trainfit.cli import main

    path = tmp_path / "kto.yaml"
    path.write_text(
        BASE + "desirable_weight: 1.0\nmax_length: 2048\ngradient_checkpointing: true\n"
    )
    argv = ["estimate", "--gpu", "h100-80gb", "--format", "json", "--model", "llama-3.1-8b"]
    capsys.readouterr()
    assert main([*argv, "--train-config", str(path)]) == 0
    read = json.loads(capsys.readouterr().out)
    assert read["setup"]["objective"] == "kto" and read["rows"][0]["seq_len"] == 2048
