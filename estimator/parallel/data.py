"""Data parallelism: what one device keeps of the states, and the communication buffers, under
DDP, torch FSDP2 and DeepSpeed ZeRO 1/2/3 (bytes, per device, after the model-parallel split).

DDP (torch 2.13 torch/nn/parallel/distributed.py): a full replica; the Reducer copies every
gradient into flat all-reduce buckets of `bucket_cap_mb` = 25 MiB (`_DEFAULT_BUCKET_CAP_MB`,
line 31) that together hold every trainable gradient, allocated once and kept:
`gradient_as_bucket_view=False` (the default, and accelerate 1.16 DistributedDataParallelKwargs
line 169) costs one more gradient-sized buffer ("the saved memory size will be equal to the
total gradients size", lines 731-735).

FSDP2 (torch 2.13 torch/distributed/fsdp/_fully_shard/):
- sharded parameters keep the model's original dtype: fp32 under mixed precision (accelerate
  1.16 utils/fsdp_utils.py:800 upcasts to fp32; torchtitan loads fp32), so the 16 bytes/param
  of Adam become fp32 shard + fp32 gradient shard + two fp32 moments, all / N;
- every unit is all-gathered in `param_dtype` (bf16) before use; the root unit (embeddings,
  lm_head, final norm) is not resharded after forward (_fsdp_state.py:203-207), so it stays
  unsharded the whole step, and its gradients are reduce-scattered only when the root's
  post-backward runs, at the end of the backward;
- the next unit is prefetched (implicit forward prefetch, _fsdp_param_group.py:62, and the
  default backward prefetch, _fsdp_state.py:384): two layer units unsharded at a time;
  `reshard_after_forward=False` keeps every unit unsharded from its forward to its backward;
- foreach_reduce (_fsdp_collectives.py:593-617) copies a unit's unsharded gradients into a
  reduce-scatter input of `reduce_dtype` (fp32 in torchtitan's default, job_config
  mixed_precision_reduce; bf16 in accelerate 1.16 utils/dataclasses.py:2009) and an output of
  1/N of it, then frees the unsharded gradients.
- under a pipeline (pp > 1) torch's stage turns off resharding after backward and gradient
  sync for every micro-batch but the last (torch 2.13 pipelining/stage.py:843-847), so after
  the first micro-batch's backward every unit of the rank stays unsharded and its gradients
  accumulate unsharded, upcast to `reduce_dtype` (_fsdp_param.py:802-821,
  _fsdp_param_group.py:603-612); the last backward reduce-scatters every group
  (stage.py:1169-1186). torchtitan also keeps units unsharded after forward under PP
  (torchtitan@9dec370 parallelize_llama.py:326-329). That last backward is each stage's own
  (one REDUCE_GRAD per stage, schedules.py:1252-1282), so a rank with several model chunks
  (interleaved, one round) holds one chunk's unsharded gradients at a time
  (`schedule.reduced_per_chunk`).
- offload_policy=CPUOffloadPolicy moves the sharded parameters, gradients and optimizer states
  to the host (the optimizer steps on the CPU).
- the reduce-scatter output is allocated on the reduce-scatter stream (torch 2.13
  _fsdp_collectives.py:611-616 `with device_handle.stream(reduce_scatter_stream): reduce_output
  = reduce_scatter_comm.allocate(...)`), and the new sharded gradients are `as_strided` views
  of it (:704-709), or of its cast to the sharded parameters' dtype when reduce_dtype differs
  (:685-696 `_to_dtype_if_needed` under `device_handle.stream(post_reduce_stream)`: the same
  stream, or HSDP's all-reduce stream); the input is allocated on the default stream
  (:597-601). The same in the run-era line: torch 2.6.0 (the release cut from the Dec-2024
  main of the torchtitan runs' torch 1963fc8, whose tree is not reachable here)
  _fsdp_collectives.py:371-373 the input, :382-383 the output, :425-440 the cast and views;
  and since FSDP2's first version (pytorch/pytorch@01d66d2 foreach_reduce_scatter:
  everything on that stream). So the device's sharded gradients are that stream's blocks
  (`reduce_stream_grads`), with the reduce-dtype outputs that are not themselves gradients
  (`reduce_stream_transient`, `_reduce_stream`), and the 1/N outputs are no default-stream
  bytes (`reduce_outputs`, `end_outputs`, `default_stream_bytes`); estimator/memory/
  fragmentation.py (5) says what that does to reserved.

DeepSpeed ZeRO (deepspeedai/DeepSpeed@1b88ac36 deepspeed/runtime/zero/config.py defaults:
reduce_bucket_size 5e8, allgather_bucket_size 5e8, stage3_prefetch_bucket_size 5e7,
stage3_max_live_parameters 1e9, stage3_param_persistence_threshold 1e5, contiguous_gradients
True, overlap_comm True only for stage 3): bf16 parameters, bf16 gradients reduced through a
contiguous bucket of reduce_bucket_size elements, and per rank 16 bytes/param / N of fp32
master, Adam moments and fp32 gradient partition. Its own estimators say the same:
`estimate_zero2_model_states_mem_needs` 4P + 16P/N (stage_1_and_2.py), and
`estimate_zero3_model_states_mem_needs` 4 x largest layer + 18P/N (stage3.py); with optimizer
offload 2P (stage 2) and 4 x largest + 2P/N (stage 3); with parameter offload 4 x largest.
`offload_param` is valid only with stage 3 (config.py docstring).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from estimator.dtypes import BF16, FP32
from estimator.errors import EstimatorInputError
from estimator.parallel.layout import Layout

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

DDP_BUCKET_CAP_MB = 25  # torch/nn/parallel/distributed.py:31
ZERO_REDUCE_BUCKET = 5e8  # elements, config.py reduce_bucket_size
ZERO_PREFETCH_BUCKET = 5e7  # elements, config.py stage3_prefetch_bucket_size
ZERO_MAX_LIVE = 1e9  # elements, config.py stage3_max_live_parameters
ZERO_FP32_PARTITION = FP32 + FP32 + 2 * FP32  # fp32 grads + master + Adam moments per param


@dataclass(frozen=True)
class ReplicaBytes:
    """One device's share of the model before data-parallel sharding."""

    weights: float  # compute weights (bf16 / quantized base / fp32)
    adapters: float  # trainable adapter weights (LoRA); 0 for full fine-tuning
    grads: float  # gradients as autograd makes them
    masters: float  # fp32 master weights (mixed precision full fine-tuning)
    optimizer: float
    step_transient: float
    trainable: float  # trainable parameters (count)
    root_weights: float  # embedding + lm_head compute weights
    root_trainable: float  # trainable parameters of the root unit (count)
    head_trainable: float  # of those, the lm_head's (its gradient is made first)
    unit_weights: float  # one FSDP unit's compute weights
    unit_trainable: float  # trainable parameters of one unit (count)
    largest_module: float  # parameters of the largest module (ZeRO-3's fetch unit)
    head_weights: float = 0.0  # of root_weights, the lm_head's (the rest: the embedding)
    tied: bool = False  # the lm_head is the embedding's weight (ModelSpec.tied_embeddings)

    @property
    def grad_bytes(self) -> float:
        """Bytes per gradient element as autograd makes it."""
        return self.grads / self.trainable if self.trainable else float(BF16)


