"""bench/allocator_rule.py: the cached-at-the-loss measurement on hand-made traces, the report
and the bad-input exit."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
rule = pytest.importorskip("bench.allocator_rule")

from probe.allocator import GiB, MiB  # noqa: E402
from probe.allocator_events import Event, alloc, free  # noqa: E402


def test_cached_bytes_when_the_logits_are_requested_take_the_larger_step() -> None:
    # before the reset nothing counts. Step 1: w's 20 MiB segment keeps 16 MiB free and the
    # freed 30 MiB block is cached when the 100 MiB logits come: 46 MiB, all smaller. Step 2:
    # b is cut from the freed 100 MiB block and merges back, c takes the 30 MiB block: only
    # the 16 MiB are smaller than the logits (the 100 MiB block serves them)
    events = [alloc("w", 4 * MiB), Event("reset_peak")]
    events += [alloc("a", 30 * MiB), free("a"), alloc("l1", 100 * MiB), free("l1")]
    events += [alloc("b", 40 * MiB), free("b"), alloc("c", 30 * MiB), alloc("l2", 100 * MiB)]
    # reserved - allocated at step 1's logits: 20 + 30 - 4 MiB
    assert rule.cached_at_logits(events, 100 * MiB, False) == (46 * MiB, 46 * MiB)
    assert rule.cached_at_logits(events[:2], 100 * MiB, False) is None


def test_report_prints_one_line_per_case_with_the_error_against_the_replay() -> None:
    side = {"allocated": 10 * GiB, "reserved": 12 * GiB, "need": 11 * GiB}
    side |= {"cached_at_first_logits": GiB, "small_blocks_at_logits": GiB}
    est = {"allocated": 10 * GiB, "reserved": 12.6 * GiB, "forward_cache": GiB, "grad_cache": 0}
    text = rule.report([{"case": "x", "estimator": est, "off": side, "on": side}])
    line = text.splitlines()[2]
    assert line.startswith("x ") and "+5.0%" in line and "12.60" in line


def test_an_unknown_case_name_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert rule.main(["--only", "nope"]) == 2
    assert "--only" in capsys.readouterr().err


def test_report_shows_the_recorded_trace_beside_the_one_replayed_as_cuda_runs_it() -> None:
    # the recorded trace's out-of-place gradient sum reserves 1 GiB more than CUDA's order
    side = {"allocated": 10 * GiB, "reserved": 12 * GiB, "need": 11 * GiB}
    side |= {"cached_at_first_logits": GiB, "small_blocks_at_logits": GiB}
    est = {"allocated": 10 * GiB, "reserved": 12.6 * GiB, "forward_cache": GiB, "grad_cache": 0}
    rec = {"allocated": 11 * GiB, "off": 13 * GiB, "on": 13 * GiB}
    row = {"case": "x", "estimator": est, "off": side, "on": side, "recorded": rec}
    line = rule.report([row]).splitlines()[2]
    assert line.endswith("13.00   -3.1%"), line
    assert rule.report([{**row, "recorded": None}]).splitlines()[2].endswith("-       -")


def test_kept_traces_are_reused_with_the_recorded_order(tmp_path) -> None:
    import json

    from probe.allocator_events import dump_jsonl

    case = rule.Case("x", "gpt2", {}, 8)
    cuda = [alloc(1, 4 * MiB), free(1)]
    recorded = [alloc(1, 4 * MiB), alloc(2, 4 * MiB), free(1), free(2)]
    dump_jsonl(cuda, tmp_path / "x.jsonl")
    (tmp_path / "x.jsonl.setup.json").write_text(json.dumps({"setup": {"method": "full"}}))
    assert rule.trace_case(case, tmp_path).recorded is None
    dump_jsonl(recorded, tmp_path / "x.recorded.jsonl")
    traced = rule.trace_case(case, tmp_path)
    assert (traced.events, traced.recorded, traced.setup) == (cuda, recorded, {"method": "full"})
