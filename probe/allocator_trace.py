"""Record the allocation/free sequence of torch code as a trace for `probe.allocator`.

`record_allocations()` is a context manager around any torch code (a probe run, one training
step): a `TorchDispatchMode` looks at every tensor an op returns, logs `alloc <id> <nbytes>` the
first time it sees a storage, and `free <id>` when a weakref finaliser on the storage fires (the
storage's memory is released). Same counting as `probe.tracker.StorageTracker` (one event per
untyped storage; views share it), but unrounded sizes and the full event order instead of a
running sum, and independent of it, so the two can run together. As an outer mode it also sees
the ops the tracker forwards (the tracker must then be the inner mode, as in `run_probe`).

What the trace cannot show: storages created outside the dispatcher (none in a plain training
step), memory that CUDA kernels would allocate but CPU kernels do not (cuBLAS workspaces,
fused-kernel temporaries) and vice versa, and cross-stream reuse delays. Under `FakeTensorMode`
entered *inside* the recorder nothing is seen (the fake mode answers the ops itself).

torch is imported only when recording starts, so `probe.allocator` stays stdlib-only.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from probe.allocator_events import Event, alloc, free

__all__ = ["AllocationTrace", "record_allocations"]


class AllocationTrace:
    """The events recorded so far; `events` is what `probe.allocator.replay` takes."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.closed = False

    def append(self, event: Event) -> None:
        if not self.closed:
            self.events.append(event)

    def empty_cache(self) -> None:
        """Mark a `torch.cuda.empty_cache()` at this point of the trace."""
        self.append(Event("empty_cache"))

    def reset_peak(self) -> None:
        """Mark a `torch.cuda.reset_peak_memory_stats()` at this point of the trace."""
        self.append(Event("reset_peak"))


@functools.cache
def _recorder_class() -> type[Any]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class AllocationRecorder(TorchDispatchMode):  # type: ignore[misc]
        """Log storage creation and release (see the module docstring)."""

        def __init__(self, trace: AllocationTrace, device: str | None) -> None:
            super().__init__()
            self.trace = trace
            self.device = device
            self._live: dict[int, int] = {}  # storage _cdata -> event id
            self._next_id = 0

        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.track(leaf)
            return out

        def track(self, tensor: torch.Tensor) -> None:
            kind = tensor.device.type
            if kind == "meta" or (self.device is not None and kind != self.device):
                return
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):
                return  # sparse or other storage-less tensors
            key = storage._cdata
            if key in self._live:
                return
            uid = self._next_id
            self._next_id += 1
            self._live[key] = uid
            weakref.finalize(storage, self._release, key, uid)
            self.trace.append(alloc(uid, int(storage.nbytes())))

        def _release(self, key: int, uid: int) -> None:
            if self._live.get(key) != uid:
                return
            del self._live[key]
            self.trace.append(free(uid))

    return AllocationRecorder


@contextlib.contextmanager
def record_allocations(
    adopt: Iterable[Any] = (), device: str | None = None
) -> Iterator[AllocationTrace]:
    """Record allocations and frees of the code in the `with` block.

    `adopt`: tensors that exist already (e.g. a model's weights) and should count as allocated
    at the start. `device`: only storages on this device type (`"cuda"`, `"cpu"`); default all
    but meta. Events after the block ends are not recorded.
    """
    trace = AllocationTrace()
    recorder = _recorder_class()(trace, device)
    for t in adopt:
        if t is not None:
            recorder.track(t)
    try:
        with recorder:
            yield trace
    finally:
        trace.closed = True