@dataclass
class DataParallelBytes:
    """Per-device bytes by when they are alive."""

    weights: float  # resident (sharded or full) parameters
    states: float  # resident trainable states other than gradients
    grads: float  # gradients alive at the end of the backward
    forward_extra: float = 0.0  # unsharded / fetched parameters during forward and loss
    backward_extra: float = 0.0  # the same plus unsharded gradients, through the backward
    reduce_buffers: float = 0.0  # a unit's reduce-scatter buffers, once its backward is done
    reduce_kept: float = 0.0  # the previous unit's reduce-scatter input, through a backward
    reduce_kept_first: float = 0.0  # one kept through the first layer's backward (separate head)
    unit_grads: float = 0.0  # FSDP2: the current unit's unsharded gradients, in its backward
    end_extra: float = 0.0  # at the end of the backward (no activations): the root's reduce
    step_extra: float = 0.0  # buffers of the optimizer step (ZeRO's fp32 gradient partition)
    accumulated: float = (
        0.0  # FSDP2 under a pipeline: unsharded gradients kept across micro-batches
    )
    # of a rank whose chunks are reduced one after the other: the last chunk reduced's
    # (chunk 0, `accumulated` is then the first's, chunk v - 1)
    accumulated_last: float = 0.0
    step_transient: float = 0.0
    persistent: float = 0.0  # buffers alive all step (DDP / ZeRO buckets)
    # of `grads`, those not made yet when the last decoder unit runs its backward (units
    # reduced after it); 0: all counted (memory/torchtitan.py fsdp_units sets it)
    grads_late: float = 0.0
    host: float = 0.0  # offloaded bytes
    # FSDP2 (module docstring): of `reduce_buffers` and `end_extra`, the reduce-scatter outputs;
    # of `grads`, those made on the reduce-scatter stream; the most that stream holds beyond them
    reduce_outputs: float = 0.0
    end_outputs: float = 0.0
    reduce_stream_grads: float = 0.0
    reduce_stream_transient: float = 0.0
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def reduce_stream(self) -> float:
        """Bytes FSDP2's reduce-scatter stream holds at most at once: the sharded gradients it
        made plus the reduce-dtype output being cast or offloaded."""
        return self.reduce_stream_grads + self.reduce_stream_transient


