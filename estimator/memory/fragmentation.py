"""Reserved bytes the caching allocator holds that no live tensor uses, worked out from the
allocator's rules on the allocation sequence a stack runs (the rounding of every live tensor is
estimator/memory/reserved.py).

torch's CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp, torch 2.13) serves a request
from the best-fitting cached free block of the *same stream* (`get_free_block`:
`(*it)->stream != p.stream()` returns false), splits it, merges a freed block only with free
neighbours of the same segment, and never moves a live block; what it cannot serve it maps or
cudaMallocs anew. Three consequences are worked out here; they hold with and without
`expandable_segments` (segments are per stream either way; see 3 for what expandable segments
change). Each is checked against replays of fake-traced Trainer steps through
probe/allocator.py, not fitted to them.

1. The eager full loss (`loss_hole_bytes`). A stack that upcasts the model's output for the
   loss runs: logits (compute dtype) -> their fp32 copy -> fp32 log-softmax (saved); the fp32
   copy is freed at the end of the loss's forward and the logits before the backward
   (torchtitan train.py@9dec370:303-308 `del pred`; HF Trainer drops the model output;
   torchtune's recipe `del logits`). The backward then makes two fp32 tensors of the same
   size at once (nll_loss_backward's gradient, log_softmax_backward's result): the first fits
   the hole the logits and their copy left, the second does not and is served from new memory,
   leaving the logits' bytes cached and unused while the loss's backward is the peak:
   reserved >= loss-phase allocated + tokens x vocab x the logits' dtype.
2. FSDP2's all-gather buffers (`gather_pool_bytes`). fully_shard all-gathers a unit into a
   flat buffer allocated on its all-gather copy-in stream
   (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:336-352, foreach_all_gather),
   copies it out into the unsharded parameters on the default stream, and keeps the previous
   buffer until the next all-gather's copy-in (AllGatherState, _fsdp_param_group.py); those
   blocks are cached for that stream only, so the default stream's peak cannot use them:
   reserved += the root unit's buffer + one layer unit's (the root all-gathers first and
   layer 0 follows while it is held).
3. The last decoder layer's forward (`forward_cache_bytes`). A checkpointed layer's forward
   creates the tensors its backward's recompute will save (the same ops run; non-reentrant
   checkpointing drops them, torch/utils/checkpoint.py `_checkpoint_hook`), and they die when
   the layer returns: the blocks go back to the pool, cached (`free_block`; nothing is
   returned to the driver before an OOM or `empty_cache`). The next layer's forward is served
   from those blocks, so one layer's worth stays cached through the forward and is still
   cached when the loss starts. Every block of it is a slice of a layer tensor (tokens x a
   layer width), smaller than the loss's tokens x vocab tensors, which therefore cannot use it
   (`get_free_block` needs one free block of at least the request's size; free blocks merge
   only with free neighbours of the same segment, `try_merge_blocks`, and the layer's cached
   blocks sit between the live checkpoints carved from them). So at the loss
   reserved >= loss-phase allocated + the logits hole (1) + one layer's activations as the
   recompute keeps them (the largest layer kind; under selective checkpointing the part the
   policy does not keep, which is freed; with no checkpointing the saved tensors stay
   allocated and nothing is counted). This bounds the layer's share (its forward frees some
   tensors before others are made, and the live checkpoints take some of the cached bytes).
   Replays (bench/allocator_rule.py, bench/results/allocator_rule_2026-12-03.md; expandable
   segments off): reserved - allocated at the first step's logits is 93-101 % of this term on
   the TinyLlama, Llama-3.1-8B and small QLoRA checkpointed cases and 63 % on the 27 B hybrid
   (3.71 of 5.85 GiB: its worst layer kind, a Gated DeltaNet layer, is not its last layer);
   every cached block smaller than the logits, at the later step, 70-117 %. With expandable
   segments on, a freed block at the end of the mapped range merges with the unmapped tail
   (`find_expandable_block` + `map_block`), so the loss can take the last freed blocks and
   the replays hold less; the bound is kept (max_memory_reserved on a card with room).
4. The previous step's gradients (`grad_cache_bytes`). Every stack frees the gradients after
   the optimizer step (transformers 5.24.0 trainer.py:1954 `model.zero_grad()`, torch 2.13
   nn/modules/module.py:2948 and optim/optimizer.py:1024 `set_to_none=True` by default;
   torchtitan and torchtune call `zero_grad()` likewise), so from the second step on their
   blocks, one per trained tensor, are cached when the forward starts. The forward carves its
   kept activations (checkpoints, or every saved tensor without checkpointing) and its layer
   blocks out of them; a gradient block smaller than the logits (tokens x vocab in the
   logits' dtype, the loss's smallest tensor) cannot serve any loss tensor. So at the loss
   reserved >= loss-phase allocated + the logits hole + max(3, those small gradient blocks -
   the kept activations). Adapters' gradients are small: their sum counts. Worked out for one
   device (`sharding` none): sharded gradients are flat or DTensor shards whose blocks this
   rule does not follow, and the term is not counted there (nor in estimator/memory/
   sharded.py's layouts).
5. FSDP2's reduce-scatter stream (`reduce_pool_bytes`). foreach_reduce allocates each unit's
   reduce-scatter output on the reduce-scatter stream and makes the unit's sharded gradients
   views of it, or of its cast to the parameters' dtype made on that stream too (torch 2.6.0
   distributed/fsdp/_fully_shard/_fsdp_collectives.py:382-383 `reduce_output =
   reduce_scatter_input.new_empty(...)` under `device_handle.stream(reduce_scatter_stream)`,
   :425-440 the cast and `torch.as_strided(reduce_output, ...)` under
   `device_handle.stream(post_reduce_stream)`, :447-449 and :474-477: "the GPU sharded
   gradient is allocated in the RS stream"; the same in torch 2.13 _fsdp_collectives.py:611-616,
   :685-709, :734; estimator/parallel/data.py's docstring). Those blocks belong to that stream
   (`Block::stream`, "allocation stream"; CUDACachingAllocator.cpp's header note: "Once freed,
   blocks can be re-allocated on the same stream, but not on any other stream";
   `get_free_block` returns false for another stream's block; an expandable segment is made
   "per stream" and gives pages to another stream's segment only when unmapped on an OOM).
   So the gradients made in the backward cannot take the blocks of the checkpoints the
   default stream frees, and once the step frees them (torchtitan@9dec370 train.py:266
   `optimizers.zero_grad()` at the start of each step; torch's set_to_none default) their
   blocks stay cached for the reduce-scatter stream, which the next forward and loss cannot
   use (as in 2). Both pools only grow (nothing is released before an OOM or `empty_cache`;
   torchtitan@9dec370 empties the cache once, in DeviceMemoryMonitor.__init__, metrics.py),
   so from the second step on reserved = the default stream's peak + the reduce-scatter
   stream's (the rank's sharded gradients, plus a unit's reduce-dtype output while it is cast
   or copied to the host: `DataParallelBytes.reduce_stream`) + the all-gather pool (2). Where
   the estimator keeps the sharded gradients allocated in every phase (gradient accumulation,
   a pipeline's micro-batches) they are taken out of the default stream's bytes and counted
   once, in the pool. The allocated peak (`max_memory_allocated`, blind to streams) is not
   changed: there the gradients made still take the checkpoints' place. Applied to every
   `fsdp` layout, as 2 is: FSDP1 (accelerate's default) also makes the sharded gradient on a
   stream of its own (torch 2.13 distributed/fsdp/_runtime_utils.py:755
   `stream(state._post_backward_stream)`, :848 and :901 `new_sharded_grad =
   torch.empty_like(chunks[0])`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from estimator import lazy_numpy as np
from estimator.dtypes import FP32
from estimator.profile import Profile
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup


def counts_fragmentation(setup: TrainingSetup, profile: Profile) -> bool:
    """The `probe` stack and profiles without allocator slack (seed-000) keep reserved =
    allocated + rounding, as before stacks."""
    return setup.stack != "probe" and bool(profile.get("memory", "count_allocator_slack"))


def leaves_loss_hole(setup: TrainingSetup, profile: Profile, logit_dtype: int) -> bool:
    """Whether the loss leaves the hole of `loss_hole_bytes` (module note, 1): the eager full
    loss of logits narrower than fp32. None for a compiled loss (no fp32 copy), a held model
    output (then the logits are allocated, not a hole), fp32 logits, or another loss."""
    if not counts_fragmentation(setup, profile) or setup.loss != "full" or logit_dtype >= FP32:
        return False
    if profile.get("memory", "hold_model_output"):
        return False
    return not (setup.compile and "full" in (load_stack(setup.stack).get("loss_compiled") or ()))


def loss_hole_bytes(leaves_hole: bool, logits_bytes: Any) -> Any:
    """Bytes the eager full loss leaves cached and unused at its backward (module note, 1):
    `logits_bytes` = tokens x vocab x the logits' dtype where the loss leaves it
    (`leaves_hole`: `leaves_loss_hole`), else none."""
    zero = np.times_zero(logits_bytes)
    if not leaves_hole:
        return zero
    return zero + logits_bytes


def gather_pool_bytes(setup: TrainingSetup, profile: Profile, root: float, unit: float) -> float:
    """FSDP2's all-gather stream pool (module note, 2): the root unit's flat buffer plus one
    layer unit's, in the bytes they are gathered in."""
    if not counts_fragmentation(setup, profile):
        return 0.0
    return root + unit


