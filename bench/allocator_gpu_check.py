"""Check the allocator simulation against the real CUDA caching allocator (needs a GPU).

Each trace is replayed twice per setting: on the GPU, as `torch.empty(nbytes, dtype=uint8,
device="cuda")` / `del` in trace order in a fresh process with `PYTORCH_ALLOC_CONF` set (so the
allocator starts empty and reads the setting at start-up), and through `probe.allocator.replay`
with the same setting and the GPU's total memory. The peaks must agree to the byte.

    PYTHONPATH=. python -m bench.allocator_gpu_check [TRACE.jsonl ...] [--json out.json]

Without trace files the hand-made traces of tests/probe/test_allocator.py's kind are used
(`builtin_traces`); recorded traces come from `bench.allocator_replay --traces DIR`.
Exit code 0 when every peak agrees, 1 when one differs, 2 on bad input or without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from probe.allocator import AllocatorConfig, MiB, replay
from probe.allocator_events import Event, TraceError, alloc, dump_jsonl, free, load_trace

__all__ = ["builtin_traces", "main"]

SETTINGS = {"off": "expandable_segments:False", "on": "expandable_segments:True"}


def builtin_traces() -> dict[str, list[Event]]:
    """Small traces covering each rule (pools, segment sizes, splitting, merging, holes)."""
    return {
        "small_pool": [alloc(1, 1000), alloc(2, 100 << 10), alloc(3, 300 << 10), free(2)],
        "large_5mib": [alloc(1, 5 * MiB), alloc(2, 5 * MiB), free(1), alloc(3, 3 * MiB)],
        "large_30mib": [alloc(1, 30 * MiB), alloc(2, 30 * MiB + 1), alloc(3, 11 * MiB)],
        "holes": [alloc(1, 12 * MiB), alloc(2, 12 * MiB), free(1), free(2), alloc(3, 24 * MiB)],
        "coalesce": [alloc("a", 4 * MiB), alloc("b", 4 * MiB), free("a"), free("b")]
        + [alloc("c", 18 * MiB)],
        "mixed": [alloc(i, (i * 7919 * 4099) % (40 * MiB) + 1) for i in range(60)]
        + [free(i) for i in range(0, 60, 3)]
        + [alloc(100 + i, (i * 104729) % (24 * MiB) + 1) for i in range(40)],
    }


def _child(trace_path: str) -> int:
    """Run in the fresh process: replay on the GPU, print the peaks as JSON."""
    import torch

    live: dict[Any, Any] = {}
    for ev in load_trace(trace_path):
        if ev.op == "alloc":
            live[ev.id] = torch.empty(ev.size, dtype=torch.uint8, device="cuda")
        elif ev.op == "free":
            del live[ev.id]
        elif ev.op == "empty_cache":
            torch.cuda.empty_cache()
        elif ev.op == "reset_peak":
            torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    out = {
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "device_memory": torch.cuda.get_device_properties(0).total_memory,
        "torch": torch.__version__,
    }
    print(json.dumps(out))
    return 0


def _on_gpu(trace_path: Path, setting: str) -> dict[str, Any]:
    env = {**os.environ, "PYTORCH_ALLOC_CONF": setting, "PYTORCH_CUDA_ALLOC_CONF": setting}
    cmd = [sys.executable, "-m", "bench.allocator_gpu_check", "--child", str(trace_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"GPU replay of {trace_path} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _check(name: str, path: Path, rows: list[dict[str, Any]]) -> bool:
    events = load_trace(path)
    ok = True
    for mode, setting in SETTINGS.items():
        gpu = _on_gpu(path, setting)
        cfg = AllocatorConfig(expandable_segments=mode == "on", device_memory=gpu["device_memory"])
        sim = replay(events, cfg)
        same = (sim.peak_allocated, sim.peak_reserved) == (
            gpu["peak_allocated"],
            gpu["peak_reserved"],
        )
        ok &= same
        rows.append(
            {
                "trace": name,
                "expandable": mode,
                "gpu": gpu,
                "sim_peak_allocated": sim.peak_allocated,
                "sim_peak_reserved": sim.peak_reserved,
                "match": same,
            }
        )
        print(
            f"{name:>14} {mode:>3}  gpu {gpu['peak_allocated']:>13} {gpu['peak_reserved']:>13}"
            f"  sim {sim.peak_allocated:>13} {sim.peak_reserved:>13}  {'ok' if same else 'DIFF'}"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child)
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device; this check needs a GPU", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    ok = True
    print(f"{'trace':>14} exp  {'':>4}{'allocated':>13} {'reserved':>13}  (bytes)")
    try:
        if args.traces:
            for p in args.traces:
                ok &= _check(Path(p).stem, Path(p), rows)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                for name, events in builtin_traces().items():
                    path = Path(tmp) / f"{name}.jsonl"
                    dump_jsonl(events, path)
                    ok &= _check(name, path, rows)
    except (TraceError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
