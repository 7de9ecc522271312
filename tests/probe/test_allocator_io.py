"""Trace files and the command line of the allocator simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probe.allocator import MiB, replay
from probe.allocator_cli import main
from probe.allocator_events import Event, TraceError, alloc, dump_jsonl, free, load_trace


def test_the_three_file_formats_give_the_same_events(tmp_path: Path) -> None:
    events = [alloc(1, 5 * MiB), alloc("x", 100), free(1), Event("empty_cache"), free("x")]
    jsonl = tmp_path / "t.jsonl"
    dump_jsonl(events, jsonl)
    array = tmp_path / "t.json"
    array.write_text(json.dumps([e.to_json() for e in events]))
    text = tmp_path / "t.txt"
    text.write_text(f"# comment\nalloc 1 {5 * MiB}\nalloc x 100\n\nfree 1\nempty_cache\nfree x\n")
    assert load_trace(jsonl) == events
    assert load_trace(array) == events
    assert load_trace(text) == events


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ('{"op": "alloc", "id": 1, "size": -5}\n', "line 1.size"),
        ('{"op": "alloc", "id": 1}\n', "line 1.size"),
        ('{"op": "grow"}\n', "line 1.op"),
        ('{"op": "free", "id": true}\n', "line 1.id"),
        ("alloc 1 lots\n", "line 1.size"),
        ("free\n", "line 1"),
        ('[{"op": "alloc", "id": 1, "size": 1.5}]', "events[0].size"),
        ("{not json\n", "line 1"),
    ],
)
def test_bad_trace_lines_name_the_field(tmp_path: Path, content: str, field: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.field == field


def test_cli_prints_the_replay_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text(
        f"alloc 1 {12 * MiB}\nalloc 2 {12 * MiB}\nfree 1\nfree 2\nalloc 3 {24 * MiB}\n"
    )
    assert main([str(trace)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["peak_allocated"], out["peak_reserved"]) == (24 * MiB, 48 * MiB)
    assert out["slack_ratio"] == 2.0
    assert main([str(trace), "--expandable-segments"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_reserved"] == 40 * MiB
    assert main([str(trace), "--capacity-gib", str(40 / 1024)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["alloc_retries"], out["peak_reserved"], out["oom_at_event"]) == (1, 24 * MiB, None)
    assert replay(load_trace(trace)).peak_reserved == 48 * MiB


def test_cli_bad_input_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("free 9\n")
    assert main([str(trace)]) == 2
    assert "free 9" in capsys.readouterr().err
    trace.write_text("alloc 1 10\n")
    assert main([str(trace), "--max-split-size-mb", "4"]) == 2
    assert "max_split_size" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    assert "trace" in capsys.readouterr().err


def test_the_simulation_imports_without_torch() -> None:
    # probe/allocator*.py must stay copyable to a bare machine: torch only when recording starts
    import subprocess
    import sys

    code = (
        "import sys; import probe.allocator, probe.allocator_blocks, probe.allocator_events, "
        "probe.allocator_cli, "
        "probe.allocator_trace; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_gpu_check_traces_replay_and_the_check_needs_a_gpu() -> None:
    import torch

    from bench.allocator_gpu_check import builtin_traces
    from bench.allocator_gpu_check import main as gpu_main
    from probe.allocator import AllocatorConfig

    traces = builtin_traces()
    assert replay(traces["holes"]).peak_reserved == 48 * MiB  # as derived in test_allocator.py
    for events in traces.values():
        for cfg in (AllocatorConfig(), AllocatorConfig(expandable_segments=True)):
            res = replay(events, cfg)
            assert 0 < res.peak_allocated <= res.peak_reserved
    if not torch.cuda.is_available():
        assert gpu_main([]) == 2
