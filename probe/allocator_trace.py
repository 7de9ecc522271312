"""Record the allocation/free sequence of torch code as a trace for `probe.allocator`.

Two ways in, both logging `alloc <id> <nbytes>` the first time a tensor's untyped storage is
seen (views share it) and `free <id>` when a weakref finaliser on the storage fires (its memory
is released) - the counting of `probe.tracker.StorageTracker`, but with unrounded sizes and the
full event order instead of a running sum:

- `record_allocations()`: a context manager with its own `TorchDispatchMode`, around any torch
  code on real tensors (a CPU probe run, one training step). As an outer mode it also sees the
  ops an inner mode such as the probe's tracker forwards.
- `record_probe_tracker()`: for `FakeTensorMode` runs, where an outer mode sees nothing (the
  fake mode answers the ops itself; see probe-notes): while active, `probe.runner` builds its
  `StorageTracker` as a subclass that also logs every storage it counts, so a fake trace of a
  70 B model costs what the fake probe run costs. Offloaded copies (`mark_host`) leave the
  device, so they are logged as freed. Where the runner resets the tracker's peak (the start of
  each length, where on CUDA it empties the cache and resets the peak stats) the trace gets
  `empty_cache` and `reset_peak` events, so a replay gives per-length peaks like a GPU memtest.
  Works for `cpu` runs too.

Both recorders are dispatch modes, and under any dispatch mode autograd takes the out-of-place
paths written for tensor subclasses where CUDA's step runs in place (`probe.grad_sums`: gradient
sums into a tied weight's gradient, index_backward's `index_put`). The tracker already finds
those ops; the recording tracker logs them as {result: first operand} in `AllocationTrace.
in_place` (index_put always; a sum when its chain ends as a parameter's gradient, looked up when
the optimizer step starts or the components are classified), and `AllocationTrace.cuda_events()`
is the trace with them done in place (`probe.grad_sums.cuda_trace`): what the simulation should
replay. `events` keeps the order as recorded. `record_allocations` has no tracker and does not
correct its trace (its `cuda_events()` is its `events`).

What a trace cannot show: storages created outside the dispatcher (none in a plain training
step), memory that CUDA kernels would allocate but CPU kernels do not (cuBLAS workspaces,
fused-kernel temporaries) and vice versa, and cross-stream reuse delays.

torch is imported only when recording starts, so `probe.allocator` stays stdlib-only.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from probe.allocator_events import Event, EventId, alloc, free
from probe.grad_sums import cuda_trace

__all__ = ["AllocationTrace", "record_allocations", "record_probe_tracker"]


class AllocationTrace:
    """The events recorded so far; `events` is what `probe.allocator.replay` takes."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        # {result's id: first operand's id}: ops CUDA runs in place (see the module docstring)
        self.in_place: dict[EventId, EventId] = {}
        self.closed = False

    def cuda_events(self) -> list[Event]:
        """`events` with the `in_place` ops done in place, as a CUDA step runs them."""
        return cuda_trace(self.events, self.in_place)

    def append(self, event: Event) -> None:
        if not self.closed:
            self.events.append(event)

    def empty_cache(self) -> None:
        """Mark a `torch.cuda.empty_cache()` at this point of the trace."""
        self.append(Event("empty_cache"))

    def reset_peak(self) -> None:
        """Mark a `torch.cuda.reset_peak_memory_stats()` at this point of the trace."""
        self.append(Event("reset_peak"))


class _StorageLog:
    """Storage identity -> event id, with the finalisers that log the frees."""

    def __init__(self, trace: AllocationTrace, device: str | None) -> None:
        self.trace = trace
        self.device = device
        self._live: dict[int, int] = {}  # storage _cdata -> event id
        self._next_id = 0

    def track(self, tensor: Any) -> None:
        kind = tensor.device.type
        if kind == "meta" or (self.device is not None and kind != self.device):
            return
        from probe.tracker import new_storage

        storage = new_storage(tensor, self._live)
        if storage is None:
            return
        key = storage._cdata
        uid = self._next_id
        self._next_id += 1
        self._live[key] = uid
        weakref.finalize(storage, self.release, key, uid)
        self.trace.append(alloc(uid, int(storage.nbytes())))

    def release(self, key: int, uid: int | None = None) -> None:
        if key not in self._live or (uid is not None and self._live[key] != uid):
            return
        self.trace.append(free(self._live.pop(key)))

    def leave_device(self, tensor: Any) -> None:
        """The storage now counts as host memory (an offloaded copy): log it as freed."""
        self.track(tensor)
        self.release(tensor.untyped_storage()._cdata)


