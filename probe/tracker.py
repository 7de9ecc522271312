"""Counting device memory on the CPU and under fake tensors, storage by storage.

`StorageTracker` is a `TorchDispatchMode`: every tensor an op returns is looked at, each untyped
storage not seen before is counted once, its size rounded up to 512 bytes (the CUDA caching
allocator's block granularity), and subtracted when a weakref finaliser on the storage fires.
The running sum's maximum is the peak; for real CPU tensors it equals what the CUDA allocator's
`max_memory_allocated` would report for the same ops, for fake tensors it is the same count with
no memory used at all (see /work/shared/probe-notes.md for the cross-checks).

Classification at the peak: the tracker keeps a log of allocations and frees per window (one
training step); `components_at_peak` replays it up to the peak and sorts the storages alive
then into params / grads / optimizer state / activations (everything else: saved tensors,
temporaries, logits).

The tracker is a dispatch mode, and while any dispatch mode is active the autograd engine sums a
tensor's gradient contributions out of place, where a CUDA step adds them in place
(`probe.grad_sums`); the classification replays the log as CUDA runs those sums when they end
as a parameter's gradient (a tied embedding's), so the first contribution counts as a gradient.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from probe.grad_sums import cuda_events, first_contributions

__all__ = ["OutputTensorsMode", "StorageTracker", "TrackerOOM", "current_tracker", "GRANULARITY"]

GRANULARITY = 512  # bytes; the CUDA caching allocator rounds every block up to this

# out-of-place ops the backward takes only for tensor subclasses (probe/grad_sums.py)
_IN_PLACE_ON_CUDA = (torch.ops.aten.add.Tensor, torch.ops.aten.index_put.default)

_ACTIVE: list[StorageTracker] = []


def current_tracker() -> StorageTracker | None:
    """The innermost active tracker (used by the offload hooks to mark host copies)."""
    return _ACTIVE[-1] if _ACTIVE else None


class TrackerOOM(torch.OutOfMemoryError):
    """Raised by the tracker when its `cap` is exceeded (an injected out-of-memory)."""


def new_storage(tensor: torch.Tensor, live: Iterable[int] | dict[int, Any]) -> Any:
    """The tensor's untyped storage when its key (`_cdata`) is not in `live`, else None
    (views share a storage; sparse and other storage-less tensors have none)."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return None if storage._cdata in live else storage


