"""One length's result in the memtest: the empty record, and the measurement filled in."""

from __future__ import annotations

from typing import Any

import torch

from probe.tracker import StorageTracker

__all__ = ["cuda_free_bytes", "device_memory", "is_oom", "new_result", "record_measurement"]


def cuda_free_bytes() -> tuple[int, int]:
    """(free, total) device bytes as the driver reports them (`torch.cuda.mem_get_info`)."""
    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


def device_memory(before: tuple[int, int]) -> dict[str, int]:
    """`results[i].device_memory`: free bytes before the length's first step and after its
    last (the CUDA context, workspaces and the allocator's reserve are in the difference)."""
    free_after, total = cuda_free_bytes()
    return {"total_bytes": total, "free_before_bytes": before[0], "free_after_bytes": free_after}


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def new_result(seq: int, batch: int, status: str, error: str | None = None) -> dict[str, Any]:
    return {
        "seq_len": seq,
        "batch": batch,
        "status": status,
        "steps": 0,
        "peak_allocated_bytes": None,
        "peak_reserved_bytes": None,
        "step_seconds": [],
        "tokens_per_second": None,
        "error": error,
        "components": None,
        "component_maxima": None,
        "host_bytes": None,
    }


def tokens_per_second(step_seconds: list[float], tokens_per_step: int) -> float | None:
    """Tokens per second over the timed steps; the first step is left out when there are
    others (it includes warm-up: allocator growth, optimizer state creation)."""
    if not step_seconds:
        return None
    timed = step_seconds[1:] or step_seconds
    mean = sum(timed) / len(timed)
    return round(tokens_per_step / mean, 3) if mean > 0 else None


def finish_result(
    res: dict[str, Any], failure: tuple[str, str] | None, device: str, tokens_per_step: int
) -> dict[str, Any]:
    """A stack's result after its steps: the failure's (status, error), else the throughput
    (none in fake mode, where steps take no real time)."""
    if failure is not None:
        res["status"], res["error"] = failure
    elif device != "fake":
        res["tokens_per_second"] = tokens_per_second(res["step_seconds"], tokens_per_step)
    return res


def record_measurement(
    res: dict[str, Any],
    device: str,
    tracker: StorageTracker | None,
    comps: dict[str, dict[str, int]] | None,
) -> None:
    """Peaks into `res`: torch's counters on CUDA, else the storage tracker's peak, host bytes
    and the components at the peak step (`comps`: `components` and `maxima`)."""
    if device == "cuda":
        res["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        res["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        return
    assert tracker is not None
    res["peak_allocated_bytes"] = int(tracker.peak)
    res["host_bytes"] = int(tracker.host_peak)
    if comps is not None:
        res["components"] = {k: int(v) for k, v in comps["components"].items()}
        res["component_maxima"] = {k: int(v) for k, v in comps["maxima"].items()}
