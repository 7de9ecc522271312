"""Which loss a training config runs. transformers' Trainer computes the model's own loss over
every logit (`full`); only TRL's SFTTrainer defaults to its chunked_nll (the hf stack's default).
axolotl's AxolotlTrainer, LLaMA-Factory's trainers and a plain TrainingArguments config run the
Trainer's, and before this the readers left them the SFTTrainer's 256-token chunks: Llama-3.1-8B
at 8k tokens lost ~6 GiB of logits, an underestimate. axolotl's Cut Cross-Entropy plugin is on
once listed (its `cut_cross_entropy` defaults to True)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from estimator.train_config import read_train_config_text
from trainfit.cli import main

AXOLOTL = "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nsequence_len: 8192\n"
CCE = "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"


@pytest.mark.parametrize(
    ("text", "loss"),
    [
        (AXOLOTL, "full"),
        (AXOLOTL + CCE, "cce"),  # listed: on by default
        (AXOLOTL + CCE + "cut_cross_entropy: false\n", "full"),
        (AXOLOTL + "cut_cross_entropy: true\n", "cce"),
        (AXOLOTL + "liger_fused_linear_cross_entropy: true\n", "liger"),
        (AXOLOTL + "chunked_cross_entropy: true\n", "chunked"),
        ("model_name_or_path: x/y\nstage: sft\ncutoff_len: 4096\n", "full"),
        ("model_name_or_path: x/y\nstage: pt\ncutoff_len: 4096\n", "full"),
        ("model_name_or_path: x/y\nstage: sft\nenable_liger_kernel: true\n", "liger"),
        ("model_name_or_path: x/y\nper_device_train_batch_size: 1\nbf16: true\n", "full"),
        ("model_name_or_path: x/y\nmax_length: 4096\nper_device_train_batch_size: 1\n", "chunked"),
    ],
)
def test_the_trainer_s_loss(text: str, loss: str) -> None:
    mapping = read_train_config_text(text)
    assert mapping.setup["loss"] == loss


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (AXOLOTL + "rl: grpo\n", "rl"),
        ("model_name_or_path: x/y\nstage: kto\ncutoff_len: 4096\n", "stage"),
        ("model_name_or_path: x/y\nstage: dpo\npure_bf16: true\n", "stage"),
    ],
)
def test_preference_training_is_reported_not_guessed(text: str, key: str) -> None:
    mapping = read_train_config_text(text)
    assert key in {i.key for i in mapping.ignored}
    assert "loss" not in mapping.setup


def _peak(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    assert main(["estimate", "--gpu", "h100-80gb", "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)["rows"][0]["peak_bytes"]


def test_an_axolotl_run_is_priced_with_the_trainer_s_logits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "axolotl.yml"
    path.write_text(AXOLOTL)
    read = _peak(capsys, "--train-config", str(path))
    # unpacked axolotl rows are padded (to a multiple of 64): SDPA gets a mask
    stated = ("--model", "llama-3.1-8b", "--method", "lora", "--seq", "8192", "--padded-batches")
    assert read == _peak(capsys, *stated, "--loss", "full", "--lora-dropout", "0")
    chunked = _peak(capsys, *stated, "--loss", "chunked", "--lora-dropout", "0")
    logits = 8192 * 128256 * 4  # at least the fp32 upcast of every logit
    assert read - chunked > logits


@pytest.mark.parametrize("rl", ["dpo", "ipo"])
def test_axolotl_dpo_is_trl_1_8_s_dpo_trainer_with_the_full_logits(rl: str) -> None:
    """axolotl pins trl==1.8.0, whose DPOTrainer reads the full logits: `objective dpo`,
    `loss full`; DPOConfig's disable_dropout zeroes the adapters' dropout."""
    mapping = read_train_config_text(AXOLOTL + f"rl: {rl}\nlora_dropout: 0.05\n" + CCE)
    setup = mapping.setup
    assert (setup["objective"], setup["loss"], setup["lora_dropout"]) == ("dpo", "full", 0.0)
    assert "plugins (CutCrossEntropyPlugin)" in {i.key for i in mapping.ignored}
    pre = read_train_config_text(AXOLOTL + f"rl: {rl}\nprecompute_ref_log_probs: true\n")
    assert pre.setup["objective"] == "dpo-precomputed"
    evaluated = read_train_config_text(AXOLOTL + f"rl: {rl}\nval_set_size: 0.05\n")
    assert "eval_batch" not in evaluated.setup  # DPO's evaluation pass: reported
    assert "val_set_size" in {i.key for i in evaluated.ignored}


@pytest.mark.parametrize(
    ("extra", "objective"),
    [
        ("rl: orpo\n", "orpo"),
        ("rl: simpo\n", "cpo"),  # CPOConfig's cpo_alpha 1.0: the NLL term runs
        ("rl: simpo\ncpo_alpha: 0.5\n", "cpo"),
        ("rl: simpo\ncpo_alpha: 0\n", "simpo"),
    ],
)
def test_axolotl_orpo_and_simpo_are_trl_1_8_s_trainers_with_the_full_logits(
    extra: str, objective: str
) -> None:
    """`rl: orpo` runs TRL 1.8.0's ORPOTrainer, `rl: simpo` its CPOTrainer (loss_type simpo),
    both reading the full logits; disable_dropout zeroes the adapters' dropout."""
    text = AXOLOTL + extra + "lora_dropout: 0.05\norpo_alpha: 0.1\nsimpo_gamma: 0.5\n" + CCE
    mapping = read_train_config_text(text)
    setup = mapping.setup
    assert (setup["objective"], setup["loss"], setup["lora_dropout"]) == (objective, "full", 0.0)
    assert "plugins (CutCrossEntropyPlugin)" in {i.key for i in mapping.ignored}
    assert "rl" not in {i.key for i in mapping.ignored}
    evaluated = read_train_config_text(AXOLOTL + extra + "val_set_size: 0.05\n")
    assert "eval_batch" not in evaluated.setup  # the trainer's evaluation pass: reported
    assert "val_set_size" in {i.key for i in evaluated.ignored}


