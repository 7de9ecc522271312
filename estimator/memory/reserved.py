"""Reserved vs allocated: the caching allocator's slack.

torch's CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp; the constants are in
c10/core/AllocatorConfig.h:17-25 of torch 2.13) rounds every block up to 512 bytes
(kMinBlockSize); blocks up to 1 MiB (kSmallSize) come from 2 MiB segments (kSmallBuffer);
blocks of 1-10 MiB (below kMinLargeAlloc) are carved from 20 MiB segments (kLargeBuffer); a
block of 10 MiB or more gets its own segment rounded up to 2 MiB (kRoundLarge). What
max_memory_reserved adds to max_memory_allocated is therefore, per live tensor, its segment's
unused remainder. This module sums that remainder over the tensors alive at the peak: every
weight, gradient, fp32 master and optimizer state tensor (activations, whose sizes vary with the
sequence, are left out).
With `expandable_segments:True` (Unsloth, torchtitan set it) segments grow page by page
(2 MiB) and the rounding is paid once per segment, not per tensor: one kLargeBuffer is kept.
Fragmentation between phases is estimator/memory/fragmentation.py's: the eager full loss's
logits hole, FSDP2's all-gather stream pool and the last checkpointed layer's forward cached at
the loss, worked out from the allocator's rules on the stack's allocation sequence. The `probe`
stack reports no slack (the estimator before stacks).

Checked against a simulation of the allocator's rules (not fitted to it): fake traces of
transformers' Trainer step replayed through probe/allocator.py (bench/allocator_slack.py;
bench/results/allocator_slack_2026-12-03.md). With expandable segments on, the replays run in
allocated + 0.1-0.6 GiB (free pages are unmapped before an OOM): one kLargeBuffer is counted
here, and fragmentation.py's terms, which the unmapping gives back, describe
max_memory_reserved on a card with room, not the least memory the step needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from estimator import lazy_numpy as np
from estimator.dtypes import BF16, FP32
from estimator.memo import Memo, setup_key
from estimator.memory.states import ADAM4BIT_BLOCK, ADAM4BIT_CODE, StateBytes
from estimator.spec import ModelSpec
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

K_MIN_BLOCK = 512
K_SMALL_SIZE = 2**20
K_SMALL_BUFFER = 2 * 2**20
K_LARGE_BUFFER = 20 * 2**20
K_MIN_LARGE_ALLOC = 10 * 2**20
K_ROUND_LARGE = 2 * 2**20


def _round_up(x: Any, to: int) -> Any:
    return np.ceil(np.asarray(x, dtype=np.float64) / to) * to


def segment_waste(size: Any) -> Any:
    """Reserved-but-unallocated bytes attributable to one live tensor of `size` bytes."""
    size = np.asarray(size, dtype=np.float64)
    block = _round_up(np.maximum(size, 1), K_MIN_BLOCK)
    per_mid_segment = np.maximum(np.floor(K_LARGE_BUFFER / block), 1)
    mid = (K_LARGE_BUFFER - per_mid_segment * block) / per_mid_segment + (block - size)
    large = _round_up(size, K_ROUND_LARGE) - size
    small = block - size
    return np.where(size <= K_SMALL_SIZE, small, np.where(size < K_MIN_LARGE_ALLOC, mid, large))


def _state_tensors(setup: TrainingSetup) -> list[float]:
    """Bytes per element of each tensor a trained weight brings (grad, master, states)."""
    if setup.precision == "fp32":
        grads, master, state = FP32, 0, FP32
    elif setup.precision == "mixed":
        grads, master, state = BF16, FP32, FP32
    else:
        grads, master, state = BF16, 0, BF16
    states = {"adamw": 2, "lion": 1, "sgd-momentum": 1}.get(setup.optimizer, 0)
    kept: list[float] = [float(grads), *([float(master)] if master else [])]
    if setup.optimizer == "adamw-8bit":
        return [*kept, 1, 1]
    if setup.optimizer == "adamw-4bit":  # each moment's codes and scales (memory/states.py)
        codes, scale = ADAM4BIT_CODE, FP32 / ADAM4BIT_BLOCK
        return [*kept, codes, scale, codes, scale]
    return kept + [state] * states


def allocator_slack(spec: ModelSpec, setup: TrainingSetup, allocated: Any, devices: int) -> Any:
    """Slack over `allocated` (same shape) for the stack's allocator settings."""
    return with_slack(allocated, slack_bytes(spec, setup, devices))


