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
    ("extra", "reported"),
    [
        ("per_device_train_batch_size: 1\neval_strategy: steps\n", True),  # eval default 8
        (
            "per_device_train_batch_size: 1\neval_strategy: steps\nper_device_eval_batch_size: 1\n",
            False,
        ),
        ("per_device_train_batch_size: 1\nper_device_eval_batch_size: 16\n", False),  # no eval
        (
            "per_device_train_batch_size: 1\neval_strategy: 'no'\nper_device_eval_batch_size: 16\n",
            False,
        ),
        (
            "per_device_train_batch_size: 2\nevaluation_strategy: epoch\n"
            "per_device_eval_batch_size: 4\n",
            True,
        ),
        ("eval_strategy: steps\n", False),  # both at the default 8
    ],
)
def test_hf_evaluation_batch_above_the_training_one_is_reported(extra: str, reported: bool) -> None:
    mapping = read_train_config_text(TRL + extra)
    assert ("per_device_eval_batch_size" in ignored(mapping)) is reported


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
    ("extra", "reported"),
    [
        ("micro_batch_size: 1\neval_batch_size: 4\nval_set_size: 0.05\n", True),
        ("micro_batch_size: 4\neval_batch_size: 4\nval_set_size: 0.05\n", False),
        ("micro_batch_size: 1\neval_batch_size: 4\nval_set_size: 0\n", False),  # no eval set
        ("micro_batch_size: 1\neval_batch_size: 4\ntest_datasets:\n  - path: x\n", True),
    ],
)
def test_axolotl_evaluation_batch(extra: str, reported: bool) -> None:
    mapping = read_train_config_text(AXOLOTL + extra)
    assert ("eval_batch_size" in ignored(mapping)) is reported
    assert not [w for w in mapping.warnings if "eval_batch_size" in w]


@pytest.mark.parametrize(
    "key", ["use_kernels", "fused_attn_kernel", "resize_token_embeddings_to_32x"]
)
def test_axolotl_kernel_and_embedding_switches_are_reported(key: str) -> None:
    mapping = read_train_config_text(AXOLOTL + f"{key}: true\n")
    assert key in ignored(mapping)
    assert not [w for w in mapping.warnings if key in w]
