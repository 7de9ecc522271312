"""The notebook API computes through the same document path as the CLI and the service."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import trainfit
from estimator.document import estimate_document
from estimator.request import EstimateRequest

pd = pytest.importorskip("pandas")
GIB = 2**30


def test_estimate_frame_has_one_row_per_length_and_gpu_with_bytes_and_gib() -> None:
    plan = trainfit.estimate(
        "llama-3.1-8b", gpus=["h100-80gb", "2xh200"], seq_lens=[4096, 8192], method="lora"
    )
    frame = plan.to_frame()
    assert len(frame) == 4
    assert set(frame["gpu"]) == {"h100-80gb", "2xh200"}
    assert (frame["peak_gib"] * GIB - frame["peak_bytes"]).abs().max() < 1
    assert (frame["margin_bytes"] == frame["usable_bytes"] - frame["peak_bytes"]).all()
    doc = estimate_document(
        EstimateRequest.model_validate(
            {
                "model": {"preset": "llama-3.1-8b"},
                "setup": {"method": "lora"},
                "seq_lens": [4096, 8192],
                "gpus": ["h100-80gb", "2xh200"],
            }
        )
    )
    expected = {
        (r["seq_len"], g): f["peak_bytes"] for r in doc["rows"] for g, f in r["fit"].items()
    }
    got = {(int(r.seq_len), r.gpu): int(r.peak_bytes) for r in frame.itertuples()}
    assert got == expected


def test_sweep_frame_agrees_with_the_estimate_at_the_same_cell() -> None:
    frame = trainfit.sweep(
        "llama-3.1-8b",
        seq_lens=[2048, 4096],
        batches=[1, 2],
        gpus=["h100-80gb", "h200"],
        setups=[{"method": "lora"}, {"method": "full"}],
    )
    assert len(frame) == 2 * 2 * 2 * 2
    cell = frame[
        (frame.method == "lora")
        & (frame.seq_len == 4096)
        & (frame.batch == 1)
        & (frame.gpu == "h200")
    ]
    plan = trainfit.estimate("llama-3.1-8b", gpus=["h200"], seq_lens=[4096], method="lora")
    assert int(cell.peak_bytes.iloc[0]) == plan.doc["rows"][0]["peak_bytes"]
    assert cell.verdict.iloc[0] == plan.doc["rows"][0]["fit"]["h200"]["verdict"]


def test_bad_setup_names_the_field() -> None:
    with pytest.raises(ValidationError) as err:
        trainfit.estimate("llama-3.1-8b", gpus=["h200"], method="sideways")
    assert "method" in str(err.value)


def test_version_is_the_installed_distribution() -> None:
    from importlib.metadata import version

    assert trainfit.__version__ == version("trainfit")


def test_estimate_takes_a_training_config_and_keywords_win() -> None:
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "examples" / "train_configs"
    plan = trainfit.estimate(
        train_config=config / "axolotl-qlora-llama31-8b.yml", gpus="h100-80gb", lora_rank=8
    )
    assert plan.doc["model"]["name"] == "llama-3.1-8b"
    assert [r["seq_len"] for r in plan.doc["rows"]] == [8192]  # the file's sequence_len
    assert plan.doc["setup"]["method"] == "qlora" and plan.doc["setup"]["lora_rank"] == 8
    assert "lora_qkv_kernel" in {i["key"] for i in plan.doc["setup"]["ignored"]}
    assert plan.doc["setup"]["liger_kernels"] is True  # liger_rms_norm + liger_glu_activation
    assert plan.doc["setup"]["offload"] == "optimizer"  # the DeepSpeed JSON beside it
    assert len(plan.to_frame()) == 1
    shorter = trainfit.estimate(
        train_config=[config / "trl-sft-qlora.yml", config / "accelerate-fsdp.yml"],
        gpus=["h100-80gb"],
        seq_lens=2048,
    )
    assert shorter.doc["setup"]["num_gpus"] == 4 and shorter.doc["rows"][0]["seq_len"] == 2048


def test_a_hub_id_string_is_a_hub_model(hub_env: object) -> None:
    plan = trainfit.estimate("acme/tiny-llama", gpus="h100-80gb", seq_lens=512)
    assert plan.doc["model"]["name"] == "acme/tiny-llama"
    assert trainfit.estimate("meta-llama/Llama-3.1-8B", gpus="h200").doc["model"]["name"] == (
        "llama-3.1-8b"
    )
