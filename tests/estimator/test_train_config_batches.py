"""The batch a training config runs, as its library fills it in, and evaluation batches larger
than it. Before: an HF/TRL config without `per_device_train_batch_size` was priced at 1 row where
the Trainer runs its default 8; axolotl's `batch_size` without `gradient_accumulation_steps`
left accumulation at 1; evaluation batch keys were silent or unread-key warnings."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import TrainingArguments

from estimator.train_config import read_train_config_text
from estimator.train_config.hf_args import HF_DEFAULT_BATCH

TRL = "model_name_or_path: meta-llama/Llama-3.1-8B\nmax_length: 2048\nuse_peft: true\n"
AXOLOTL = "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 2048\n"


def ignored(mapping: object) -> set[str]:
    return {i.key for i in mapping.ignored}  # type: ignore[attr-defined]


def test_the_trainer_default_batch_is_transformers_own() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    assert fields["per_device_train_batch_size"] == HF_DEFAULT_BATCH
    assert fields["per_device_eval_batch_size"] == HF_DEFAULT_BATCH


def test_an_unset_train_batch_is_the_trainer_s_default_and_said_so() -> None:
    mapping = read_train_config_text(TRL)
    assert mapping.setup["batch"] == HF_DEFAULT_BATCH
    assert any("per_device_train_batch_size: unset" in w for w in mapping.warnings)
    given = read_train_config_text(TRL + "per_device_train_batch_size: 2\n")
    assert given.setup["batch"] == 2
    assert not any("per_device_train_batch_size" in w for w in given.warnings)


def test_a_deepspeed_micro_batch_beside_it_still_wins() -> None:
    text = TRL + "deepspeed:\n  train_micro_batch_size_per_gpu: 2\n  zero_optimization:\n"
    mapping = read_train_config_text(text + "    stage: 2\n")
    assert mapping.setup["batch"] == 2


@pytest.mark.parametrize(
    ("extra", "eval_batch"),
    [
        ("per_device_train_batch_size: 1\neval_strategy: steps\n", HF_DEFAULT_BATCH),
        (
            "per_device_train_batch_size: 1\neval_strategy: steps\nper_device_eval_batch_size: 1\n",
            1,
        ),
        ("per_device_train_batch_size: 1\nper_device_eval_batch_size: 16\n", None),  # no eval
        (
            "per_device_train_batch_size: 1\neval_strategy: 'no'\nper_device_eval_batch_size: 16\n",
            None,
        ),
        (
            "per_device_train_batch_size: 2\nevaluation_strategy: epoch\n"
            "per_device_eval_batch_size: 4\n",
            4,
        ),
    ],
)
def test_hf_evaluation_pass_is_the_setup_s_eval_batch(extra: str, eval_batch: int | None) -> None:
    mapping = read_train_config_text(TRL + extra)
    assert mapping.setup.get("eval_batch") == eval_batch
    assert "per_device_eval_batch_size" not in ignored(mapping)
    unset = [w for w in mapping.warnings if w.startswith("per_device_eval_batch_size: unset")]
    assert bool(unset) is ("per_device_eval_batch_size" not in extra and eval_batch is not None)


def test_trl_with_liger_evaluates_with_skipped_logits() -> None:
    """TRL's SFTTrainer asks Liger to skip the logits in evaluation (trl f2cd5771
    sft_trainer.py:1718-1732): its batch is priced with `eval_skip_logits` (before: reported
    under `ignored`, not priced); transformers' own Trainer passes nothing and evaluates with
    the full logits."""
    extra = "use_liger_kernel: true\neval_strategy: steps\nper_device_train_batch_size: 1\n"
    trl = read_train_config_text(TRL + extra)
    assert trl.setup["loss"] == "liger" and trl.setup["eval_batch"] == HF_DEFAULT_BATCH
    assert trl.setup["eval_skip_logits"] is True
    assert "skip_logits" in trl.origin["eval_skip_logits"]
    assert "per_device_eval_batch_size" not in ignored(trl)
    trainer = read_train_config_text("output_dir: out\n" + extra)
    assert trainer.setup["loss"] == "liger" and trainer.setup["eval_batch"] == HF_DEFAULT_BATCH
    assert "eval_skip_logits" not in trainer.setup
    plain = read_train_config_text(TRL + "eval_strategy: steps\n")
    assert plain.setup["eval_batch"] == HF_DEFAULT_BATCH and "eval_skip_logits" not in plain.setup


@pytest.mark.parametrize(
    ("extra", "batch", "accum"),
    [
        ("micro_batch_size: 2\nbatch_size: 16\n", 2, 8),  # accumulation derived
        ("batch_size: 16\ngradient_accumulation_steps: 4\n", None, 4),  # micro default 1
        ("micro_batch_size: 2\ngradient_accumulation_steps: 3\nbatch_size: 64\n", 2, 3),
        ("batch_size: 8\n", None, 8),
    ],
)
def test_axolotl_accumulation_follows_normalize_config(
    extra: str, batch: int | None, accum: int
) -> None:
    mapping = read_train_config_text(AXOLOTL + extra)
    assert mapping.setup.get("batch") == batch
    assert mapping.setup["grad_accum"] == accum


@pytest.mark.parametrize(
    ("extra", "eval_batch"),
    [
        ("micro_batch_size: 1\neval_batch_size: 4\nval_set_size: 0.05\n", 4),
        ("micro_batch_size: 4\neval_batch_size: 4\nval_set_size: 0.05\n", 4),
        ("micro_batch_size: 2\nval_set_size: 0.05\n", 2),  # default: micro_batch_size
        ("micro_batch_size: 1\neval_batch_size: 4\nval_set_size: 0\n", None),  # no eval set
        ("micro_batch_size: 1\neval_batch_size: 4\ntest_datasets:\n  - path: x\n", 4),
    ],
)
def test_axolotl_evaluation_batch(extra: str, eval_batch: int | None) -> None:
    mapping = read_train_config_text(AXOLOTL + extra)
    assert mapping.setup.get("eval_batch") == eval_batch
    assert not [w for w in mapping.warnings if "eval_batch_size" in w]


def test_an_evaluation_pass_not_modelled_is_reported_when_larger() -> None:
    """An evaluation under a tensor-parallel split is not modelled (setup_rules
    .eval_split_unmodelled): reported where its batch is larger than the training's."""
    tp = "fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\ntensor_parallel_size: 2\n"
    larger = read_train_config_text(
        AXOLOTL + tp + "micro_batch_size: 1\neval_batch_size: 4\nval_set_size: 0.05\n"
    )
    assert "eval_batch" not in larger.setup
    reason = {i.key: i.reason for i in larger.ignored}["eval_batch_size"]
    assert "tp=2" in reason
    same = read_train_config_text(AXOLOTL + tp + "micro_batch_size: 2\nval_set_size: 0.05\n")
    assert "eval_batch" not in same.setup and "eval_batch_size" not in ignored(same)


