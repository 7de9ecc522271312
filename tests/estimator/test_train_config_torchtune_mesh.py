"""torchtune recipe configs: the model builders of the Qwen 2.5 / Qwen 3 / Llama 4 recipes, the
distributed recipes' device mesh (tensor, context and data dims) and main's validation batch.
Before, a Qwen 3 or Qwen 2.5 builder said "not a builder trainfit knows; give --model" (the
table's `qwen3_8b` matched no builder: they are `qwen3_8b_base` / `qwen3_8b_instruct`), and the
mesh and validation keys were unread-key warnings on every distributed config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.errors import EstimatorInputError
from estimator.train_config import read_train_config_text
from estimator.train_config.torchtune import BUILDER
from trainfit.cli import main

FULL = (
    "model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\n"
    "tokenizer:\n  max_seq_len: 8192\nbatch_size: 2\n"
    "optimizer:\n  _component_: torch.optim.AdamW\n"
    "loss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n"
    "fsdp_cpu_offload: False\n"
)
PLAN = "tensor_parallel_plan:\n  _component_: torchtune.models.llama3.base_llama_tp_plan\n"


def read(text: str) -> object:
    return read_train_config_text(text, "torchtune")


def ignored(mapping: object) -> set[str]:
    return {i.key for i in mapping.ignored}  # type: ignore[attr-defined]


def unread(mapping: object) -> list[str]:
    return [w for w in mapping.warnings if "not read by" in w]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("component", "model", "method"),
    [
        ("torchtune.models.qwen3.qwen3_8b_instruct", {"preset": "qwen3-8b"}, "full"),
        ("torchtune.models.qwen3.lora_qwen3_0_6b_instruct", {"hub": "Qwen/Qwen3-0.6B"}, "lora"),
        ("torchtune.models.qwen3.qwen3_14b_base", {"hub": "Qwen/Qwen3-14B-Base"}, "full"),
        ("torchtune.models.qwen3.lora_qwen3_14b_instruct", {"preset": "qwen3-14b"}, "lora"),
        (
            "torchtune.models.qwen2_5.qlora_qwen2_5_7b_base",
            {"preset": "qwen2.5-7b"},
            "qlora",
        ),
        ("torchtune.models.llama4.llama4_scout_17b_16e", {"preset": "llama-4-scout"}, "full"),
    ],
)
def test_builders_name_their_model(component: str, model: dict[str, str], method: str) -> None:
    mapping = read(FULL.replace("torchtune.models.llama3_1.llama3_1_8b", component))
    assert mapping.model == model  # type: ignore[attr-defined]
    assert mapping.setup["method"] == method  # type: ignore[attr-defined]
    assert not [w for w in mapping.warnings if "builder" in w]  # type: ignore[attr-defined]


def test_an_unknown_builder_still_asks_for_the_model() -> None:
    component = "torchtune.models.llama3_2_vision.llama3_2_vision_11b"
    assert BUILDER.match(component)
    mapping = read(FULL.replace("torchtune.models.llama3_1.llama3_1_8b", component))
    assert mapping.model is None  # type: ignore[attr-defined]
    assert any("not a builder trainfit knows" in w for w in mapping.warnings)  # type: ignore[attr-defined]


def test_the_configs_default_mesh_is_read_without_a_word() -> None:
    """The 70B configs ship `tensor_parallel_dim: 1` with a plan, and main's defaults."""
    text = FULL + "tensor_parallel_dim: 1\n" + PLAN + "data_parallel_shard_dim: -1\n"
    mapping = read(text + "data_parallel_replicate_dim: 1\ncontext_parallel_dim: 1\n")
    assert mapping.setup["parallel"] == "fsdp"  # type: ignore[attr-defined]
    assert not unread(mapping) and not ignored(mapping)


@pytest.mark.parametrize(
    ("extra", "parallel"),
    [
        ("context_parallel_dim: 4\n", "cp=4,fsdp"),
        ("data_parallel_shard_dim: 4\ndata_parallel_replicate_dim: 2\n", "fsdp=4,dp=2"),
        ("data_parallel_replicate_dim: 2\n", "fsdp,dp=2"),
        ("context_parallel_dim: 2\nfsdp_reshard_after_forward: False\n", "cp=2,zero2"),
    ],
)
def test_context_and_data_dims_become_a_layout(extra: str, parallel: str) -> None:
    mapping = read(FULL + extra)
    assert mapping.setup["parallel"] == parallel  # type: ignore[attr-defined]
    assert not unread(mapping)


def test_tensor_parallelism_is_reported_and_priced_as_fsdp() -> None:
    mapping = read(FULL + "tensor_parallel_dim: 8\n" + PLAN)
    assert "tensor_parallel_dim" in ignored(mapping)
    assert mapping.setup["parallel"] == "fsdp"  # type: ignore[attr-defined]
    assert not unread(mapping)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (FULL + "tensor_parallel_dim: 2\n", "train_config.tensor_parallel_plan"),
        (
            FULL.replace("llama3_1_8b", "lora_llama3_1_8b") + "tensor_parallel_dim: 2\n" + PLAN,
            "train_config.tensor_parallel_dim",
        ),
        (FULL + "context_parallel_dim: two\n", "context_parallel_dim"),
    ],
)
def test_a_mesh_the_recipe_refuses_names_the_field(text: str, field: str) -> None:
    with pytest.raises(EstimatorInputError) as info:
        read(text)
    assert info.value.field.endswith(field)


VAL = "dataset_val:\n  _component_: torchtune.datasets.alpaca_dataset\n"


@pytest.mark.parametrize(
    ("extra", "eval_batch"),
    [
        ("batch_size_val: ${batch_size}\nrun_val_every_n_steps: 100\n", "train"),
        ("batch_size_val: 2\nrun_val_every_n_steps: 100\n", 2),
        ("batch_size_val: 16\nrun_val_every_n_steps: null\n", None),  # validation is off
        ("batch_size_val: 16\nrun_val_every_n_steps: 100\n", 16),
        ("run_val_every_n_steps: 100\n", "train"),  # default: batch_size
    ],
)
def test_the_validation_batch_is_the_setup_s_eval_batch(
    extra: str, eval_batch: int | str | None
) -> None:
    mapping = read(FULL + VAL + extra)
    setup = mapping.setup  # type: ignore[attr-defined]
    expected = setup.get("batch", 1) if eval_batch == "train" else eval_batch
    assert setup.get("eval_batch") == expected
    assert "batch_size_val" not in ignored(mapping)
    assert not unread(mapping)


def test_a_context_parallel_config_prices_a_smaller_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    peaks = []
    for name, extra in (("fsdp", ""), ("cp", "context_parallel_dim: 4\n")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(FULL + extra)
        capsys.readouterr()
        args = ["estimate", "--train-config", str(path), "--gpu", "8xh100-80gb"]
        assert main([*args, "--format", "json"]) == 0
        row = json.loads(capsys.readouterr().out)["rows"][0]
        peaks.append(row["fit"]["8xh100-80gb"]["peak_bytes"])
    assert peaks[1] < peaks[0]  # the sequence split over 4 ranks