def slack_bytes(spec: ModelSpec, setup: TrainingSetup, devices: int) -> float | None:
    """`allocator_slack`'s bytes: they do not depend on the length (None: no slack)."""
    expandable = load_stack(setup.stack).get("expandable_segments")
    if expandable is None or not spec.geometry_known:
        return None
    if expandable:
        return K_LARGE_BUFFER
    # one float per (spec, setup, devices): memoised
    key = (setup_key(setup), devices)
    return _SLACK.get((spec,), key, lambda: _tensor_slack(spec, setup, devices))


def with_slack(allocated: Any, slack: float | None) -> Any:
    """`allocator_slack` from its `slack_bytes`: that slack in `allocated`'s shape."""
    zero = np.times_zero(allocated)
    return zero if slack is None else zero + slack


_SLACK: Memo[float] = Memo()


def _tensor_slack(spec: ModelSpec, setup: TrainingSetup, devices: int) -> float:
    """Sum of `segment_waste` over the weight, gradient, master and optimizer-state tensors."""
    shard = devices if setup.sharding in ("fsdp", "zero3") and devices > 1 else 1
    weight_dtype = FP32 if setup.precision == "fp32" else BF16
    sizes: list[tuple[float, int]] = []
    for lin in spec.linears:
        elements = lin.in_features * lin.out_features * lin.experts / shard
        if setup.is_adapter and setup.base == "nf4" and lin.group != "head":
            sizes.append((elements / 2, lin.count))
        elif setup.is_adapter and setup.base == "int8" and lin.group != "head":
            sizes.append((elements, lin.count))
        else:
            sizes.append((elements * weight_dtype, lin.count))
        if not setup.is_adapter:
            sizes += [(elements * b, lin.count) for b in _state_tensors(setup)]
    sizes += [(g.params * weight_dtype / shard, 1) for g in spec.others if g.name == "embed_tokens"]
    return sum(float(segment_waste(b)) * c for b, c in sizes)


def grad_tensor_sizes(
    spec: ModelSpec, setup: TrainingSetup, states: StateBytes
) -> list[tuple[float, int]]:
    """(bytes, count) of the gradient tensors: full fine-tuning has one per trained matrix,
    expert bank and embedding (the other small parameters summed into one entry, all far below
    any loss tensor), at the gradients' bytes per value; adapters one entry, all their
    rank-r gradients. Memoised per (spec, setup). Used by fragmentation.py (4)."""
    return _GRADS.get((spec,), setup_key(setup), lambda: _grad_sizes(spec, setup, states))


_GRADS: Memo[list[tuple[float, int]]] = Memo()


def _grad_sizes(
    spec: ModelSpec, setup: TrainingSetup, states: StateBytes
) -> list[tuple[float, int]]:
    if not states.grads or not states.trainable_params:
        return []
    if setup.is_adapter or not spec.geometry_known:
        return [(float(states.grads), 1)]
    per = states.grads / states.trainable_params
    sizes: dict[float, int] = {}
    for lin in spec.linears:
        size = float(lin.in_features * lin.out_features * lin.experts * per)
        sizes[size] = sizes.get(size, 0) + lin.count
    for g in spec.others:
        if g.name == "embed_tokens":
            sizes[float(g.params * per)] = sizes.get(float(g.params * per), 0) + 1
    rest = sum(g.params for g in spec.others if g.name != "embed_tokens")
    if rest:
        sizes[float(rest * per)] = sizes.get(float(rest * per), 0) + 1
    return list(sizes.items())
