"""The estimator's reserved-memory rule vs the allocator simulation, per traced training step.

Each case is one probe run of a stack (`probe.run_probe`: transformers' Trainer + peft for the
`hf` stack, the probe's own loop for `probe`), fake tensors unless the case says `cpu` (QLoRA:
bitsandbytes quantises real weights), two optimizer steps. Its allocation/free sequence
(`probe.allocator_trace.record_probe_tracker`) is replayed through `probe.allocator`, the model
of torch's CUDACachingAllocator, with expandable segments off and on, on a card with room
(`max_memory_reserved`) and bisected for the least device memory the step runs in. Beside it,
the estimator (`estimator.memory.memory_breakdown`, default profile) for the same setup:
allocated, reserved and the terms of its rule (estimator/memory/reserved.py rounding +
fragmentation.py's cached-at-the-loss terms). Also one measured piece of each term: what the
replay holds cached when a step's loss makes its logits (a tokens x vocab bf16 request)
against the estimator's last-layer forward bound (fragmentation.py 3).

Nothing here is fitted: the estimator's rule is derived from the allocator's source; this
script prints how it compares with the simulation of the same source on real allocation
sequences.

    PYTHONPATH=. python bench/allocator_rule.py [--traces DIR] [--only NAME,...] [--no-need]
        [--json out.json]

`--traces DIR` keeps each trace (JSONL + the probe's setup) and reuses it on the next run.
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

from bench.allocator_slack import BASE, SEED_TARGETS, min_capacity  # noqa: E402
from probe.allocator import AllocatorConfig, CachingAllocatorSim, GiB, replay  # noqa: E402
from probe.allocator_events import Event, dump_jsonl, load_trace  # noqa: E402

ROOMY = 1024 * GiB


@dataclass
class Case:
    name: str
    model: str  # a preset name, or a config path relative to the repository
    setup: dict[str, Any]
    seq: int
    device: str = "fake"


CASES = [
    Case("tiny_full_none_2k", "tinyllama-1.1b", {"method": "full", "precision": "bf16",
         "checkpointing": "none"}, 2048),
    Case("tiny_full_gpu_4k", "tinyllama-1.1b", {"method": "full", "precision": "bf16"}, 4096),
    Case("tiny_lora_none_2k", "tinyllama-1.1b", {"method": "lora", "checkpointing": "none"}, 2048),
    Case("tiny_lora_gpu_8k", "tinyllama-1.1b", {"method": "lora"}, 8192),
    Case("tiny_probe_lora_offload_8k", "tinyllama-1.1b", {"method": "lora", "stack": "probe",
         "checkpointing": "offload"}, 8192),
    Case("small_qlora_gpu_cpu_1k", "bench/configs/small-llama.json", {"method": "qlora"}, 1024,
         "cpu"),
    Case("l8b_lora_gpu_4k", "llama-3.1-8b", {"method": "lora"}, 4096),
    Case("l8b_lora_none_2k", "llama-3.1-8b", {"method": "lora", "checkpointing": "none"}, 2048),
    Case("l8b_full_gpu_2k", "llama-3.1-8b", {"method": "full", "precision": "bf16"}, 2048),
    Case("seed_27b_lora_gpu_16k", "qwen3.5-27b", {"method": "lora", "lora_targets": SEED_TARGETS},
         16000),
    # where the recorded order differs from CUDA's (probe/grad_sums.py): a tied embedding's
    # gradient sum (GPT-2), a MoE's index_backward (the token gathers of Qwen3-MoE's experts)
    Case("gpt2_full_gpu_256", "gpt2", {"method": "full", "precision": "bf16"}, 256),
    Case("small_moe_full_none_1k", "bench/configs/small-qwen3-moe.json", {"method": "full",
         "precision": "bf16", "checkpointing": "none"}, 1024),
]  # fmt: skip


def model_config(case: Case) -> dict[str, Any]:
    path = ROOT / case.model if case.model.endswith(".json") else None
    path = path or ROOT / "estimator" / "presets" / f"{case.model}.json"
    config: dict[str, Any] = json.loads(path.read_text())
    return config


@dataclass
class Traced:
    events: list[Event]  # as CUDA runs the step (`AllocationTrace.cuda_events`)
    recorded: list[Event] | None  # as recorded under the dispatch mode (None: not kept)
    setup: dict[str, Any]
    seconds: float


def trace_case(case: Case, traces: Path | None) -> Traced:
    """The case's allocation trace, as recorded and as CUDA runs it (the backward's
    out-of-place gradient sums and index_puts done in place, `probe.grad_sums`), and the
    probe's resolved setup (from `traces` if kept)."""
    if traces is not None and (traces / f"{case.name}.jsonl").exists():
        meta = json.loads((traces / f"{case.name}.jsonl.setup.json").read_text())
        raw = traces / f"{case.name}.recorded.jsonl"
        recorded = load_trace(raw) if raw.exists() else None
        events = load_trace(traces / f"{case.name}.jsonl")
        return Traced(events, recorded, meta["setup"], float("nan"))
    from probe import run_probe
    from probe.allocator_trace import record_probe_tracker

    started = time.perf_counter()
    with record_probe_tracker() as trace, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = run_probe(
            model_config(case), {**BASE, **case.setup}, [case.seq], steps=2, device=case.device
        )
    seconds = time.perf_counter() - started
    res = doc["results"][0]
    if res["status"] != "ok":
        raise RuntimeError(f"{case.name}: probe run {res['status']}: {res.get('error')}")
    events = trace.cuda_events()
    if traces is not None:
        traces.mkdir(parents=True, exist_ok=True)
        dump_jsonl(events, traces / f"{case.name}.jsonl")
        dump_jsonl(trace.events, traces / f"{case.name}.recorded.jsonl")
        meta = {"model": case.model, "seq": case.seq, "setup": doc["setup"]}
        (traces / f"{case.name}.jsonl.setup.json").write_text(json.dumps(meta))
    return Traced(events, trace.events, doc["setup"], seconds)


