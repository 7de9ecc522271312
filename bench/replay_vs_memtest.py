"""The probe's CUDA caching-allocator simulation against a memtest measured on a GPU.

Re-runs the memtest's own setup and sweep in one probe process on the CPU (`--device fake` by
default: shapes only, so an 8B model fits this machine), records the allocations through the
probe's tracker (`probe.allocator_trace.record_probe_tracker`: the runner's per-length
`empty_cache` + `reset_peak` marks, the gradient sums as CUDA does them), replays the trace through
`probe.allocator` with the card's total memory and the default settings (expandable segments
off), and prints each length's measured allocated and reserved peaks next to the simulated ones.
One process for the whole sweep, as the probe ran it on the GPU: the lengths share the
allocator's history (segments made by an earlier length are reused by a later one, and an
optimizer's states are placed in the first length's steps).

    PYTHONPATH=. python bench/replay_vs_memtest.py \
        tests/data/memtests/memtest_h200_2026-12-04_hf-llama-lora.json [--json rows.json]

Only setups the CPU can trace: not QLoRA (bitsandbytes quantises real weights), Liger or fla
kernels (CUDA only). Exit 2 for such a memtest or a bad file. CPU kernels stand in for CUDA's:
cuBLAS's workspaces (32 MiB per handle and stream on sm90, from torch's allocator) are missing
from the trace, so the simulated allocated peak is that much lower.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from probe.allocator import AllocatorConfig  # noqa: E402
from probe.simulated_reserved import per_length_peaks  # noqa: E402

__all__ = ["simulate", "main"]

GIB = 2**30


def simulate(doc: dict[str, Any], device: str = "fake") -> list[dict[str, Any]]:
    """Per length of the memtest: measured and simulated allocated and reserved peaks (bytes)."""
    from probe import runner
    from probe.allocator_trace import record_probe_tracker

    setup = {k: v for k, v in doc["setup"].items() if v is not None}
    lengths = [int(s) for s in doc["sweep"]]
    steps = max(int(r.get("steps") or 0) for r in doc["results"]) or 2
    with record_probe_tracker() as trace:
        ran = runner.run_probe(doc["model"]["config"], setup, lengths, steps=steps, device=device)
    config = AllocatorConfig(device_memory=int(doc["environment"]["total_memory_bytes"]))
    out = []
    peaks = per_length_peaks(trace.cuda_events(), len(lengths), config)
    for measured, traced, (allocated, reserved) in zip(
        doc["results"], ran["results"], peaks, strict=True
    ):
        out.append(
            {
                "seq_len": int(measured["seq_len"]),
                "status": measured["status"],
                "traced_status": traced["status"],
                "measured_allocated": measured.get("peak_allocated_bytes"),
                "simulated_allocated": allocated,
                "measured_reserved": measured.get("peak_reserved_bytes"),
                "simulated_reserved": reserved,
            }
        )
    return out


def _pct(simulated: int, measured: int | None) -> str:
    return "n/a" if not measured else f"{100 * (simulated - measured) / measured:+.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("memtest", help="a trainfit.memtest/1 file measured on a CUDA GPU")
    ap.add_argument("--device", choices=("cpu", "fake"), default="fake")
    ap.add_argument("--json", default=None, help="write the rows (bytes) to this file")
    args = ap.parse_args(argv)
    try:
        from memtest_schema import load_memtest

        doc = load_memtest(Path(args.memtest).read_bytes())
        if doc["environment"]["device"] != "cuda":
            raise ValueError("environment.device: the memtest was not measured on a CUDA GPU")
        if doc["setup"]["method"] == "qlora" or doc["setup"]["loss"] == "liger":
            raise ValueError("setup: QLoRA and Liger run on CUDA only; the CPU cannot trace them")
        rows = simulate(doc, args.device)
    except (OSError, ValueError, KeyError) as exc:
        print(f"replay_vs_memtest: {exc}", file=sys.stderr)
        return 2
    env = doc["environment"]
    where = f"{env['gpu_name']}, torch {env['torch']}"
    print(f"{args.memtest}: {where}; replayed from a {args.device} trace")
    print("seq status allocated_GiB simulated_GiB error_% reserved_GiB simulated_GiB error_%")
    for r in rows:
        cells = [str(r["seq_len"]), r["status"]]
        for kind in ("allocated", "reserved"):
            measured, simulated = r[f"measured_{kind}"], r[f"simulated_{kind}"]
            shown = "n/a" if measured is None else f"{measured / GIB:.2f}"
            cells += [shown, f"{simulated / GIB:.2f}", _pct(simulated, measured)]
        print(" ".join(cells))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