def test_an_axolotl_orpo_run_is_priced_above_its_dpo_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ORPO's chosen-half cross-entropy keeps its fp32 log-softmax (half a pair's logits at 4
    bytes) beside the four tensors DPO's backward holds; before, `rl: orpo` read as SFT."""
    path = tmp_path / "axolotl.yml"
    path.write_text(AXOLOTL + "rl: orpo\n")
    read = _peak(capsys, "--train-config", str(path))
    stated = ("--model", "llama-3.1-8b", "--method", "lora", "--seq", "8192", "--padded-batches")
    assert read == _peak(capsys, *stated, "--objective", "orpo", "--lora-dropout", "0")
    dpo = _peak(capsys, *stated, "--objective", "dpo", "--loss", "full", "--lora-dropout", "0")
    assert read - dpo == 8192 * 128256 * 4  # the chosen half's saved log-softmax


def test_axolotl_kto_is_trl_1_8_s_kto_trainer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rl: kto`: KTOTrainer with the full logits, LoRA dropout off; its micro-batch needs two
    rows, so axolotl's default micro_batch_size 1 is refused naming the batch (KTOTrainer
    raises too)."""
    text = AXOLOTL + "rl: kto\nmicro_batch_size: 2\nlora_dropout: 0.05\n"
    mapping = read_train_config_text(text + "kto_desirable_weight: 1.33\n")
    setup = mapping.setup
    assert (setup["objective"], setup["loss"], setup["lora_dropout"]) == ("kto", "full", 0.0)
    assert "rl" not in {i.key for i in mapping.ignored}
    path = tmp_path / "axolotl.yml"
    path.write_text(text)
    read = _peak(capsys, "--train-config", str(path))
    stated = ("--model", "llama-3.1-8b", "--method", "lora", "--seq", "8192", "--padded-batches")
    kto = ("--objective", "kto", "--batch", "2", "--lora-dropout", "0")
    assert read == _peak(capsys, *stated, *kto)
    path.write_text(AXOLOTL + "rl: kto\n")
    capsys.readouterr()
    assert main(["estimate", "--gpu", "h100-80gb", "--train-config", str(path)]) == 2
    assert "batch: KTOTrainer" in capsys.readouterr().err


def test_an_axolotl_dpo_run_is_priced_above_its_sft_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "axolotl.yml"
    path.write_text(AXOLOTL + "rl: dpo\n")
    read = _peak(capsys, "--train-config", str(path))
    stated = ("--model", "llama-3.1-8b", "--method", "lora", "--seq", "8192", "--padded-batches")
    dpo = ("--objective", "dpo", "--loss", "full", "--lora-dropout", "0")
    assert read == _peak(capsys, *stated, *dpo)
    as_sft = _peak(capsys, *stated, "--loss", "full", "--lora-dropout", "0")
    logits = 2 * 8192 * 128256 * 4 * 4  # a pair's four fp32 logits-sized tensors
    assert read - as_sft > logits / 2


LF_DPO = "model_name_or_path: x/y\nstage: dpo\ncutoff_len: 4096\nbf16: true\n"


def test_llamafactory_dpo_is_priced_with_its_full_fp32_logits() -> None:
    """LLaMA-Factory's CustomDPOTrainer under AMP holds the policy's fp32 logits and their
    log-softmax beside the reference's: the four fp32 logits-sized tensors of `loss full`."""
    mapping = read_train_config_text(LF_DPO + "lora_dropout: 0.05\neval_strategy: steps\n")
    setup = mapping.setup
    assert (setup["objective"], setup["loss"], setup["lora_dropout"]) == ("dpo", "full", 0.0)
    assert setup["padded_batches"] is True and "eval_batch" not in setup
    assert "eval_strategy" in {i.key for i in mapping.ignored}
    for pref_loss in ("orpo", "simpo"):  # no reference model (finetuning_args.py:593)
        alone = read_train_config_text(LF_DPO + f"pref_loss: {pref_loss}\n")
        assert alone.setup["objective"] == "dpo-precomputed"
    separate = read_train_config_text(LF_DPO + "ref_model: x/z\n")
    assert "ref_model" in {i.key for i in separate.ignored}


def test_a_llamafactory_dpo_run_is_priced_above_its_sft_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = "model_name_or_path: meta-llama/Llama-3.1-8B\nbf16: true\ncutoff_len: 4096\n"
    base += "per_device_train_batch_size: 1\n"
    dpo, sft = tmp_path / "dpo.yml", tmp_path / "sft.yml"
    dpo.write_text(base + "stage: dpo\n")
    sft.write_text(base + "stage: sft\n")
    pair_logits = 2 * 4096 * 128256 * 4
    assert (
        _peak(capsys, "--train-config", str(dpo)) - _peak(capsys, "--train-config", str(sft))
        > 2 * pair_logits
    )
