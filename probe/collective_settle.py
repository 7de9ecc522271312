"""Release a gloo collective's tensors on the calling thread, where NCCL releases them.

Under gloo a collective runs on one of the process group's worker threads. The worker keeps its
own reference to the `AsyncWork` (and through it to the collective's input and output tensors)
in `workInProgress_` until the op has run (torch 2.13.0
torch/csrc/distributed/c10d/ProcessGroupGloo.hpp:485-492); the caller's `wait()` returns when
the work's future completes, which can be before the worker drops that reference. A
synchronous c10d call (distributed_c10d.py: `all_gather_single` :4387-4394,
`reduce_scatter_single` :4936-4943: issue, `work.wait()`, return) then returns with the tensors
still referenced from the worker thread, and when the caller drops them (FSDP2's all-gather
output after its copy-out, say) their blocks stay alive until the worker gets to them: tens of
microseconds, or milliseconds on a loaded machine, during which the next layer's buffers are
already allocated. The CPU referee's counter sees that overlap; a GPU does not: NCCL's
`WorkNCCL` releases what it stashed for allocator safety when the user's stream syncs with the
collective, on the user's thread (ProcessGroupNCCL.hpp:485-495), and FSDP2 frees its buffers
in program order.

`settled_collectives()` puts a wrapper in front of the c10d collectives for the time of a
measurement: after a synchronous call returns, it waits (bounded by `timeout_s`) until every
tensor the call was given is referenced no more than before the call, i.e. until the worker
has dropped its reference, so that the caller's later frees happen on the caller's thread in
program order, as on CUDA. It changes no byte the collective allocates and no value it
computes; it only orders the release. The statistics (`SettleStats`) say how often the worker
was late and for how long the caller waited. Asynchronous calls (`async_op=True`) return their
`Work` untouched and are only counted: the caller holds that `Work`, and through it the tensors,
on every backend. Functional collectives (`torch.distributed._functional_collectives`:
torchtitan's loss and token-count all-reduces of a few scalars) are not wrapped.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["WRAPPED", "SettleStats", "settled_collectives"]

# The tensor collectives of torch.distributed (2.13.0) that FSDP2, DDP and torchtitan call.
WRAPPED = (
    "all_gather_single",
    "reduce_scatter_single",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all_single",
)


@dataclass
class SettleStats:
    """ops: synchronous collectives wrapped; late: those whose tensors the worker still held
    when the call returned; wait_us: the caller's total wait for them; timeouts: waits cut
    off at `timeout_s` (the tensors were then left as they were); async_ops: asynchronous
    calls, counted only."""

    ops: int = 0
    late: int = 0
    wait_us: float = 0.0
    timeouts: int = 0
    async_ops: int = 0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["wait_us"] = round(self.wait_us, 1)
        return out


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _settle(
    tensors: list[torch.Tensor], before: list[int], stats: SettleStats, timeout_s: float
) -> None:
    """Wait until no tensor is referenced more than before the call."""

    def held() -> bool:
        return any(t._use_count() > n for t, n in zip(tensors, before, strict=True))  # type: ignore[attr-defined]

    if not held():
        return
    stats.late += 1
    started = time.perf_counter()
    spins = 0
    while held():
        if time.perf_counter() - started > timeout_s:
            stats.timeouts += 1
            break
        spins += 1
        time.sleep(0 if spins < 100 else 20e-6)  # let the worker thread run
    stats.wait_us += (time.perf_counter() - started) * 1e6


def _wrapper(
    original: Callable[..., Any], stats: SettleStats, timeout_s: float, local: threading.local
) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def settled(*args: Any, **kwargs: Any) -> Any:
        if getattr(local, "depth", 0):  # a wrapped collective calling another (deprecated names)
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("async_op", False):
            stats.async_ops += 1
            return original(*args, **kwargs)
        tensors = [t for value in bound.arguments.values() for t in _tensors(value)]
        before = [t._use_count() for t in tensors]  # type: ignore[attr-defined]
        local.depth = 1
        try:
            result = original(*args, **kwargs)
        finally:
            local.depth = 0
        stats.ops += 1
        _settle(tensors, before, stats, timeout_s)
        return result

    settled.__wrapped__ = original  # type: ignore[attr-defined]
    return settled


@contextlib.contextmanager
def settled_collectives(timeout_s: float = 2.0) -> Iterator[SettleStats]:
    """Wrap torch.distributed's tensor collectives (module docstring) while inside; yields
    the running statistics."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    stats = SettleStats()
    local = threading.local()
    saved: list[tuple[Any, str, Any]] = []
    for name in WRAPPED:
        original = getattr(distributed_c10d, name, None)
        if original is None:
            continue
        wrapped = _wrapper(original, stats, timeout_s, local)
        for module in (dist, distributed_c10d):
            if getattr(module, name, None) is original:
                saved.append((module, name, original))
                setattr(module, name, wrapped)
    try:
        yield stats
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
