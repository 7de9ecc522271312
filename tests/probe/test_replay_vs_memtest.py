"""The probe's caching-allocator simulation (probe/allocator.py) against the H200: the same
setup and sweep traced on the CPU under fake tensors and replayed reproduce the reserved peaks
torch measured on the card (tests/data/memtests/), length by length."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import replay_vs_memtest  # noqa: E402

from probe.allocator import AllocatorConfig, replay  # noqa: E402
from probe.allocator_events import Event  # noqa: E402
from probe.simulated_reserved import per_length_peaks  # noqa: E402

DENSE = ROOT / "tests/data/memtests/memtest_h200_2026-12-04_dense-full.json"
CUBLAS_WORKSPACES = 2 * 32 * 2**20  # two handles' sm90 workspaces, which a CPU trace lacks


def test_the_replayed_sweep_reserves_what_the_h200_reserved() -> None:
    rows = replay_vs_memtest.simulate(json.loads(DENSE.read_text()))
    assert [r["seq_len"] for r in rows] == [2048, 4096, 8192]
    for r in rows:
        assert r["status"] == r["traced_status"] == "ok"
        reserved_error = (r["simulated_reserved"] - r["measured_reserved"]) / r["measured_reserved"]
        assert abs(reserved_error) <= 0.005, r
        missing = r["measured_allocated"] - r["simulated_allocated"]
        assert abs(missing - CUBLAS_WORKSPACES) <= 2**20, r  # the workspaces, to the MiB
    # the first length's segments stay with the process: its reserved peak is the highest
    assert rows[0]["measured_reserved"] > rows[1]["measured_reserved"]
    assert rows[0]["simulated_reserved"] > rows[1]["simulated_reserved"]


def test_each_length_ends_where_the_next_one_is_marked() -> None:
    marks = [Event("empty_cache"), Event("reset_peak")]
    build = [Event("alloc", 0, 4 * 2**20), Event("free", 0)]  # before the first mark: not a length
    first = [*marks, Event("alloc", 1, 512)]
    second = [*marks, Event("alloc", 2, 3 * 2**20), Event("free", 2), Event("free", 1)]
    events = [*build, *first, *second]
    config = AllocatorConfig()
    # each length's peaks are those of a replay of the trace up to its end
    expected = []
    for end in (len(build) + len(first), len(events)):
        alone = replay(events[:end], config)
        expected.append((alone.peak_allocated, alone.peak_reserved))
    assert per_length_peaks(events, 2, config) == expected
    assert expected[0] == (512, 2 * 2**20) and expected[1][0] == 512 + 3 * 2**20
    with pytest.raises(ValueError, match="expected 3 length marks"):
        per_length_peaks(events, 3, config)
    with pytest.raises(ValueError, match="ran out"):
        per_length_peaks(events, 2, AllocatorConfig(capacity=2**20))


def test_a_memtest_the_cpu_cannot_trace_exits_2(tmp_path: Path, capsys) -> None:
    doc = json.loads(
        (ROOT / "tests/data/memtests/memtest_h200_2026-12-04_hf-llama-qlora.json").read_text()
    )
    path = tmp_path / "q.json"
    path.write_text(json.dumps(doc))
    assert replay_vs_memtest.main([str(path)]) == 2
    assert "QLoRA" in capsys.readouterr().err
