"""Gradient sums the autograd engine does in place on CUDA but out of place under the tracker.

When a tensor feeds several ops, the engine sums its gradients in the consumer's input buffer
(torch/csrc/autograd/input_buffer.cpp, `accumulate`): `old_var.add_(var)` into the first
contribution when `can_accumulate_inplace(old_var)` (the engine holds the only reference to a
plain dense tensor) and `var` is no tensor subclass, else `old_var + var`, a new tensor.
`at::isTensorSubclassLike` answers true for every tensor while any dispatch mode is active
(aten/src/ATen/TensorSubclassLikeUtils.h: `if (c10::impl::dispatch_mode_enabled()) return
true`), and fake tensors are subclasses: under the storage tracker every such sum is the
out-of-place one. A CUDA step without the tracker writes the sum into the first contribution.

Where the sum becomes a parameter's gradient (a tied embedding: the LM head's weight gradient
first, the embedding's second), the first contribution IS the gradient on CUDA, from the moment
it is made; under the tracker it is a separate storage that dies at the sum, and the sum is a
new one. `cuda_events` rewrites the tracker's log as CUDA runs it: the sum's storage takes the
first contribution's identity (its allocation and the first contribution's free are dropped),
so the classification books the first contribution as a trainable state from its creation.
Only sums that end as a parameter's gradient are rewritten: for other sums (the residual
stream's gradients) whether the engine held the only reference cannot be seen from Python.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["EngineSum", "cuda_events", "first_contributions"]

# (sum's uid, first operand's uid): an `aten.add.Tensor` made by the autograd engine (inside a
# backward, grad mode off) whose first operand was made by an earlier node than the second
EngineSum = tuple[int, int]


def first_contributions(sums: dict[int, int], grad_uids: Iterable[int]) -> dict[int, int]:
    """{storage uid in the log: the uid it is on CUDA} for every engine sum that ends as one of
    `grad_uids`, followed back through chained sums (three contributions: two sums) to the
    first contribution."""
    rename: dict[int, int] = {}
    for grad in grad_uids:
        chain = [grad]
        while chain[-1] in sums:
            chain.append(sums[chain[-1]])
        first = chain[-1]
        for uid in chain[:-1]:
            rename[uid] = first
    return rename


def cuda_events(
    events: Iterable[tuple[int, int]], rename: dict[int, int], grad_uids: set[int]
) -> list[tuple[int, int]]:
    """The tracker's (uid, ±bytes) log with the sums of `rename` done in place, event for
    event (a dropped event becomes (uid, 0), so indices into the log still hold): a sum's
    allocation is dropped (on CUDA it is the first contribution's storage), so is the free of
    the first contribution and of every intermediate sum (made at the next sum); the final
    sum's free (the gradient's) becomes the first contribution's."""
    firsts = set(rename.values())
    out = []
    for uid, delta in events:
        if uid in rename:
            if delta < 0 and uid in grad_uids:
                out.append((rename[uid], delta))
            else:
                out.append((uid, 0))
        elif delta < 0 and uid in firsts:
            out.append((uid, 0))
        else:
            out.append((uid, delta))
    return out