def reduce_pool_bytes(setup: TrainingSetup, profile: Profile, reduce_stream: float) -> float:
    """FSDP2's reduce-scatter stream pool (module note, 5): the most bytes that stream holds
    (`DataParallelBytes.reduce_stream`)."""
    if not counts_fragmentation(setup, profile):
        return 0.0
    return reduce_stream


def forward_cache_bytes(layer_bytes: Any, kept_bytes: Any, counts: bool) -> Any:
    """Bytes the last checkpointed decoder layer's forward leaves cached at the loss (module
    note, 3; none without checkpointing: the caller's): `layer_bytes` = one layer's
    activations as the recompute keeps them (worst layer kind), `kept_bytes` = the part the
    checkpointing policy keeps allocated (selective). `counts`: `counts_fragmentation` (the
    same for `grad_cache_bytes`)."""
    zero = np.times_zero(layer_bytes)
    if not counts:
        return zero
    return np.maximum(zero + layer_bytes - kept_bytes, 0.0)


def grad_cache_bytes(
    grads: list[tuple[float, int]], loss_first: Any, kept: Any, counts: bool
) -> Any:
    """Bytes of the previous step's gradient blocks still cached at the loss (module note, 4):
    the gradient tensors (`grads`: (bytes, count) pairs) smaller than the loss's first tensor
    (`loss_first` = tokens x vocab x the logits' dtype) less the activations the forward keeps
    (`kept`), which are carved from them."""
    if not counts or not grads:
        return np.times_zero(loss_first)
    first = np.asarray(loss_first, dtype=np.float64)
    small = first * 0.0
    for size, count in grads:
        small = small + np.where(size < first, size * count, 0.0)
    return np.maximum(small - kept, 0.0)


def reserved_with_fragmentation(
    allocated: Any, loss_phase: Any, hole: Any, pool: float, slack: Any
) -> Any:
    """max(allocated, loss phase + hole) + the all-gather pool + the rounding slack; `hole` is
    every byte cached and unusable at the loss (logits hole + the last layer's forward)."""
    return np.maximum(allocated, loss_phase + hole) + pool + slack
