"""The estimator against memory measured on a real GPU: the memtests under tests/data/memtests/
(written by `bench/gpu_check.sh` on an H200, committed unchanged, each with a row in that
folder's README). Nothing in the estimator was fitted to them: they are the referee."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from estimator.document import compare_memtest
from memtest_schema import load_memtest

ROOT = Path(__file__).resolve().parents[2]
MEMTESTS = ROOT / "tests" / "data" / "memtests"
FILES = sorted(MEMTESTS.glob("memtest_*.json"))

ALLOCATED_TOLERANCE_PCT = 2.0  # torch.cuda.max_memory_allocated
RESERVED_TOLERANCE_PCT = 7.0  # max_memory_reserved: the caching allocator's segments


def _measured(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = load_memtest(path.read_bytes())
    return doc, compare_memtest(doc)


def test_there_are_gpu_memtests_and_the_readme_lists_each_with_its_command() -> None:
    assert FILES, "no measured memtests"
    readme = (MEMTESTS / "README.md").read_text()
    for path in FILES:
        doc = json.loads(path.read_text())
        assert f"`{path.name}`" in readme
        assert doc["tool"]["command"] in readme
        assert doc["environment"]["device"] == "cuda"
        assert doc["environment"]["memory_counter"] == "torch.cuda.max_memory_allocated"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_allocated_and_reserved_peaks_are_close_to_the_measured_ones(path: Path) -> None:
    doc, comparison = _measured(path)
    ok = [r for r in comparison["rows"] if r["status"] == "ok"]
    assert ok, f"{path.name} has no measured length"
    for row in ok:
        assert abs(row["error_pct"]) <= ALLOCATED_TOLERANCE_PCT, row
        assert abs(row["reserved_error_pct"]) <= RESERVED_TOLERANCE_PCT, row
        assert row["estimated_reserved_bytes"] >= row["estimated_peak_bytes"]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_the_memory_outside_the_allocator_is_read_off_cudas_free_memory(path: Path) -> None:
    doc, comparison = _measured(path)
    by_seq = {r["seq_len"]: r for r in doc["results"]}
    for row in comparison["rows"]:
        if row["status"] != "ok":
            continue
        device = by_seq[row["seq_len"]]["device_memory"]
        outside = row["measured_outside_allocator_bytes"]
        held = device["total_bytes"] - device["free_after_bytes"]
        assert outside == held - row["measured_reserved_bytes"]
        assert 0 < outside < 2**30  # the context and library handles, under a GiB on an H200


def test_the_profiles_cuda_context_is_the_measured_one() -> None:
    """`cuda_context_bytes` in the default profile cites these files: it must be what they
    measured (the median over every measured length), to the MiB."""
    outside: list[int] = []
    assumed: set[int] = set()
    for path in FILES:
        _, comparison = _measured(path)
        for row in comparison["rows"]:
            if row["status"] == "ok":
                outside.append(row["measured_outside_allocator_bytes"])
                assumed.add(row["estimated_outside_allocator_bytes"])
    assert len(assumed) == 1
    assert abs(assumed.pop() - statistics.median(outside)) < 2**20


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_the_card_is_recognised_and_measured_speed_sits_next_to_the_time_model(path: Path) -> None:
    """No target on time: 2 steps of random weights per length (the first one a warm-up) are a
    reading, not a benchmark; the rows only have to be there, positive, with the error's sign."""
    doc, comparison = _measured(path)
    assert comparison["gpu"] == "h200"
    ok = [r["seq_len"] for r in doc["results"] if r["status"] == "ok"]
    assert [s["seq_len"] for s in comparison["speed"]] == ok
    for s in comparison["speed"]:
        measured, estimated = s["measured_tokens_per_second"], s["estimated_tokens_per_second"]
        assert measured > 0 and estimated > 0
        assert s["error_pct"] == pytest.approx(100 * (estimated - measured) / measured, abs=0.06)
