"""`trainfit-probe --simulate-reserved`: the reserved peak a CPU or fake run would have on a GPU.

On the CPU and under fake tensors torch has no caching allocator, so a memtest's
`peak_reserved_bytes` is null there. With this option the run is recorded through the probe's
tracker (`probe.allocator_trace.record_probe_tracker`: one trace for the whole sweep, each
length marked where CUDA would empty the cache and reset the peak) and replayed through
`probe.allocator` (torch's caching allocator, expandable segments off, the default), length by
length, as one process would run the sweep. Each length's result gets
`simulated_reserved_bytes`, the replay's reserved peak for that length.

Checked against a GPU: `bench/replay_vs_memtest.py` replays the H200 memtests of
tests/data/memtests/ this way within 0.09 % (full fine-tuning) and 0.25 % (Trainer LoRA) of the
reserved peaks torch measured. What a CPU trace cannot hold (cuBLAS's 32 MiB workspaces per
handle and stream on sm90, fused CUDA kernels' temporaries) is missing from it.
"""

from __future__ import annotations

from typing import Any

from probe.allocator import AllocatorConfig, replay
from probe.allocator_events import Event

__all__ = ["per_length_prefixes", "add_simulated_reserved", "NOTE", "SIMULATED_DEVICE_MEMORY"]

# No simulated out-of-memory: the figure wanted is the reserved peak, not whether some card
# holds it (a replay that runs out of memory stops, and its peak would be the card's size).
SIMULATED_DEVICE_MEMORY = 2**50

NOTE = (
    "simulated_reserved_bytes: this run's allocations replayed through probe/allocator.py "
    "(torch's CUDA caching allocator, expandable_segments off), length by length as one "
    "process; CUDA-only allocations (cuBLAS workspaces) are not in a CPU trace"
)


def per_length_prefixes(events: list[Event], lengths: int) -> list[list[Event]]:
    """The trace up to the end of each length: a length ends where the next one's
    `empty_cache` mark starts it (the runner marks every length's start)."""
    starts = [i for i, ev in enumerate(events) if ev.op == "empty_cache"]
    if len(starts) != lengths:
        raise ValueError(f"expected {lengths} length marks in the trace, found {len(starts)}")
    ends = [*starts[1:], len(events)]
    return [events[:end] for end in ends]


def add_simulated_reserved(doc: dict[str, Any], events: list[Event]) -> None:
    """Set `simulated_reserved_bytes` on each measured (`ok`) length of `doc`, in place."""
    ran = [r for r in doc["results"] if r["status"] != "skipped"]  # each started with a mark
    config = AllocatorConfig(device_memory=SIMULATED_DEVICE_MEMORY)
    for result, prefix in zip(ran, per_length_prefixes(events, len(ran)), strict=True):
        if result["status"] == "ok":
            result["simulated_reserved_bytes"] = replay(prefix, config).peak_reserved
    doc.setdefault("notes", []).append(NOTE)
