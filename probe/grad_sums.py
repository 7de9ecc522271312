"""Backward ops that run in place on CUDA but out of place under the tracker.

`at::isTensorSubclassLike` answers true for every tensor while any dispatch mode is active
(aten/src/ATen/TensorSubclassLikeUtils.h: `if (c10::impl::dispatch_mode_enabled()) return
true`), and fake tensors are subclasses, so under the storage tracker autograd takes the
out-of-place branches written for tensor subclasses; a CUDA step without the tracker does not:

- **gradient sums.** When a tensor feeds several ops, the engine sums its gradients in the
  consumer's input buffer (torch/csrc/autograd/input_buffer.cpp, `accumulate`):
  `old_var.add_(var)` into the first contribution when `can_accumulate_inplace(old_var)` (the
  engine holds the only reference to a plain dense tensor) and `var` is no subclass, else
  `old_var + var`, a new tensor. Where the sum becomes a parameter's gradient (a tied
  embedding: the LM head's weight gradient first, the embedding's second) the first
  contribution IS the gradient on CUDA from the moment it is made. Only those sums are
  rewritten: for the others (the residual stream's) whether the engine held the only
  reference cannot be seen from Python.
- **index backward.** `index_backward` (torch/csrc/autograd/FunctionsManual.cpp) returns
  `zeros_like_self.index_put(indices, grad, true)` for subclasses, else
  `at::_index_put_impl_(zeros_like_self, ...)` into the zeros it just made (MoE token
  gathers, `hidden_states[perm]`).

`cuda_events` rewrites the tracker's log as CUDA runs these: the out-of-place result takes its
first operand's identity (its allocation and the operand's free are dropped, its own free
becomes the operand's), so the classification and the maxima see CUDA's storages. `cuda_trace`
does the same to an allocation trace (`probe.allocator_trace`), so the allocator simulation
replays CUDA's allocation/free sequence, not the dispatch mode's.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

from probe.allocator_events import Event, EventId, free

__all__ = ["cuda_events", "cuda_trace", "first_contributions"]

K = TypeVar("K", bound=Hashable)


def first_contributions(sums: dict[int, int], grad_uids: Iterable[int]) -> dict[int, int]:
    """The pairs {sum's uid: first operand's uid} of `sums` on the chains that end as one of
    `grad_uids` (three contributions: two chained sums)."""
    pairs: dict[int, int] = {}
    for grad in grad_uids:
        uid = grad
        while uid in sums and uid not in pairs:
            pairs[uid] = sums[uid]
            uid = sums[uid]
    return pairs


def _root(uid: K, pairs: dict[K, K]) -> K:
    while uid in pairs:
        uid = pairs[uid]
    return uid


def cuda_events(events: Iterable[tuple[int, int]], pairs: dict[int, int]) -> list[tuple[int, int]]:
    """The tracker's (uid, ±bytes) log with each {result: first operand} of `pairs` done in
    place, event for event (a dropped event becomes (uid, 0), so indices into the log still
    hold): a result's allocation is dropped (on CUDA it is the operand's storage), so is the
    free of every operand (it happens at the op, or at the next op of a chain); the free of a
    result that no later op consumed becomes the free of the chain's first operand."""
    consumed = set(pairs.values())
    out = []
    for uid, delta in events:
        if uid in pairs and delta > 0 or uid in consumed and delta < 0:
            out.append((uid, 0))
        elif uid in pairs and delta < 0:
            out.append((_root(uid, pairs), delta))
        else:
            out.append((uid, delta))
    return out


def cuda_trace(events: Iterable[Event], pairs: dict[EventId, EventId]) -> list[Event]:
    """An allocation trace (`probe.allocator_events`) with each {result: first operand} of
    `pairs` done in place, as `cuda_events` does to the tracker's log: the result's `alloc` and
    every operand's `free` are dropped, the free of a chain's last result frees its first
    operand. What the allocator simulation replays is then the CUDA step's sequence."""
    consumed = set(pairs.values())
    out = []
    for ev in events:
        if ev.op == "alloc" and ev.id in pairs or ev.op == "free" and ev.id in consumed:
            continue
        if ev.op == "free" and ev.id in pairs:
            out.append(free(_root(ev.id, pairs)))
        else:
            out.append(ev)
    return out