def default_stream_bytes(dp: DataParallelBytes) -> DataParallelBytes:
    """`dp` without what FSDP2 allocates on its reduce-scatter stream (module docstring): the
    default stream's own bytes, the same `dp` under DDP and ZeRO."""
    return dataclasses.replace(
        dp,
        grads=dp.grads - dp.reduce_stream_grads,
        reduce_buffers=dp.reduce_buffers - dp.reduce_outputs,
        end_extra=dp.end_extra - dp.end_outputs,
    )


def shard_degree(layout: Layout) -> int:
    """Ranks FSDP / ZeRO shard over: the shard group times cp (torchtitan shards FSDP over the
    `dp_shard_cp` mesh, parallel_dims.py; Megatron's distributed optimizer over dp x cp)."""
    return layout.shard * layout.cp


def ddp_bytes(r: ReplicaBytes, layout: Layout) -> DataParallelBytes:
    bucket = r.grads if layout.replicate > 1 else 0.0
    return DataParallelBytes(
        weights=r.weights,
        states=r.adapters + r.masters + r.optimizer,
        grads=r.grads,
        step_transient=r.step_transient,
        persistent=bucket,
        terms={"ddp_buckets": bucket},
    )


def fsdp_bytes(
    r: ReplicaBytes,
    layout: Layout,
    reduce_bytes: float,
    chunks: int = 1,
    keeps_reduce_input: bool = False,
) -> DataParallelBytes:
    """FSDP2 with `layout.wrap_layers` decoder layers per unit (see the module docstring);
    `chunks`: model chunks of a pipeline rank reduced one after the other (`_pipelined`);
    `keeps_reduce_input`: the pipeline's stage leaves its last reduce-scatter input referenced
    into the next step (`_pipelined`)."""
    n = shard_degree(layout)
    if r.masters:  # mixed precision: the sharded parameter is the fp32 master
        shard_params, shard_grads = r.masters / n, r.masters / n
    else:
        shard_params, shard_grads = (r.weights + r.adapters) / n, r.grads / n
    gb = r.grad_bytes
    layers_unsharded = max(r.weights - r.root_weights, 0.0)
    gathered = 2 * r.unit_weights if layout.reshard_after_forward else layers_unsharded
    units = _separate_units(r, layout, gb, reduce_bytes)
    root_weights = r.root_weights - units.weights
    # at the loss every layer unit has been resharded by its post_forward (torch 2.13
    # _fsdp_param_group.py:557-564; only the root keeps its parameters, _fsdp_state.py:203-207);
    # the root's pre_backward then prefetches the last unit to run forward (_backward_prefetch,
    # _fsdp_param_group.py:828-830) while the loss's backward makes the logits' gradients: one
    # layer unit (a separate lm_head: `head_regather`)
    at_loss = r.unit_weights if layout.reshard_after_forward else layers_unsharded
    # backward through the layers: the root unsharded, the lm_head's gradient (made first;
    # the embedding's comes last), two units gathered (the current one and the one its
    # pre_backward prefetches)
    head_grads = (r.head_trainable - units.head_trainable) * gb
    # the current unit's unsharded gradients are made as its own saved tensors are released
    # (autograd's engine.cpp evaluate_function: fn.release_variables() after each node): the
    # phase rule counts what exceeds one layer's saved activations (`unit_grads`); then
    # foreach_reduce copies them into its reduce-dtype input (chunk_cat, _fsdp_collectives.py:
    # 597-617) and allocates the 1/N output: the unit's gradients, input and output are alive
    # together once the unit's activations are gone (the phase rule takes one layer's off)
    unit_grads = r.unit_trainable * gb
    unit_reduce = r.unit_trainable * reduce_bytes * (1 + 1 / n)
    root_trainable = r.root_trainable - units.trainable
    root_grads = root_trainable * gb
    root_reduce = root_trainable * reduce_bytes * (1 + 1 / n)
    layer_work = gathered
    # FSDP2 keeps the last reduce-scatter input alive until the next unit's post-backward
    # (ReduceScatterState, since pytorch/pytorch#129721 moved the copy-in to the default stream,
    # June 2024; torch 2.13 _fsdp_param_group.py:640-660 and :717-719 with
    # reduce_scatter_max_input_buffers 1): one unit's gradients in the reduce dtype through
    # each later layer's backward, whose own activations are gone by then (the phase rule takes
    # one layer's off); the lm_head's, when it is a unit of its own, through the first layer's
    reduce_kept = r.unit_trainable * reduce_bytes
    reduce_kept_first = units.head_trainable * reduce_bytes
    out = DataParallelBytes(
        weights=shard_params,
        states=r.optimizer / n,
        grads=shard_grads,
        forward_extra=root_weights + units.kept + max(at_loss, units.head_regather),
        backward_extra=root_weights + units.kept + head_grads + layer_work,
        reduce_buffers=unit_grads + unit_reduce,
        reduce_kept=reduce_kept,
        reduce_kept_first=reduce_kept_first,
        unit_grads=unit_grads,
        end_extra=root_weights + root_grads + root_reduce + units.end_work,
        step_transient=r.step_transient / n,
        terms={
            "fsdp_sharded_params": shard_params,
            "fsdp_root_unsharded": root_weights,
            "fsdp_root_grads_unsharded": root_grads,
            "fsdp_gathered_units": gathered,
            "fsdp_gathered_at_loss": max(at_loss, units.head_regather),
            "fsdp_reduce_scatter_buffers": unit_reduce,
            "fsdp_reduce_scatter_input_kept": max(reduce_kept, reduce_kept_first),
            **({"fsdp_separate_units_unsharded": units.weights} if layout.separate_units else {}),
        },
    )
    if layout.pp > 1:
        out.reduce_buffers = unit_reduce  # the gradients stay unsharded (`_pipelined`)
        out.unit_grads = 0.0  # counted in `_pipelined`'s backward_extra
        _pipelined(out, r, layers_unsharded, reduce_bytes, chunks, keeps_reduce_input)
    if layout.offload == "optimizer":
        raise EstimatorInputError(
            "setup.offload",
            "FSDP2 offloads parameters, gradients and optimizer states together "
            "(CPUOffloadPolicy): use --offload params, or zero1/2/3 for optimizer offload",
        )
    if layout.offload == "params":
        out.host = out.weights + out.states + out.grads
        out.weights = out.states = out.grads = 0.0
        out.step_transient = 0.0
    _reduce_stream(out, r, layout, reduce_bytes, root_trainable, units)
    return out