def cached_at_logits(events: list[Event], size: int, expandable: bool) -> tuple[int, int] | None:
    """At the requests of exactly `size` bytes (a step's bf16 logits) after the first peak
    reset: (reserved - allocated at the first one, the most bytes cached in free blocks smaller
    than `size` - which no such request can use - at any of them); None if there is none."""
    sim = CachingAllocatorSim(AllocatorConfig(device_memory=ROOMY, expandable_segments=expandable))
    started = False
    first: int | None = None
    most = 0
    for ev in events:
        if ev.op == "alloc":
            if started and ev.size == size:
                if first is None:
                    first = sim.stats.reserved - sim.stats.allocated
                most = max(most, sum(b for b in sim.free_block_sizes() if b < size))
            sim.malloc(ev.id, ev.size)
        elif ev.op == "free":
            sim.free(ev.id)
        elif ev.op == "empty_cache":
            sim.empty_cache()
        elif ev.op == "reset_peak":
            sim.reset_peak()
            started = True
    return None if first is None else (first, most)


def estimator_terms(case: Case, setup: dict[str, Any]) -> dict[str, Any]:
    """The estimator's figures for the probe's resolved setup (default profile)."""
    import numpy as np

    from estimator.compare import setup_from_memtest
    from estimator.memory import memory_breakdown
    from estimator.memory.torchtitan import cpu_referee
    from estimator.model_source import resolve_model
    from estimator.profile import load_profile
    from estimator.request import ModelInput
    from estimator.stacks import load_stack

    spec = resolve_model(ModelInput(config=model_config(case)))
    ts = setup_from_memtest({"setup": setup})
    with cpu_referee():  # a CPU trace: no cuBLAS workspaces (estimator/memory/workspaces.py)
        mem = memory_breakdown(spec, ts, [case.seq], ts.batch, load_profile("default"))

    def one(x: Any) -> float:
        return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])

    loss = sum(one(v) for v in mem.phases["loss"].values()) if "loss" in mem.phases else 0.0
    return {
        "allocated": one(mem.allocated),
        "reserved": one(mem.reserved),
        "loss_phase": loss,
        "loss_hole": one(mem.loss_hole),
        "forward_cache": one(mem.forward_cache),
        "grad_cache": one(mem.grad_cache),
        "expandable_segments": load_stack(ts.stack).get("expandable_segments"),
        "vocab": spec.vocab,
        "tokens": case.seq * ts.batch,
    }


