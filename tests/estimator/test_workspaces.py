"""cuBLAS workspaces (estimator/memory/workspaces.py): two 32 MiB workspaces per device in the
allocated bytes of a CUDA estimate, none in what a CPU run measures, none in seed 000."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.compare import compare
from estimator.memory import memory_breakdown
from estimator.memory.torchtitan import cpu_referee
from estimator.memory.workspaces import PART
from estimator.model_source import resolve_model
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.request import ModelInput
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
MEMTESTS = ROOT / "tests/data/memtests"
MIB = 2**20
SM90_PAIR = 2 * 32 * MIB  # torch's sm90 workspace, on the forward's and autograd's threads


def _spec() -> ModelSpec:
    return resolve_model(ModelInput(config=preset_config("llama-3.1-8b")))


def test_every_moment_holds_two_workspaces_and_cpu_pricing_none() -> None:
    setup = TrainingSetup(method="lora", lora_targets=["all-linear"])
    profile = load_profile("default")
    gpu = memory_breakdown(_spec(), setup, [4096], 1, profile)
    with cpu_referee():
        cpu = memory_breakdown(_spec(), setup, [4096], 1, profile)
    assert {float(parts[PART][0]) for parts in gpu.phases.values()} == {SM90_PAIR}
    assert all(PART not in parts for parts in cpu.phases.values())
    assert float(gpu.allocated[0] - cpu.allocated[0]) == SM90_PAIR
    assert float(gpu.reserved[0] - cpu.reserved[0]) == SM90_PAIR  # 32 MiB blocks: no slack


def test_each_rank_of_a_parallel_layout_holds_its_own() -> None:
    setup = TrainingSetup(method="full", parallel="fsdp=2,tp=2", num_gpus=4)
    profile = load_profile("default")
    gpu = memory_breakdown(_spec(), setup, [4096], 1, profile, devices=4)
    with cpu_referee():
        cpu = memory_breakdown(_spec(), setup, [4096], 1, profile, devices=4)
    assert float(gpu.allocated[0] - cpu.allocated[0]) == SM90_PAIR


def test_seed_profile_counts_none() -> None:
    setup = TrainingSetup(method="lora", lora_targets=["all-linear"])
    mem = memory_breakdown(_spec(), setup, [4096], 1, load_profile("seed-000"))
    assert all(PART not in parts for parts in mem.phases.values())


@pytest.mark.parametrize("run", ["dense-full", "hf-llama-lora"])
def test_the_h200_runs_are_within_a_mib_with_them(run: str) -> None:
    """Llama-3.1-8B on an H200 (torch 2.11): the probe loop's bf16 full fine-tune and
    transformers' Trainer + peft LoRA. Their allocated estimates were 64.0-64.4 MiB under at
    every length before the workspaces."""
    doc = json.loads((MEMTESTS / f"memtest_h200_2026-12-04_{run}.json").read_text())
    rows = compare(doc)["rows"]
    assert len(rows) == 3
    for row in rows:
        assert row["estimated_cublas_workspace_bytes"] == SM90_PAIR
        assert abs(row["error_bytes"]) < MIB


def test_a_cpu_memtest_is_compared_without_them() -> None:
    doc = json.loads((MEMTESTS / "memtest_h200_2026-12-04_dense-full.json").read_text())
    cuda_rows = compare(doc)["rows"]
    doc["environment"]["device"] = "cpu"
    cpu_rows = compare(doc)["rows"]
    for cuda_row, cpu_row in zip(cuda_rows, cpu_rows, strict=True):
        assert cpu_row["estimated_cublas_workspace_bytes"] == 0
        gap = cuda_row["estimated_peak_bytes"] - cpu_row["estimated_peak_bytes"]
        assert gap == SM90_PAIR
        gap = cuda_row["estimated_reserved_bytes"] - cpu_row["estimated_reserved_bytes"]
        assert gap == SM90_PAIR
