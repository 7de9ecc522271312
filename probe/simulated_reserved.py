"""`trainfit-probe --simulate-reserved`: the reserved peak a CPU or fake run would have on a GPU.

On the CPU and under fake tensors torch has no caching allocator, so a memtest's
`peak_reserved_bytes` is null there. With this option the run is recorded through the probe's
tracker (`probe.allocator_trace.record_probe_tracker`: one trace for the whole sweep, each
length marked where CUDA would empty the cache and reset the peak) and replayed through
`probe.allocator` (torch's caching allocator, expandable segments off, the default) once, as
one process would run the sweep, the peaks read per length. Each length's result gets
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

__all__ = ["per_length_peaks", "add_simulated_reserved", "NOTE"]

NOTE = (
    "simulated_reserved_bytes: this run's allocations replayed through probe/allocator.py "
    "(torch's CUDA caching allocator, expandable_segments off), length by length as one "
    "process; CUDA-only allocations (cuBLAS workspaces) are not in a CPU trace"
)


def per_length_peaks(
    events: list[Event], lengths: int, config: AllocatorConfig
) -> list[tuple[int, int]]:
    """(peak allocated, peak reserved) of each length, from one replay of the whole trace: a
    length runs from its `reset_peak` mark (the runner marks every length's start) to the
    next one's."""
    windows: list[tuple[int, int]] = []
    result = replay(events, config, windows=windows)
    if result.oom_at_event is not None:
        raise ValueError(f"the replay ran out of its capacity, {config.capacity:,} bytes")
    if len(windows) != lengths + 1:  # the stretch before the first mark builds the model
        raise ValueError(f"expected {lengths} length marks in the trace, found {len(windows) - 1}")
    return windows[1:]


def add_simulated_reserved(doc: dict[str, Any], events: list[Event]) -> None:
    """Set `simulated_reserved_bytes` on each measured (`ok`) length of `doc`, in place."""
    ran = [r for r in doc["results"] if r["status"] != "skipped"]  # each started with a mark
    # no capacity: the figure wanted is the reserved peak, not whether some card holds it
    peaks = per_length_peaks(events, len(ran), AllocatorConfig())
    for result, (_, reserved) in zip(ran, peaks, strict=True):
        if result["status"] == "ok":
            result["simulated_reserved_bytes"] = reserved
    doc.setdefault("notes", []).append(NOTE)