def _reduce_stream(
    out: DataParallelBytes,
    r: ReplicaBytes,
    layout: Layout,
    reduce_bytes: float,
    root_trainable: float,
    units: SeparateUnits,
) -> None:
    """What FSDP2 allocates on its reduce-scatter stream (module docstring). A unit's 1/N
    output is in `reduce_buffers`; the root's and a separate embedding unit's are in
    `end_extra` (under a pipeline, `_pipelined`'s end holds one layer unit's). The sharded
    gradients on the device (`grads`; none under offload, copied to the host by `.to("cpu")`,
    torch 2.13 _fsdp_collectives.py:737-739, 2.6.0 :450-452) are that stream's blocks.

    A reduce-dtype output that is not itself the gradient (cast to the sharded parameters'
    dtype: 2.13 :696, 2.6.0 :427; or copied to the host) is freed after its unit's reduce, and
    the caching allocator keeps its block for the stream's next output of at most its size
    (best fit). Unit after unit, in reduce order, a block is added only when an output is
    larger than every earlier one: their sum (`_new_blocks`). The order: a separate lm_head
    unit in the loss's backward, the layers, a separate embedding unit, the root last
    (`_root_post_backward_final_callback`); under a pipeline the stage's manual loop over
    `all_states`, the stage module (root) first. Under HSDP each group keeps its reduce-dtype
    output referenced (`_all_reduce_state`, 2.6.0 _fsdp_param_group.py:438-442, freed by the
    group's own `_wait_for_post_backward` at its next reduce or at finalize_backward, :462-467;
    2.13 _fsdp_collectives.py:663-672 "held across layers"): all of them are alive at the end
    of the backward when cast."""
    n = shard_degree(layout)
    embed_unit = units.trainable - units.head_trainable  # a separate embedding unit's
    unit_out = r.unit_trainable * reduce_bytes / n
    out.reduce_outputs = unit_out
    if layout.pp > 1:
        out.end_outputs = unit_out  # `_pipelined`'s end: the last group's buffers
        order = [root_trainable, embed_unit, r.unit_trainable, units.head_trainable]
    else:
        out.end_outputs = (root_trainable + embed_unit) * reduce_bytes / n
        order = [units.head_trainable, r.unit_trainable, embed_unit, root_trainable]
    # the sharded gradients' bytes per value: the sharded parameters' dtype
    grad_dtype = (r.masters if r.masters else r.grads) / r.trainable if r.trainable else 0.0
    cast = grad_dtype != reduce_bytes
    offload = layout.offload == "params"
    outputs = [t / n * reduce_bytes for t in order]
    if cast and layout.replicate > 1:
        held = r.trainable / n * reduce_bytes  # every group's output, to the end
    else:
        held = _new_blocks(outputs) if cast or offload else 0.0
    copies = _new_blocks([t / n * grad_dtype for t in order]) if cast and offload else 0.0
    out.reduce_stream_grads = out.grads
    out.reduce_stream_transient = held + copies
    out.terms["fsdp_reduce_stream_pool"] = out.reduce_stream