@functools.cache
def _recorder_class() -> type[Any]:
    from probe.tracker import OutputTensorsMode

    class AllocationRecorder(OutputTensorsMode):  # type: ignore[no-untyped-call]
        """Log storage creation and release of every op's outputs."""

        def __init__(self, log: _StorageLog) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.log = log

        def _track(self, tensor: Any) -> None:
            self.log.track(tensor)

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
    log = _StorageLog(trace, device)
    for t in adopt:
        if t is not None:
            log.track(t)
    try:
        with _recorder_class()(log):
            yield trace
    finally:
        trace.closed = True


def _recording_tracker_class(base: type[Any], log: _StorageLog) -> type[Any]:
    class RecordingTracker(base):  # type: ignore[misc]
        """The probe's tracker, also logging each storage it counts (see the module docstring):
        every op output and adopted weight passes through `_track`; the tracker's in-place-on-
        CUDA pairs go to the trace's `in_place`, in the log's ids."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._log_ids: dict[int, int] = {}  # tracker uid -> the log's event id
            self._adopted: list[weakref.ref[Any]] = []

        def _track(self, tensor: Any) -> None:
            try:
                key = tensor.untyped_storage()._cdata
            except (RuntimeError, NotImplementedError):
                key = None
            new = key is not None and key not in self._live
            try:
                super()._track(tensor)
            finally:
                log.track(tensor)
                if new and key in self._live and key in log._live:
                    self._log_ids[self._live[key][0]] = log._live[key]

        def adopt(self, tensors: Iterable[Any]) -> None:
            tensors = [t for t in tensors if t is not None]
            super().adopt(tensors)
            self._adopted.extend(weakref.ref(t) for t in tensors)

        def cuda_pairs(self, grad_uids: set[int]) -> dict[int, int]:
            pairs: dict[int, int] = super().cuda_pairs(grad_uids)
            ids = self._log_ids
            log.trace.in_place.update(
                {ids[r]: ids[o] for r, o in pairs.items() if r in ids and o in ids}
            )
            return pairs

        def mark_optimizer_step(self) -> None:
            # the backward is done and the gradients are alive: resolve the window's pairs
            # now, whether or not the stack classifies this step's peak
            super().mark_optimizer_step()
            alive = (ref() for ref in self._adopted)
            grads = self._uids(t.grad for t in alive if t is not None)
            self.cuda_pairs(grads | getattr(self, "_noted_grads", set()))

        def begin_window(self) -> None:
            self.cuda_pairs(set())  # index_put pairs need no gradients; sums are kept above
            super().begin_window()

        def mark_host(self, tensor: Any) -> None:
            super().mark_host(tensor)
            log.leave_device(tensor)

        def reset_peak(self) -> None:
            # the runner resets the tracker where, on CUDA, it calls empty_cache() and
            # reset_peak_memory_stats() (start of each length): mark both in the trace
            super().reset_peak()
            log.trace.empty_cache()
            log.trace.reset_peak()

    return RecordingTracker


@contextlib.contextmanager
def record_probe_tracker() -> Iterator[AllocationTrace]:
    """Record what the probe's `StorageTracker` counts during `probe.runner.run_probe` calls.

    Works for the `cpu` and `fake` devices (the tracker runs inside the fake mode). The patch of
    `probe.runner.StorageTracker` is undone when the block ends.
    """
    import probe.runner as runner

    base = getattr(runner, "StorageTracker", None)
    if base is None:
        raise RuntimeError("probe.runner has no StorageTracker to record from")
    trace = AllocationTrace()
    log = _StorageLog(trace, device=None)
    runner.StorageTracker = _recording_tracker_class(base, log)  # type: ignore[attr-defined]
    try:
        yield trace
    finally:
        runner.StorageTracker = base  # type: ignore[attr-defined]
        trace.closed = True
