"""Speed figures of issue 17, each on one line `name: value unit (what)`. Prints, asserts
nothing (targets live here, not in unit tests). Run from the repository root:

    OPENBLAS_NUM_THREADS=1 python bench/speed.py            # every figure
    python bench/speed.py --only estimate,cells1000         # some of them
    python bench/speed.py --quick                           # fewer repeats (tests use this)

Figures (the best of `--repeats` timings, as timeit; in-process figures in CPU seconds of this
process unless `--clock wall`):
- `estimate_one`: one `estimate_document()` for one preset, one length, one GPU option (memory,
  FLOPs, time, cost, verdict), the same request again and again (the spec cache is warm);
- `estimate_one_new_len`: the same with a different length each call (nothing memoised by
  length can help);
- `cells1000`: one request of 50 lengths x 20 GPU options = 1,000 cells;
- `sweep_*`: `estimator.sweep` — memory evaluations, verdicts, and full cells (memory + FLOPs +
  time + cost) per second, separately;
- `cli_help`, `cli_estimate`: wall seconds of `python -m trainfit --help` and of
  `trainfit estimate --model llama-3.1-8b --gpu h100-80gb` in a fresh interpreter;
- `rest_gc_full*`: the wall milliseconds of one full garbage collection in that service, with
  its start-up objects frozen (as it runs) and unfrozen;
- `rest_*`: in-process (fastapi TestClient) milliseconds of `/healthz` and `/v1/estimate` at 1
  and 100 cells, the same body again and again (a service that keeps its answers serves it
  from memory) and a new body every call (`_fresh`: computed, validated and encoded).
Works on older trees too (figures a tree cannot produce are printed as `n/a`), so the same
script measures before and after (`PYTHONPATH=<old tree> python bench/speed.py`).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

PRESET = "llama-3.1-8b"
ONE = {
    "model": {"preset": PRESET},
    "setup": {"method": "lora"},
    "seq_lens": [4096],
    "gpus": ["h100-80gb"],
}
CELLS_GPUS = [
    "a100-40gb",
    "a100-80gb",
    "h100-80gb",
    "h200",
    "b200",
    "l40s",
    "rtx-4090",
    "rtx-pro-6000",
    "2xa100-80gb",
    "2xh100-80gb",
    "2xh200",
    "4xa100-80gb",
    "4xh100-80gb",
    "4xh200",
    "8xa100-80gb",
    "8xh100-80gb",
    "8xh200",
    "8xb200",
    "16gib",
    "24gib",
]


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def _per_call(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """Best (as timeit) over `repeats` of the mean seconds per call over `calls` calls: the
    machine is shared, and the least disturbed repeat is the figure of the code. `--clock cpu`
    (default) counts this process's CPU seconds, which a busy machine inflates far less than
    wall seconds (on an idle core, single-threaded, the two agree); `--clock wall` the wall."""
    fn()
    times = []
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - start) / calls)
    return min(times)


def _print(name: str, value: float | None, unit: str, what: str) -> None:
    shown = "n/a" if value is None else f"{value:,.4g}"
    if unit in ("us", "ms"):
        unit += " CPU" if clock is CLOCKS["cpu"] else " wall"
    print(f"{name}: {shown} {unit} ({what})", flush=True)


def _gpus_known(options: list[str]) -> list[str]:
    from estimator.gpu_options import parse_gpu_options

    known = []
    for option in options:
        try:
            parse_gpu_options([option])
        except Exception:  # an older catalog without this card
            continue
        known.append(option)
    return known


def bench_estimate(quick: bool, repeats: int) -> None:
    from estimator.document import estimate_document
    from estimator.request import EstimateRequest

    req = EstimateRequest.model_validate(ONE)
    calls = 200 if quick else 2000
    t = _per_call(lambda: estimate_document(req), calls, repeats)
    _print("estimate_one", t * 1e6, "us", "1 preset x 1 length x 1 GPU, same request")
    lengths = iter(range(1024, 10**8, 7))
    reqs = [
        EstimateRequest.model_validate({**ONE, "seq_lens": [next(lengths)]})
        for _ in range(calls * (repeats + 1))
    ]
    it = iter(reqs)
    t = _per_call(lambda: estimate_document(next(it)), calls, repeats)
    _print("estimate_one_new_len", t * 1e6, "us", "a new length every call")


def bench_cells(quick: bool, repeats: int) -> None:
    from estimator.document import estimate_document
    from estimator.request import EstimateRequest

    gpus = _gpus_known(CELLS_GPUS)
    seqs = list(range(1024, 1024 * (1000 // len(gpus) + 1), 1024))[: 1000 // len(gpus)]
    req = EstimateRequest.model_validate({**ONE, "seq_lens": seqs, "gpus": gpus})
    cells = len(seqs) * len(gpus)
    t = _per_call(lambda: estimate_document(req), 3 if quick else 20, repeats)
    _print("cells1000", t * 1e3, "ms", f"{len(seqs)} lengths x {len(gpus)} GPU options = {cells}")
    _print("cells1000_per_cell", t / cells * 1e6, "us", "per cell of that request")


def bench_sweep(quick: bool, repeats: int) -> None:
    import numpy as np

    import gpu_catalog
    from estimator import sweep as sweep_module
    from estimator.model_source import resolve_model
    from estimator.profile import load_profile
    from estimator.request import ModelInput
    from estimator.setup import TrainingSetup

    spec = resolve_model(ModelInput(preset=PRESET))
    profile = load_profile("default")
    setup = TrainingSetup(method="lora")
    gpus = list(gpu_catalog.list_gpus())
    caps = np.array([g.capacity_bytes for g in gpus], dtype=np.float64)
    seqs = np.arange(256, 256 * (101 if quick else 1001), 256)
    batches = np.arange(1, 17)
    result: Any = None

    def memory_only() -> None:
        nonlocal result
        result = sweep_module.sweep(spec, setup, seqs, batches, caps, profile)

    t = _per_call(memory_only, 1 if quick else 5, repeats)
    mem_evals = seqs.size * batches.size
    _print(
        "sweep_memory", mem_evals / t / 1e6, "M memory evaluations/s", f"{mem_evals:,} (seq, batch)"
    )
    _print("sweep_verdicts", result.verdict.size / t / 1e6, "M verdicts/s", f"x {caps.size} GPUs")
    if not hasattr(sweep_module, "sweep_full"):
        _print("sweep_full", None, "M full cells/s", "no time/cost sweep in this tree")
        return
    options = [g.id for g in gpus]

    def full() -> None:
        nonlocal result
        result = sweep_module.sweep_full(spec, setup, seqs, batches, options, profile)

    t = _per_call(full, 1 if quick else 3, repeats)
    _print(
        "sweep_full",
        result.cells / t / 1e6,
        "M full cells/s",
        f"{result.cells:,} cells: memory + verdict + FLOPs + step time + tokens/s + USD",
    )


def _wall(cmd: list[str], repeats: int) -> tuple[float, float]:
    """Best wall seconds and best CPU seconds (user + system) of `cmd` after one warm-up run.
    The environment is the caller's less OPENBLAS_NUM_THREADS (the CLI must set it itself) and
    PYTHONDONTWRITEBYTECODE: an installed package has its bytecode compiled, so the warm-up
    writes it as an install would. CPU seconds move less than wall seconds on a busy machine."""
    drop = ("OPENBLAS_NUM_THREADS", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    walls, cpus = [], []
    for _ in range(repeats + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(walls[1:]), min(cpus[1:])


def bench_cli(quick: bool, repeats: int) -> None:
    py = [sys.executable, "-m", "trainfit"]
    for name, cmd, what in (
        ("cli_help", [*py, "--help"], "trainfit --help"),
        (
            "cli_estimate",
            [*py, "estimate", "--model", PRESET, "--gpu", "h100-80gb"],
            f"trainfit estimate --model {PRESET} --gpu h100-80gb",
        ),
        ("python_bare", [sys.executable, "-c", "pass"], "python -c pass"),
    ):
        wall, cpu = _wall(cmd, repeats)
        _print(name, wall, "s wall", what)
        _print(f"{name}_cpu", cpu, "s CPU", "user + system")


def bench_rest(quick: bool, repeats: int) -> None:
    from fastapi.testclient import TestClient

    from app.factory import create_app
    from app.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'bench.db'}", secret_key="bench-secret-key"
        )
        with TestClient(create_app(settings)) as client:
            calls = 30 if quick else 200
            health = _per_call(lambda: client.get("/healthz"), calls, repeats)
            _print("rest_healthz", health * 1e3, "ms", "GET /healthz")
            one = _per_call(lambda: client.post("/v1/estimate", json=ONE), calls, repeats)
            _print("rest_estimate_1", one * 1e3, "ms", "POST /v1/estimate, 1 cell")
            gpus = _gpus_known(CELLS_GPUS)[:10]
            body = {**ONE, "seq_lens": list(range(2048, 2048 * 11, 2048)), "gpus": gpus}
            r = client.post("/v1/estimate", json=body)
            assert r.status_code == 200, r.text
            hundred = _per_call(lambda: client.post("/v1/estimate", json=body), calls // 3, repeats)
            _print("rest_estimate_100", hundred * 1e3, "ms", "POST /v1/estimate, 10 x 10 cells")
            _print("rest_ratio_100", hundred / health, "x /healthz", "goal <= 2")
            # a body never sent before every call: no answer kept by the service can help
            shift = iter(range(1, 10**9))

            def fresh() -> Any:
                k = next(shift)
                lengths = [2048 * i + k for i in range(1, 11)]
                return client.post("/v1/estimate", json={**body, "seq_lens": lengths})

            cold = _per_call(fresh, calls // 3, repeats)
            _print("rest_estimate_100_fresh", cold * 1e3, "ms", "the same, a new body each call")
            _print("rest_ratio_100_fresh", cold / health, "x /healthz", "goal <= 2")
            frozen, walked = _full_collection_ms()
            _print("rest_gc_full", frozen, "ms wall", "one full gc.collect() as the service runs")
            _print("rest_gc_full_unfrozen", walked, "ms wall", "the same, start-up unfrozen")


def _full_collection_ms() -> tuple[float, float]:
    """Wall milliseconds of one full `gc.collect()` in the running service (the best of 3),
    with its start-up objects frozen (app/factory.py, the default) and with them unfrozen:
    the pause a request that triggers a full collection takes."""
    import gc

    def best() -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            gc.collect()
            times.append(time.perf_counter() - start)
        return min(times) * 1e3

    frozen = best()
    count = gc.get_freeze_count()
    gc.unfreeze()
    walked = best()
    if count:
        gc.freeze()
    return frozen, walked


BENCHES = {
    "estimate": bench_estimate,
    "cells1000": bench_cells,
    "sweep": bench_sweep,
    "cli": bench_cli,
    "rest": bench_rest,
}


GOALS = {  # figure -> the goal of issue 17 it measures (a figure <= the bound meets it)
    "estimate_one": ("<=", 50.0),
    "estimate_one_new_len": ("<=", 50.0),
    "cells1000": ("<=", 5.0),
    "sweep_full": (">=", 1.0),
    "cli_help": ("<=", 0.08),
    "cli_estimate": ("<=", 0.15),
    "rest_ratio_100": ("<=", 2.0),
    "rest_ratio_100_fresh": ("<=", 2.0),
}


def _run_tree(tree: str, args: argparse.Namespace) -> dict[str, tuple[float, str]]:
    """This script's figures on another tree (`PYTHONPATH=tree`), in a fresh process."""
    env = {**os.environ, "PYTHONPATH": tree}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--only", args.only]
    cmd += ["--clock", args.clock, "--repeats", str(args.repeats or 3)]
    cmd += ["--quick"] if args.quick else []
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True)
    figures = {}
    for line in out.stdout.splitlines():
        name, _, rest = line.partition(": ")
        value, _, unit = rest.partition(" ")
        if value != "n/a":
            figures[name] = (float(value.replace(",", "")), unit.split(" (")[0])
    return figures