def _new_blocks(sizes: list[float]) -> float:
    """Bytes of the blocks a stream creates for tensors of `sizes`, made and freed one after
    the other, each served from the best-fitting cached block when one is large enough."""
    largest = total = 0.0
    for size in sizes:
        if size > largest:
            total += size
            largest = size
    return total


def _pipelined(
    out: DataParallelBytes,
    r: ReplicaBytes,
    layers_unsharded: float,
    reduce_bytes: float,
    chunks: int = 1,
    keeps_reduce_input: bool = False,
) -> None:
    """FSDP2 inside a pipeline stage (module docstring): every unit unsharded, the gradients
    accumulated unsharded in `reduce_bytes` (the first micro-batch's in the autograd dtype).

    `chunks` > 1 (`schedule.reduced_per_chunk`): the rank's chunks run their backwards one after
    the other, v - 1 first, and each is reduce-scattered by its own REDUCE_GRAD before the next
    one's first backward (torch 2.13 schedules.py:1252-1282, stage.py:1164-1180), leaving its
    1/N shard (counted in `grads`). One chunk's accumulation exists at a time: chunk v - 1's
    (1/v of the layers, plus the lm_head on the last rank: stage p v - 1) through the first
    backwards, then chunk 0's (1/v of the layers, plus the embedding on the first rank: stage
    0), whose reduce ends the backward. The parameters' resharding at each REDUCE_GRAD
    (set_reshard_after_backward(True), stage.py:1176) is not modelled: every unit is counted
    unsharded through the backward.

    `keeps_reduce_input` (the stack's fact `pp_keeps_last_reduce_input`): the stage's last
    backward runs FSDP's post_backward for every group by hand (`for state in
    _state_ctx.all_states: post_backward()`), each keeping its reduce-scatter input in
    `comm_ctx.reduce_scatter_state` until the next group's post_backward frees it; only
    `_root_post_backward_final_callback` with is_last_backward frees the last one (torch 2.13
    fsdp/_fully_shard/_fsdp_state.py:421-431, "the last module's (which no later module's
    rs_wait clears)"), and the pipelining of Dec 2024 did not call it after the manual loop
    (added by pytorch/pytorch#144535, 2025-01: "one key hook was missed for FSDP, the
    _root_post_backward_final_callback"; torch 2.13 pipelining/stage.py:1191 calls it). The
    last group in `all_states` (the stage module first, then its layers, `named_modules`
    order) is the last decoder-layer unit, so one unit's gradients in the reduce dtype stay
    referenced from the end of a step to the next step's last backward, through its peak
    (`persistent`)."""
    gb = r.grad_bytes
    each = max(reduce_bytes, gb)
    acc = r.trainable * each
    unit_grads = r.unit_trainable * gb
    first, last = acc, 0.0
    if chunks > 1:
        layers_acc = max(r.trainable - r.root_trainable, 0.0) * each / chunks
        first = layers_acc + r.head_trainable * each
        last = layers_acc + (r.root_trainable - r.head_trainable) * each
    out.accumulated = first
    out.accumulated_last = last
    out.reduce_kept = out.reduce_kept_first = 0.0  # no reduce-scatter in a micro-batch's backward
    out.forward_extra = r.root_weights + layers_unsharded
    out.backward_extra = r.root_weights + layers_unsharded + unit_grads
    out.end_extra = (
        r.root_weights + layers_unsharded + (last if chunks > 1 else acc) + out.reduce_buffers
    )
    out.terms["fsdp_gathered_units"] = layers_unsharded
    out.terms["fsdp_pipeline_accumulated_grads"] = max(first, last)
    if keeps_reduce_input:
        kept = r.unit_trainable * reduce_bytes
        out.persistent += kept
        out.terms["fsdp_pipeline_reduce_input_kept"] = kept


