"""Solvers: the answer fits, one step more does not, and a brute-force grid agrees."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup
from estimator.solvers import Budget, max_batch, max_seq, min_gpus, peak_bytes
from gpu_catalog import get_gpu
from trainfit.cli import main

LLAMA = spec_from_config(preset_config("llama-3.1-8b"))
QWEN35 = spec_from_config(preset_config("qwen3.5-27b"))
QLORA = TrainingSetup(method="qlora", lora_rank=32, lora_targets=["all-linear"])


@pytest.mark.parametrize("profile", ["default", "seed-000"])
@pytest.mark.parametrize("gpu", ["rtx-3060", "rtx-4090", "l40s", "a100-80gb"])
@pytest.mark.parametrize("checkpointing,loss", [("gpu", "full"), ("offload", "chunked")])
def test_max_seq_fits_and_the_next_step_does_not(profile, gpu, checkpointing, loss) -> None:
    setup = QLORA.model_copy(update={"checkpointing": checkpointing, "loss": loss})
    budget = Budget(get_gpu(gpu).capacity_bytes)
    prof = load_profile(profile)
    answer = max_seq(LLAMA, setup, budget, prof, granularity=256)
    seq = answer["seq_len"]
    if seq is None:  # seed-000's fixed 3 GiB + 3 GiB allowances exceed a 12 GB card here
        assert peak_bytes(LLAMA, setup, 256, 1, prof) > budget.usable_bytes
        return
    assert seq % 256 == 0
    assert peak_bytes(LLAMA, setup, seq, 1, prof) <= budget.usable_bytes
    assert peak_bytes(LLAMA, setup, seq + 256, 1, prof) > budget.usable_bytes


def test_max_seq_agrees_with_a_brute_force_grid() -> None:
    prof = load_profile("default")
    budget = Budget(get_gpu("rtx-4090").capacity_bytes)
    grid = range(256, 64 * 1024 + 1, 256)
    brute = max(s for s in grid if peak_bytes(LLAMA, QLORA, s, 1, prof) <= budget.usable_bytes)
    assert max_seq(LLAMA, QLORA, budget, prof)["seq_len"] == brute


def test_max_batch_fits_and_batch_plus_one_does_not() -> None:
    prof = load_profile("default")
    budget = Budget(get_gpu("h200").capacity_bytes)
    setup = TrainingSetup(method="lora")
    b = max_batch(LLAMA, setup, 4096, budget, prof)["batch"]
    assert peak_bytes(LLAMA, setup, 4096, b, prof) <= budget.usable_bytes
    assert peak_bytes(LLAMA, setup, 4096, b + 1, prof) > budget.usable_bytes
    brute = max(
        k for k in range(1, 64) if peak_bytes(LLAMA, setup, 4096, k, prof) <= budget.usable_bytes
    )
    assert b == brute


@pytest.mark.parametrize("sharding", ["fsdp", "zero3", "zero2", "device_map"])
def test_min_gpus_fits_and_one_fewer_does_not(sharding) -> None:
    prof = load_profile("default")
    budget = Budget(get_gpu("h100-80gb").capacity_bytes)
    setup = TrainingSetup(method="full", sharding=sharding)
    n = min_gpus(LLAMA, setup, 4096, budget, prof)["gpus"]
    assert n is not None and n > 1
    assert peak_bytes(LLAMA, setup, 4096, 1, prof, n) <= budget.usable_bytes
    assert peak_bytes(LLAMA, setup, 4096, 1, prof, n - 1) > budget.usable_bytes


def test_nothing_fits_is_reported_not_invented() -> None:
    prof = load_profile("default")
    answer = max_seq(
        QWEN35, TrainingSetup(method="full"), Budget(get_gpu("rtx-3060").capacity_bytes), prof
    )
    assert answer["seq_len"] is None and "does not fit" in answer["reason"]


def test_profiles_differ_only_where_the_profile_does() -> None:
    """Same inputs, two profiles: with the logits the only large activation (offload +
    chunked on a small-vocab model) the answers are close; with full logits seed-000's
    6 bytes/logit allows a longer sequence than default's 12."""
    budget = Budget(get_gpu("a100-80gb").capacity_bytes)
    full = QLORA.model_copy(update={"loss": "full"})
    seed = max_seq(LLAMA, full, budget, load_profile("seed-000"))["seq_len"]
    default = max_seq(LLAMA, full, budget, load_profile("default"))["seq_len"]
    assert seed > default


def test_cli_solvers_exit_codes(capsys) -> None:
    base = ["--model", "llama-3.1-8b", "--method", "qlora", "--lora-rank", "32"]
    assert main(["max-seq", *base, "--gpu", "rtx-4090"]) == 0
    assert "longest sequence" in capsys.readouterr().out
    assert main(["max-seq", "--model", "qwen3.5-27b", "--gpu", "rtx-3060"]) == 1
    assert (
        main(
            [
                "min-gpus",
                "--model",
                "llama-3.1-8b",
                "--sharding",
                "fsdp",
                "--seq",
                "8192",
                "--gpu",
                "h100-80gb",
                "--format",
                "json",
            ]
        )
        == 0
    )
    assert main(["max-batch", *base, "--seq", "1024", "--gpu", "nope"]) == 2


def test_a_card_given_by_capacity_alone_answers_memory_questions(capsys) -> None:
    assert (
        main(
            [
                "max-seq",
                "--model",
                "llama-3.1-8b",
                "--method",
                "qlora",
                "--lora-rank",
                "32",
                "--gpu",
                "24gib",
                "--format",
                "json",
            ]
        )
        == 0
    )
    import json

    answer = json.loads(capsys.readouterr().out)
    assert answer["capacity_bytes"] == 24 * 2**30 and answer["seq_len"] > 0
