"""The speed scripts of bench/ run and print each of their figures (issue 17). Their timings are
never asserted here: they depend on the machine; the scripts print them for people to read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout


def _names(out: str) -> list[str]:
    return [line.split(":")[0] for line in out.splitlines() if ":" in line]


def test_speed_bench_prints_each_figure() -> None:
    out = _run("bench/speed.py", "--quick", "--only", "estimate,cells1000,sweep")
    names = _names(out)
    for field in (
        "estimate_one",
        "estimate_one_new_len",
        "cells1000",
        "sweep_memory",
        "sweep_verdicts",
        "sweep_full",
    ):
        assert field in names
    assert "n/a" not in out  # this tree has every figure


def test_peers_bench_runs_what_is_present_and_names_what_is_missing() -> None:
    out = _run("bench/peers.py", "--quick")
    names = _names(out)
    assert names[:2] == ["trainfit", "trainfit_memory"]
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import peers
    finally:
        sys.path.pop(0)
    for module in peers.MISSING_HOW:  # every peer has a line: its figure, missing or failed
        assert any(n == module or n.startswith(module) for n in names), module


def test_rest_breakdown_prints_the_parts_of_a_fresh_estimate() -> None:
    out = _run("bench/rest_breakdown.py", "--calls", "5")
    names = _names(out)
    for field in ("check", "estimate", "encode", "handler", "handler - parts", "ratio"):
        assert field in names
