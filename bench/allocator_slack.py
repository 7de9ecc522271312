"""The caching allocator's slack on traced Trainer steps of representative configs vs the estimator.

For each case the `hf` stack (transformers' Trainer + peft) runs a fake-tensor training step
(`probe.run_probe(device="fake")`, shapes only, so a 27 B model traces on this machine), its
allocation/free sequence is recorded (`probe.allocator_trace.record_probe_tracker`) and replayed
through the model of torch's CUDACachingAllocator (`probe.allocator`, rules read from
c10/cuda/CUDACachingAllocator.cpp: 512 B rounding, 2 MiB small-pool segments, 20 MiB large
segments for requests under 10 MiB, 2 MiB rounding above, best-fit splitting, expandable
segments). Printed per case: the simulated max_memory_allocated and max_memory_reserved with
expandable segments off and on, their slack, and the estimator's `reserved - allocated`
(estimator/memory/reserved.py) for the same setup, so the estimator's slack rule is checked
against the simulation of the allocator's rules (not against a measurement, and nothing is
fitted). Also the wall time of each traced run (the fake-mode cost of the real Trainer step).

    PYTHONPATH=. python bench/allocator_slack.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from probe.allocator import AllocatorConfig, GiB, replay  # noqa: E402

SEED_TARGETS = [
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "in_proj_qkv", "in_proj_z", "out_proj",
]  # fmt: skip


@dataclass
class Case:
    name: str
    preset: str
    setup: dict[str, Any]
    seq: int


CASES = [
    Case(
        "seed 000: qwen3.5-27b LoRA r16, ckpt, 16k",
        "qwen3.5-27b",
        {"method": "lora", "lora_rank": 16, "lora_targets": SEED_TARGETS},
        16000,
    ),
    Case("llama-3.1-8b LoRA r16 all-linear, ckpt, 4k", "llama-3.1-8b", {"method": "lora"}, 4096),
    Case(
        "llama-3.1-8b full bf16, ckpt, 2k",
        "llama-3.1-8b",
        {"method": "full", "precision": "bf16"},
        2048,
    ),
    Case(
        "tinyllama-1.1b full bf16, no ckpt, 2k",
        "tinyllama-1.1b",
        {"method": "full", "precision": "bf16", "checkpointing": "none"},
        2048,
    ),
    Case("tinyllama-1.1b LoRA r16, ckpt, 8k", "tinyllama-1.1b", {"method": "lora"}, 8192),
]
BASE = {"stack": "hf", "lora_rank": 16, "checkpointing": "gpu", "batch": 1}


def estimator_slack(config: dict[str, Any], setup: dict[str, Any], seq: int) -> dict[str, float]:
    """The estimator's allocated and reserved figures (default profile) for the probe's setup."""
    from estimator.compare import setup_from_memtest
    from estimator.memory import memory_breakdown
    from estimator.memory.torchtitan import cpu_referee
    from estimator.model_source import resolve_model
    from estimator.profile import load_profile
    from estimator.request import ModelInput

    spec = resolve_model(ModelInput(config=config))
    ts = setup_from_memtest({"setup": setup})
    with cpu_referee():  # a CPU trace: no cuBLAS workspaces (estimator/memory/workspaces.py)
        mem = memory_breakdown(spec, ts, [seq], ts.batch, load_profile("default"))
    return {"allocated": float(mem.allocated[0]), "reserved": float(mem.reserved[0])}


def min_capacity(events: list[Any], expandable: bool, low: int, high: int) -> int:
    """The smallest device memory (within 2 MiB) at which the trace replays without an OOM:
    the allocator frees its unused cached segments and retries before it raises (`malloc`:
    `release_available_cached_blocks`, `release_cached_blocks`), so this, not the
    max_memory_reserved of a roomy card, is what a run needs."""
    step = 2 * 2**20
    while high - low > step:
        mid = (low + high) // 2
        cfg = AllocatorConfig(
            capacity=mid, device_memory=max(high, 80 * GiB), expandable_segments=expandable
        )
        if replay(events, cfg).oom_at_event is None:
            high = mid
        else:
            low = mid
    return high


def run_case(case: Case, steps: int, traces: Path | None = None) -> dict[str, Any]:
    from probe import run_probe
    from probe.allocator_trace import record_probe_tracker

    config = json.loads((ROOT / "estimator" / "presets" / f"{case.preset}.json").read_text())
    started = time.perf_counter()
    with record_probe_tracker() as trace, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = run_probe(config, {**BASE, **case.setup}, [case.seq], steps=steps, device="fake")
    seconds = time.perf_counter() - started
    res = doc["results"][0]
    if res["status"] != "ok":
        return {"case": case.name, "status": res["status"], "error": res["error"]}
    events = trace.cuda_events()  # the backward's sums in place, as on CUDA (probe/grad_sums.py)
    off = replay(events, AllocatorConfig(device_memory=1024 * GiB))
    on = replay(events, AllocatorConfig(expandable_segments=True, device_memory=1024 * GiB))
    est = estimator_slack(config, doc["setup"], case.seq)
    if traces is not None:
        from probe.allocator_events import dump_jsonl

        traces.mkdir(parents=True, exist_ok=True)
        dump_jsonl(events, traces / f"{case.preset}_{case.setup['method']}_{case.seq}.jsonl")
    return {
        "case": case.name,
        "status": "ok",
        "trace_seconds": round(seconds, 1),
        "events": len(events),
        "tracker_peak": res["peak_allocated_bytes"],
        "sim_allocated": off.peak_allocated,
        "sim_reserved_off": off.peak_reserved,
        "sim_reserved_on": on.peak_reserved,
        "sim_small_pool_off": off.small_pool_reserved_at_peak,
        "min_capacity_off": min_capacity(events, False, off.peak_allocated, off.peak_reserved),
        "min_capacity_on": min_capacity(events, True, on.peak_allocated, on.peak_reserved),
        "estimator_allocated": est["allocated"],
        "estimator_reserved": est["reserved"],
        "setup": doc["setup"],
    }


def report(rows: list[dict[str, Any]]) -> str:
    g = GiB
    lines = [
        f"{'case':<44}{'trace s':>8}{'alloc':>8}{'res off':>9}{'slack off':>10}{'res on':>8}"
        f"{'slack on':>9}{'need off':>9}{'need on':>9}{'est slack':>10}",
        "-" * 124,
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['case']:<44}  {r['status']}: {r['error']}")
            continue
        slack_off = r["sim_reserved_off"] - r["sim_allocated"]
        slack_on = r["sim_reserved_on"] - r["sim_allocated"]
        est = r["estimator_reserved"] - r["estimator_allocated"]
        lines.append(
            f"{r['case']:<44}{r['trace_seconds']:>8.0f}{r['sim_allocated'] / g:>8.2f}"
            f"{r['sim_reserved_off'] / g:>9.2f}{slack_off / g:>10.3f}"
            f"{r['sim_reserved_on'] / g:>8.2f}{slack_on / g:>9.3f}"
            f"{(r['min_capacity_off'] - r['sim_allocated']) / g:>9.3f}"
            f"{(r['min_capacity_on'] - r['sim_allocated']) / g:>9.3f}{est / g:>10.3f}"
        )
    lines.append(
        "GiB. alloc / res: the simulated max_memory_allocated / max_memory_reserved of the "
        "traced step on a roomy card; slack = res - alloc; need = the smallest device memory "
        "the step replays in without OOM (cached segments are freed and the request retried "
        "first) - alloc; est slack: estimator reserved - allocated (hf stack: expandable off)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the two tinyllama cases only")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--traces", help="write each allocation trace (JSONL) into this folder")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if c.preset == "tinyllama-1.1b"] if args.quick else CASES
    rows = []
    for case in cases:
        rows.append(run_case(case, args.steps, Path(args.traces) if args.traces else None))
        print(f"  {case.name}: {rows[-1].get('trace_seconds', '-')} s", file=sys.stderr)
    print(report(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