@dataclass(frozen=True)
class SeparateUnits:
    """The embedding and / or lm_head wrapped as FSDP2 units of their own (`Layout.
    separate_units`, torchtune's `custom_sharded_layers`, torchtitan's `apply_fsdp_to_decoder`)
    instead of belonging to the root.

    torchtune@30b8519e8 recipes/full_finetune_distributed.py:416-423 adds `lambda n, m: n in
    custom_sharded_layers` to the shard conditions; torchtune/training/_distributed.py:612-623
    (`shard_model`) calls `fully_shard(m, reshard_after_forward=...)` on each matching module
    bottom-up, then on the whole model (the root), so each named module is a unit with the
    layers' reshard_after_forward (torchtune v0.6.1 training/_distributed.py: the same loop).
    Such a unit is all-gathered for its forward and resharded after it, all-gathered again for
    its backward, and its gradient reduce-scattered and freed by its own post-backward
    (FSDP2 _fsdp_param_group.py post_backward) instead of the root's at the end of the
    backward. What a device then holds, by moment:
    - `weights`: bytes no longer unsharded from the loss through the backward;
    - `kept`: those of them that stay unsharded from forward to backward anyway
      (reshard_after_forward False);
    - `head_regather`: the lm_head's backward, inside the loss phase (whose logits term holds
      the logits' gradient and, under full fine-tuning, the head's weight gradient): the head
      gathered again (unless kept) and the last decoder-layer unit prefetched (backward
      prefetch, _fsdp_state.py:384), in place of the two layer units the loss phase counts
      otherwise, when larger; its reduce-scatter input then stays through the first layer's
      backward (`reduce_kept`);
    - `end_work`: the embedding's backward, the last: gathered again (unless kept), its
      gradient and foreach_reduce's input and 1/N output in the reduce dtype.
    """

    weights: float = 0.0
    kept: float = 0.0
    trainable: float = 0.0
    head_trainable: float = 0.0
    head_regather: float = 0.0
    end_work: float = 0.0