def test_cut_cross_entropy_s_evaluation_is_priced() -> None:
    """Its eval path was read (estimator/memory/evaluation.py): the config's eval batch stands."""
    cce = "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
    mapping = read_train_config_text(
        AXOLOTL + cce + "micro_batch_size: 1\neval_batch_size: 4\nval_set_size: 0.05\n"
    )
    assert mapping.setup["loss"] == "cce" and mapping.setup["eval_batch"] == 4


@pytest.mark.parametrize(
    "key", ["use_kernels", "fused_attn_kernel", "resize_token_embeddings_to_32x"]
)
def test_axolotl_kernel_and_embedding_switches_are_reported(key: str) -> None:
    mapping = read_train_config_text(AXOLOTL + f"{key}: true\n")
    assert key in ignored(mapping)
    assert not [w for w in mapping.warnings if key in w]


@pytest.mark.parametrize(
    ("text", "padded"),
    [
        (TRL + "per_device_train_batch_size: 4\n", True),
        (TRL + "per_device_train_batch_size: 4\npacking: true\n", None),
        (TRL + "per_device_train_batch_size: 4\npadding_free: true\n", None),
        (TRL + "per_device_train_batch_size: 1\n", None),
        ("base_model: m\nadapter: lora\nmicro_batch_size: 1\n", True),
        ("base_model: m\nadapter: lora\nsample_packing: true\n", None),
        ("base_model: m\nadapter: lora\npad_to_sequence_len: false\nmicro_batch_size: 1\n", None),
        ("base_model: m\nadapter: lora\npad_to_sequence_len: false\nmicro_batch_size: 2\n", True),
        ("model_name_or_path: m\nstage: sft\nfinetuning_type: lora\ncutoff_len: 1024\n", True),
        ("model_name_or_path: m\nstage: sft\nfinetuning_type: lora\npacking: true\n", None),
    ],
)
def test_unpacked_rows_are_read_as_padded(text: str, padded: bool | None) -> None:
    """TRL's collator pads attention_mask to the batch's longest row (sft_trainer.py:504-505);
    axolotl's pads to a multiple of 64 (core/builders/causal.py:383-394), LLaMA-Factory's SFT
    collator to a multiple of 8 (train/sft/workflow.py:62-65)."""
    mapping = read_train_config_text(text)
    assert mapping.setup.get("padded_batches") == padded