def _round_up(nbytes: int) -> int:
    return -(-nbytes // GRANULARITY) * GRANULARITY


# Ops whose appearance tells which attention kernel ran (recorded in the memtest environment).
ATTENTION_OPS = {
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa:flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention": "sdpa:flash_attention",
    "_scaled_dot_product_efficient_attention": "sdpa:efficient_attention",
    "_scaled_dot_product_cudnn_attention": "sdpa:cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable": "sdpa:fused_attention",
    "_flash_attention_forward": "flash_attention",
    "_efficient_attention_forward": "efficient_attention",
}


def attention_kernel(func: Any) -> str | None:
    """The attention kernel an op's appearance tells (`ATTENTION_OPS`), or None."""
    return ATTENTION_OPS.get(getattr(func, "__name__", "").split(".")[0])


class OutputTensorsMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A dispatch mode that runs each op and shows every tensor it returns to `_track`."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        self._seen_op(func)
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        self._seen_call(func, args, out)
        return out

    def _seen_op(self, func: Any) -> None:
        """Called once per op, after it ran."""

    def _seen_call(self, func: Any, args: tuple[Any, ...], out: Any) -> None:
        """Called once per op, after its outputs were tracked."""

    def _track(self, tensor: torch.Tensor) -> None:
        raise NotImplementedError


class StorageTracker(OutputTensorsMode):  # type: ignore[no-untyped-call]
    """Count live storages created by ops; raise `TrackerOOM` above `cap` bytes."""

    def __init__(self, cap: int | None = None, vocab: int | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.cap = cap
        self.vocab = vocab  # storages whose tensor's last dimension is this count as logits
        self._logit_uids: set[int] = set()
        self._live: dict[int, tuple[int, int]] = {}  # storage _cdata -> (uid, rounded bytes)
        self._host: set[int] = set()  # uids of storages that are host (offloaded) copies
        self._next_uid = 0
        self.current = 0
        self.peak = 0
        self.host_current = 0
        self.host_peak = 0
        self.largest_allocation = 0
        self.kernels: set[str] = set()
        # per-window log, for the classification at the peak
        self._baseline: dict[int, int] = {}
        self._events: list[tuple[int, int]] = []
        self._window_peak = 0
        self._window_peak_index = 0
        self._window_host_at_peak = 0
        self._step_mark: int | None = None  # event index where the optimizer step began
        # the backward's out-of-place ops that CUDA runs in place (probe/grad_sums.py),
        # {result's uid: first operand's uid}: gradient sums, index_put of index_backward
        self._sums: dict[int, int] = {}
        self._in_place: dict[int, int] = {}
        # gradients seen by `note_gradient` in this window (freed before the classification)
        self._noted_grads: set[int] = set()

    # -- dispatch -------------------------------------------------------------------------

    def _seen_op(self, func: Any) -> None:
        kernel = attention_kernel(func)
        if kernel is not None:
            self.kernels.add(kernel)

    def _seen_call(self, func: Any, args: tuple[Any, ...], out: Any) -> None:
        """Record the backward's ops that CUDA runs in place (`probe.grad_sums`): while the
        autograd engine runs with grad mode off, an `add.Tensor` of two tensors shaped as its
        output (a gradient sum) or an `index_put` (index_backward), whose first operand is a
        whole storage of the output's size (what the in-place op writes into)."""
        if func not in _IN_PLACE_ON_CUDA or torch._C._current_graph_task_id() == -1:
            return
        if torch.is_grad_enabled() or len(args) < 2 or not isinstance(out, torch.Tensor):
            return
        first = args[0]
        if not isinstance(first, torch.Tensor) or first.shape != out.shape:
            return
        if (
            first.dtype != out.dtype
            or first.untyped_storage().nbytes() != out.untyped_storage().nbytes()
        ):
            return
        if func is torch.ops.aten.add.Tensor:
            second = args[1]
            if not isinstance(second, torch.Tensor) or second.shape != out.shape:
                return
        uid_out = self._live.get(out.untyped_storage()._cdata, (None, 0))[0]
        uid_first = self._live.get(first.untyped_storage()._cdata, (None, 0))[0]
        if uid_out is None or uid_first is None or uid_out == uid_first:
            return
        if func is torch.ops.aten.add.Tensor:
            self._sums[uid_out] = uid_first
        else:
            self._in_place[uid_out] = uid_first

    def __enter__(self) -> StorageTracker:
        _ACTIVE.append(self)
        entered: StorageTracker = super().__enter__()  # type: ignore[no-untyped-call]
        return entered

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self)
        super().__exit__(*exc)  # type: ignore[no-untyped-call]

    # -- accounting -----------------------------------------------------------------------

    def _track(self, tensor: torch.Tensor) -> None:
        storage = new_storage(tensor, self._live)
        if storage is None:
            return
        key = storage._cdata
        nbytes = _round_up(storage.nbytes())
        uid = self._next_uid
        self._next_uid += 1
        self._live[key] = (uid, nbytes)
        if self.vocab and tensor.dim() >= 2 and tensor.shape[-1] == self.vocab:
            self._logit_uids.add(uid)
        weakref.finalize(storage, self._free, key, uid)
        self.current += nbytes
        self.largest_allocation = max(self.largest_allocation, nbytes)
        self._events.append((uid, nbytes))
        self._note_peak()
        if self.cap is not None and self.current > self.cap:
            raise TrackerOOM(
                f"out of memory (injected): {self.current} bytes in use > cap of {self.cap}"
            )

    def _note_peak(self) -> None:
        """After bytes were added: the step's peak and the window's (with where in the event
        list it happened and the host bytes then)."""
        if self.current > self.peak:
            self.peak = self.current
        if self.current > self._window_peak:
            self._window_peak = self.current
            self._window_peak_index = len(self._events)
            self._window_host_at_peak = self.host_current

    def _free(self, key: int, uid: int) -> None:
        entry = self._live.get(key)
        if entry is None or entry[0] != uid:
            return
        del self._live[key]
        if uid in self._host:
            self._host.discard(uid)
            self.host_current -= entry[1]
            return
        self.current -= entry[1]
        self._events.append((uid, -entry[1]))

    def adopt(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors created before the tracker was entered (the model's weights)."""
        for t in tensors:
            if t is not None:
                self._track(t)

    def mark_host(self, tensor: torch.Tensor) -> None:
        """Move a tracked storage from device bytes to host bytes (an offloaded copy)."""
        self._track(tensor)
        uid, nbytes = self._live[tensor.untyped_storage()._cdata]
        if uid in self._host:
            return
        self._host.add(uid)
        self.current -= nbytes
        self._events.append((uid, -nbytes))
        self.host_current += nbytes
        self.host_peak = max(self.host_peak, self.host_current)

    def reset_peak(self) -> None:
        """Start a new peak measurement at the current level (like reset_peak_memory_stats)."""
        self.peak = self.current
        self.host_peak = self.host_current

    # -- windows and classification ------------------------------------------------------

    def begin_window(self) -> None:
        """Start logging for one step (the classification covers the peak inside the window)."""
        self._baseline = {uid: n for uid, n in self._live.values() if uid not in self._host}
        self._logit_uids &= set(self._baseline)
        self._events = []
        self._step_mark = None
        self._sums = {}
        self._in_place = {}
        self._noted_grads = set()
        self._window_peak = self.current
        self._window_peak_index = 0
        self._window_host_at_peak = self.host_current

    def note_gradient(self, tensor: torch.Tensor) -> None:
        """`tensor` is a parameter's gradient: classify its storage as one even when it is freed
        before the classification (an optimizer stepped in the backward sets `.grad = None`
        right after the gradient is made)."""
        self._noted_grads |= self._uids([tensor])

    def mark_optimizer_step(self) -> None:
        """The optimizer step starts here: temporaries made from now on are `optimizer_step`
        in `component_maxima`, not activations."""
        self._step_mark = len(self._events)

    @property
    def window_peak(self) -> int:
        """Highest device bytes seen since `begin_window`."""
        return self._window_peak

    def cuda_pairs(self, grad_uids: set[int]) -> dict[int, int]:
        """This window's out-of-place ops that CUDA runs in place (`probe.grad_sums`),
        {result's uid: first operand's uid}: every index_put of index_backward, and the
        gradient sums on chains that end as one of `grad_uids`."""
        return {**self._in_place, **first_contributions(self._sums, grad_uids)}

    def _cuda_log(self, grad_uids: set[int]) -> tuple[list[tuple[int, int]], set[int]]:
        """This window's log with the backward's in-place ops done in place as on CUDA
        (`probe.grad_sums`), and the first contributions that are gradients from their start."""
        sums = first_contributions(self._sums, grad_uids)
        firsts = {uid for uid in sums.values() if uid not in sums}
        return cuda_events(self._events, self.cuda_pairs(grad_uids)), firsts

    def _live_at_window_peak(self, events: list[tuple[int, int]]) -> dict[int, int]:
        live = dict(self._baseline)
        for uid, delta in events[: self._window_peak_index]:
            if delta > 0:
                live[uid] = delta
            elif delta < 0:
                live.pop(uid, None)
        return live

    def _uids(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        out: set[int] = set()
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            entry = self._live.get(t.untyped_storage()._cdata)
            if entry is not None:
                out.add(entry[0])
        return out

    def components_at_peak(
        self,
        params: Iterable[torch.Tensor],
        grads: Iterable[torch.Tensor],
        optimizer_state: Iterable[torch.Tensor],
    ) -> dict[str, int]:
        """Bytes alive at this window's peak, by kind. Call while params/grads/states live."""
        p_uids = self._uids(params)
        g_uids = (self._uids(grads) | self._noted_grads) - p_uids
        events, firsts = self._cuda_log(g_uids)
        g_uids |= firsts
        live = self._live_at_window_peak(events)
        o_uids = self._uids(optimizer_state) - p_uids - g_uids
        out = {"params": 0, "grads": 0, "optimizer": 0, "activations": 0}
        for uid, nbytes in live.items():
            if uid in p_uids:
                out["params"] += nbytes
            elif uid in g_uids:
                out["grads"] += nbytes
            elif uid in o_uids:
                out["optimizer"] += nbytes
            else:
                out["activations"] += nbytes
        out["host"] = self._window_host_at_peak
        return out

    def component_maxima(
        self,
        params: Iterable[torch.Tensor],
        grads: Iterable[torch.Tensor],
        optimizer_state: Iterable[torch.Tensor],
    ) -> dict[str, int]:
        """The most bytes each kind held at any moment of this window (each at its own moment).

        weights: parameters and buffers; trainable_states: gradients + optimizer states (with
        fp32 masters); logits: non-state storages whose last dimension is `vocab` (logits, their
        fp32 copies, log-softmax, their gradients); activations: all other device storages
        (saved tensors, recomputation, temporaries). Where `mark_optimizer_step` was called,
        the other storages made from then on (the optimizer step's buffers) are
        `optimizer_step` instead of activations. Call while params/grads/states are alive.
        """
        p_uids = self._uids(params)
        g_uids = (self._uids(grads) | self._noted_grads) - p_uids
        events, firsts = self._cuda_log(g_uids)
        s_uids = (g_uids | firsts | self._uids(optimizer_state)) - p_uids
        live = dict(self._baseline)
        mark = self._step_mark
        step_uids: set[int] = set()
        if mark is not None:
            step_uids = {uid for uid, delta in events[mark:] if delta > 0}

        def kind(uid: int) -> str:
            if uid in p_uids:
                return "weights"
            if uid in s_uids:
                return "trainable_states"
            if uid in self._logit_uids:
                return "logits"
            return "optimizer_step" if uid in step_uids else "activations"

        current = {"weights": 0, "trainable_states": 0, "activations": 0, "logits": 0}
        if mark is not None:
            current["optimizer_step"] = 0
        for uid, nbytes in live.items():
            current[kind(uid)] += nbytes
        best = dict(current)
        for uid, delta in events:
            if delta > 0:
                live[uid] = delta
            elif delta == 0 or live.pop(uid, None) is None:
                continue
            k = kind(uid)
            current[k] += delta
            best[k] = max(best[k], current[k])
        return best