def _separate_units(
    r: ReplicaBytes, layout: Layout, grad_bytes: float, reduce_bytes: float
) -> SeparateUnits:
    if not layout.separate_units:
        return SeparateUnits()
    n = shard_degree(layout)
    raf = layout.reshard_after_forward
    embed_w, head_w = r.root_weights - r.head_weights, r.head_weights
    embed_t, head_t = r.root_trainable - r.head_trainable, r.head_trainable
    out = SeparateUnits()
    # torchtitan's `[norm, lm_head]` unit: `reshard_after_forward=policy == "always"`
    # (torchtitan 0.3.0 distributed/fsdp.py:200-207), False under the default policy whatever
    # the layers do: kept unsharded from its forward to its backward. The final norm's weight
    # (hidden size) stays with the layers' bytes here.
    head_unit = next((u for u in ("lm_head", "norm_lm_head") if u in layout.separate_units), "")
    if head_unit and head_w:
        head_raf = raf and head_unit == "lm_head"
        gathered = head_w if head_raf else 0.0
        out = dataclasses.replace(
            out,
            weights=out.weights + head_w,
            kept=out.kept + (0.0 if head_raf else head_w),
            trainable=out.trainable + head_t,
            head_trainable=head_t,
            head_regather=gathered + r.unit_weights,
        )
    if "embeddings" in layout.separate_units and embed_w:
        # tied weights under torchtitan: one unit [tok_embeddings, norm, lm_head] with
        # `reshard_after_forward=policy == "always"` (0.3.0 distributed/fsdp.py:180-192), kept
        # unsharded like its head unit; its gradient is still reduced last (the embedding's)
        embed_raf = raf and not (r.tied and head_unit == "norm_lm_head")
        gathered = embed_w if embed_raf else 0.0
        out = dataclasses.replace(
            out,
            weights=out.weights + embed_w,
            kept=out.kept + (0.0 if embed_raf else embed_w),
            trainable=out.trainable + embed_t,
            end_work=gathered + embed_t * (grad_bytes + reduce_bytes * (1 + 1 / n)),
        )
    return out


