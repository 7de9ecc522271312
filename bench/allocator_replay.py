"""Allocated vs simulated reserved peak of real CPU training steps, expandable_segments off/on.

For each sequence length: one probe run (`probe.runner.run_probe`, device `cpu`, or `fake` for
models too large for this machine: the model is built, then `--steps` training steps) is
recorded with `probe.allocator_trace` (through the probe's tracker, with the runner's
per-length empty_cache + peak reset, so the peaks are those of the steps), and the trace is
replayed through `probe.allocator` twice, with `expandable_segments` off and on. The table shows
the allocated peak (the probe's own storage tracker, and the replay's, which also covers model
building), the simulated `max_memory_reserved`, and the slack ratio reserved / allocated that
the estimator's `reserved_bytes` can cite.

    PYTHONPATH=. python -m bench.allocator_replay --config bench/configs/small-llama.json \\
        --seq 512,2048,8192 --steps 2 [--device fake] [--setup '{"checkpointing": "none"}']
        [--json out.json]
        [--traces DIR]

Caveat: a CPU trace has the ops of CPU kernels; CUDA kernels (cuBLAS workspaces, flash
attention) allocate a little differently. The slack depends on the size mix: tiny configs have
mostly sub-MiB tensors (small pool, 2 MiB segments), large models mostly large-pool tensors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from probe.allocator import AllocatorConfig, GiB, ReplayResult, replay
from probe.allocator_events import Event, dump_jsonl

__all__ = ["record_run", "compare", "main"]


def record_run(
    config: dict[str, Any],
    setup: dict[str, Any] | None,
    seq: int,
    steps: int,
    device: str = "cpu",
    recorder: str = "tracker",
) -> tuple[list[Event], int]:
    """Trace one probe run of one length; returns the events and the probe tracker's peak.

    `recorder="tracker"` (cpu or fake): through the probe's tracker (`record_probe_tracker`),
    with the runner's per-length `empty_cache` + `reset_peak` marks, so the replay's peaks are
    those of the measured length, as in a GPU memtest; the events are the trace as CUDA runs
    the step (`AllocationTrace.cuda_events`: the backward's out-of-place gradient sums and
    index_puts that only a dispatch mode causes done in place, probe/grad_sums.py).
    `recorder="dispatch"` (cpu only): the recorder's own dispatch mode around the whole run
    (build + steps, no marks), uncorrected (it has no tracker to find those ops).
    """
    from probe import runner
    from probe.allocator_trace import record_allocations, record_probe_tracker

    if recorder == "dispatch" and device != "cpu":
        raise ValueError("recorder: 'dispatch' sees real tensors only; use device 'cpu'")
    rec = record_allocations(device="cpu") if recorder == "dispatch" else record_probe_tracker()
    with rec as trace:
        doc = runner.run_probe(config, setup, [seq], steps=steps, device=device)
    result = doc["results"][0]
    if result["status"] != "ok":
        raise RuntimeError(f"seq {seq}: probe run {result['status']}: {result.get('error')}")
    return trace.cuda_events(), int(result["peak_allocated_bytes"])


def compare(events: list[Event], device_memory: int = 80 * GiB) -> dict[str, ReplayResult]:
    """Replay one trace with expandable segments off and on."""
    return {
        "off": replay(events, AllocatorConfig(device_memory=device_memory)),
        "on": replay(
            events, AllocatorConfig(expandable_segments=True, device_memory=device_memory)
        ),
    }


def _gib(n: int) -> str:
    return f"{n / GiB:.4f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="bench/configs/small-llama.json")
    ap.add_argument("--seq", default="512,2048,8192", help="comma-separated sequence lengths")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--device", choices=("cpu", "fake"), default="cpu")
    ap.add_argument("--setup", default=None, help="probe setup as JSON (default: probe defaults)")
    ap.add_argument("--json", default=None, help="write the figures (bytes) to this file")
    ap.add_argument("--traces", default=None, help="write each trace as JSONL into this folder")
    args = ap.parse_args(argv)
    try:
        config = json.loads(Path(args.config).read_text())
        setup = json.loads(args.setup) if args.setup else None
        lengths = [int(s) for s in args.seq.split(",") if s.strip()]
    except (OSError, ValueError) as exc:
        print(f"error: bad --config/--setup/--seq: {exc}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    head = (
        f"{'seq':>6} {'events':>7} {'tracker':>8} {'alloc':>8} {'res off':>8} {'x off':>6} "
        f"{'seg':>4} {'res on':>8} {'x on':>6} {'s':>5}"
    )
    print(f"{args.config} on {args.device}  (GiB; x = simulated reserved peak / allocated peak)")
    print(head)
    for seq in lengths:
        start = time.perf_counter()
        events, tracker_peak = record_run(config, setup, seq, args.steps, args.device)
        res = compare(events)
        took = time.perf_counter() - start
        off, on = res["off"], res["on"]
        print(
            f"{seq:>6} {len(events):>7} {_gib(tracker_peak):>8} {_gib(off.peak_allocated):>8} "
            f"{_gib(off.peak_reserved):>8} {off.slack_ratio:>6.3f} {off.peak_segments:>4} "
            f"{_gib(on.peak_reserved):>8} {on.slack_ratio:>6.3f} {took:>5.1f}"
        )
        rows.append(
            {
                "seq_len": seq,
                "events": len(events),
                "tracker_peak_allocated_bytes": tracker_peak,
                "expandable_off": off.to_json(),
                "expandable_on": on.to_json(),
            }
        )
        if args.traces:
            out_dir = Path(args.traces)
            out_dir.mkdir(parents=True, exist_ok=True)
            dump_jsonl(events, out_dir / f"{Path(args.config).stem}_seq{seq}.jsonl")
    if args.json:
        doc = {
            "config": args.config,
            "device": args.device,
            "setup": setup,
            "steps": args.steps,
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