def run_case(case: Case, traces: Path | None, need: bool) -> dict[str, Any]:
    traced = trace_case(case, traces)
    events = traced.events
    est = estimator_terms(case, traced.setup)
    row: dict[str, Any] = {
        "case": case.name,
        "trace_seconds": traced.seconds,
        "events": len(events),
    }
    row["estimator"] = est
    if traced.recorded is not None:
        # the trace as recorded, before the in-place correction (for comparison)
        rec = {
            mode: replay(
                traced.recorded,
                AllocatorConfig(device_memory=ROOMY, expandable_segments=expandable),
            )
            for mode, expandable in (("off", False), ("on", True))
        }
        row["recorded"] = {
            "allocated": rec["off"].peak_allocated,
            "off": rec["off"].peak_reserved,
            "on": rec["on"].peak_reserved,
        }
    logits = est["tokens"] * est["vocab"] * 2  # the bf16 logits (autocast / bf16 runs)
    for mode, expandable in (("off", False), ("on", True)):
        r = replay(events, AllocatorConfig(device_memory=ROOMY, expandable_segments=expandable))
        out: dict[str, Any] = {
            "allocated": r.peak_allocated,
            "reserved": r.peak_reserved,
            "allocated_at_peak_reserved": r.allocated_at_peak_reserved,
        }
        cached = cached_at_logits(events, logits, expandable)
        out["cached_at_first_logits"] = None if cached is None else cached[0]
        out["small_blocks_at_logits"] = None if cached is None else cached[1]
        if need:
            out["need"] = min_capacity(events, expandable, r.peak_allocated, r.peak_reserved)
        row[mode] = out
    return row


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def _recorded(row: dict[str, Any]) -> str:
    rec = row.get("recorded")
    if rec is None:
        return f"{'-':>8}{'-':>8}"
    err = (row["estimator"]["reserved"] - rec["off"]) / rec["off"] * 100
    return f"{_g(rec['off']):>8}{err:>+7.1f}%"


def report(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'case':<27}{'alloc':>7}{'est':>7}{'res off':>8}{'need':>7}{'est res':>8}"
        f"{'err':>7}{'res on':>7}{'need':>7}{'c@L1':>7}{'small@L':>8}{'est F':>7}{'est G-K':>8}"
        f"{'rec res':>8}{'rec err':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        e, off, on = r["estimator"], r["off"], r["on"]
        err = (e["reserved"] - off["reserved"]) / off["reserved"] * 100
        lines.append(
            f"{r['case']:<27}{_g(off['allocated']):>7}{_g(e['allocated']):>7}"
            f"{_g(off['reserved']):>8}{_g(off.get('need')):>7}{_g(e['reserved']):>8}"
            f"{err:>+6.1f}%{_g(on['reserved']):>7}{_g(on.get('need')):>7}"
            f"{_g(off['cached_at_first_logits']):>7}{_g(off['small_blocks_at_logits']):>8}"
            f"{_g(e['forward_cache']):>7}{_g(e['grad_cache']):>8}{_recorded(r)}"
        )
    lines.append(
        "GiB. alloc / res off / res on: the replay's max_memory_allocated / max_memory_reserved on "
        "a card with room, expandable segments off / on; need: the least device memory the "
        "replay runs in (off / on); est / est res: the estimator's allocated / reserved (err: "
        "est res vs res off, the hf stack's setting); c@L1: reserved - allocated in the replay "
        "(off) when the first step's loss makes its logits; small@L: bytes in cached blocks "
        "smaller than the logits when a step's loss makes them (the larger step); "
        "est F: fragmentation.py (3), the last layer's forward bound; est G-K: (4), the last "
        "step's gradient blocks less the kept activations; rec res / rec err: res off and err "
        "for the trace as recorded under the dispatch mode, before the backward's out-of-place "
        "sums were done in place (probe/grad_sums.py). The probe stack counts no slack "
        "(the estimator before stacks)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--traces", help="keep / reuse the traces in this folder")
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--no-need", action="store_true", help="skip the least-memory bisection")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    names = {c.name for c in CASES}
    only = [n for n in (args.only or "").split(",") if n]
    bad = [n for n in only if n not in names]
    if bad:
        print(f"error: --only: unknown case(s) {bad}; known: {sorted(names)}", file=sys.stderr)
        return 2
    traces = Path(args.traces) if args.traces else None
    rows = []
    for case in CASES:
        if only and case.name not in only:
            continue
        rows.append(run_case(case, traces, not args.no_need))
        print(f"  {case.name}: done", file=sys.stderr)
    print(report(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