def compare_trees(before: str, after: str, args: argparse.Namespace) -> int:
    """Each figure on both trees, alternated `--rounds` times (a shared, noisy machine: the
    two trees see the same load), median per tree; `before -> after` and the goal."""
    import statistics

    runs: dict[str, dict[str, list[float]]] = {before: {}, after: {}}
    units: dict[str, str] = {}
    for r in range(args.rounds):
        for tree in (before, after) if r % 2 == 0 else (after, before):
            for name, (value, unit) in _run_tree(tree, args).items():
                runs[tree].setdefault(name, []).append(value)
                units[name] = unit
    print(f"before = {before}, after = {after}; medians of {args.rounds} alternated runs")
    for name, unit in units.items():
        old, new = (statistics.median(runs[t].get(name) or [float("nan")]) for t in (before, after))
        goal = ""
        if name in GOALS:
            op, bound = GOALS[name]
            met = new <= bound if op == "<=" else new >= bound
            goal = f"  goal {op} {bound:g}: {'met' if met else 'not met'}"
        gain = new / old if "/s" in unit else old / new  # > 1: faster
        print(f"{name}: {old:,.4g} -> {new:,.4g} {unit} ({gain:.3g}x faster){goal}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated figures")
    parser.add_argument("--quick", action="store_true", help="few repeats (for tests)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="in-process clock")
    parser.add_argument(
        "--before", help="another tree (e.g. a `git worktree` of main): print before -> after"
    )
    parser.add_argument("--rounds", type=int, default=4, help="with --before: alternations")
    args = parser.parse_args(argv)
    if args.before:
        here = str(Path(__file__).resolve().parents[1])
        return compare_trees(str(Path(args.before).resolve()), here, args)
    global clock
    clock = CLOCKS[args.clock]
    repeats = args.repeats or (1 if args.quick else 5)
    for name in args.only.split(","):
        if name not in BENCHES:
            parser.error(f"--only: unknown figure {name!r}; known: {', '.join(BENCHES)}")
        BENCHES[name](args.quick, repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