def zero_bytes(r: ReplicaBytes, layout: Layout) -> DataParallelBytes:
    """DeepSpeed ZeRO stage `layout.data` (zero1 | zero2 | zero3)."""
    n = shard_degree(layout)
    stage = int(layout.data[-1])
    if stage > 1 and layout.pp > 1:
        raise EstimatorInputError(  # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__
            "setup.parallel",
            f"{layout.data} with pp={layout.pp}: DeepSpeed's pipeline engine asserts "
            "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism' (use zero1 or fsdp)",
        )
    gb = r.grad_bytes
    partition = r.trainable * FP32 / n  # fp32 gradient partition, made for the step
    states = (r.masters + r.optimizer) / n
    bucket = min(ZERO_REDUCE_BUCKET, r.trainable) * gb
    weights = r.weights + r.adapters
    terms = {"zero_reduce_bucket": bucket, "zero_fp32_grad_partition": partition}
    if stage == 3:
        fetched = min(ZERO_MAX_LIVE, r.largest_module + ZERO_PREFETCH_BUCKET) * BF16
        fetched = min(fetched, r.weights)
        out = DataParallelBytes(
            weights=weights / n,
            states=states,
            grads=partition,
            forward_extra=fetched,
            backward_extra=fetched + min(r.largest_module, r.trainable) * gb,
            step_transient=r.step_transient / n,
            persistent=bucket,
            terms={**terms, "zero3_fetched_params": fetched},
        )
    else:
        out = DataParallelBytes(
            weights=weights,
            states=states,
            grads=r.grads if stage == 1 else r.grads / n,
            step_extra=partition,
            step_transient=r.step_transient / n,
            persistent=bucket,
            terms=terms,
        )
    if layout.offload == "params" and stage != 3:
        raise EstimatorInputError(
            "setup.offload", "DeepSpeed offloads parameters only with stage 3 (offload_param)"
        )
    if layout.offload in ("optimizer", "params"):
        out.host = out.states + partition
        out.states = 0.0
        out.step_extra = 0.0
        out.step_transient = 0.0
        if stage == 3:
            out.grads = 0.0
        elif stage == 2:
            out.grads = 0.0  # reduced partitions are copied to pinned host buffers
        if layout.offload == "params":
            out.host += out.weights
            out.weights = 0.0
    return out


def data_parallel_bytes(
    r: ReplicaBytes,
    layout: Layout,
    reduce_bytes: float,
    chunks: int = 1,
    keeps_reduce_input: bool = False,
) -> DataParallelBytes:
    """Per-device bytes under `layout`'s data-parallel kind; `chunks`: a pipeline rank's model
    chunks reduced one after the other (FSDP2, `schedule.reduced_per_chunk`);
    `keeps_reduce_input`: see `_pipelined`."""
    if layout.data == "dp":
        if layout.offload != "none":
            raise EstimatorInputError(
                "setup.offload", "offload needs fsdp (params) or zero1/2/3 (optimizer)"
            )
        return ddp_bytes(r, layout)
    if layout.data == "fsdp":
        return fsdp_bytes(r, layout, reduce_bytes, chunks, keeps_reduce_input)
    return zero_bytes(r, layout)


# FSDP2 reduce dtype under mixed precision, by stack: torchtitan's job config default
# `mixed_precision_reduce = "float32"`; accelerate 1.16 (the hf stack) sets reduce_dtype to the
# mixed-precision dtype (utils/dataclasses.py:2009).
REDUCE_DTYPE_BYTES = {"hf": BF16, "unsloth": BF16}


def reduce_bytes(setup: TrainingSetup) -> float:
    """Bytes per element of FSDP2's reduce-scatter (fp32 precision: fp32; bf16: bf16)."""
    if setup.precision == "fp32":
        return float(FP32)
    if setup.precision == "bf16":
        return float(BF16)
    return float(REDUCE_DTYPE_BYTES.get(setup.stack, FP32))
