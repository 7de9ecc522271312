"""Per-device memory under a `--parallel` layout: the one-device breakdown of
`estimator.memory.model` at the local sequence (s / cp), split by the layout
(estimator/parallel/split.py: tp, pp, ep, cp) and sharded by its data-parallel kind
(estimator/parallel/data.py: DDP, FSDP2, ZeRO), with NCCL's buffers
(estimator/parallel/nccl.py). Phases as in `model._peak` (`phases` rule):
  loss      resident + unsharded/fetched parameters + checkpoints + logits
  backward  resident + unsharded parameters and gradients + reduce buffers
            + max(checkpoints, gradients made) + recompute peak
  step      resident + all gradients + ZeRO's fp32 partition + optimizer temporaries
resident = sharded parameters + states + persistent buckets (+ gradients under accumulation).
A pipeline's first rank (embedding, the schedule's most micro-batches in flight) and last rank
(lm_head, logits) are both evaluated; the peak is the larger (estimator/parallel/schedule.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

from estimator.dtypes import BF16, FP32, compute_bytes
from estimator.errors import EstimatorInputError
from estimator.lazy_numpy import numpy as np
from estimator.memory import torchtitan
from estimator.memory.activations import (
    Context,
    head_input_saved,
    inputs_saved,
    layer_activations,
    rms_norm_saved,
    stream_bytes,
)
from estimator.memory.fragmentation import (
    counts_fragmentation,
    gather_pool_bytes,
    reduce_pool_bytes,
    reserved_with_fragmentation,
)
from estimator.memory.logits import loss_parallel_extra_bytes
from estimator.memory.model import MemoryBreakdown, memory_breakdown
from estimator.memory.reserved import allocator_slack
from estimator.memory.states import largest_tensor
from estimator.memory.weights import (
    kbit_fp32,
    masters_layout,
    quantized_base,
    rope_buffer_bytes,
)
from estimator.memory.workspaces import add_workspaces, workspaces_in
from estimator.objective import reference_weights_held, sequences
from estimator.parallel.data import (
    DataParallelBytes,
    ReplicaBytes,
    data_parallel_bytes,
    default_stream_bytes,
    reduce_bytes,
    shard_degree,
)
from estimator.parallel.layout import Layout
from estimator.parallel.nccl import ASSUMED_CHANNELS, nccl_buffer_bytes
from estimator.parallel.ring import ring_backward_extra_per_token
from estimator.parallel.schedule import (
    accumulated_at_loss,
    boundary_tensors,
    held_at_chunk_backwards,
    last_stage_outputs_kept,
    reduced_per_chunk,
)
from estimator.parallel.split import (
    Stage,
    attention_score_term,
    checkpoint_factor,
    micro_batches,
    param_groups,
    stages,
    tp_activation_factor,
)
from estimator.profile import Profile
from estimator.setup_rules import eval_split_unmodelled
from estimator.spec import LAYER_FULL, LAYER_SLIDING, MLP_DENSE, ModelSpec
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup


def _scalar(value: Any) -> float:
    return 0.0 if value is None else float(np.asarray(value, dtype=np.float64).ravel()[0])


def _replica(
    spec: ModelSpec, setup: TrainingSetup, base: MemoryBreakdown, stage: Stage, layout: Layout
) -> ReplicaBytes:
    """The stage's share of the one-device weights and states."""
    assert base.states is not None
    s = base.states
    total = float(spec.params_total) or 1.0
    frac = stage.params / total
    # the stack's RoPE buffers are not parameters: added whole per rank in layout_breakdown
    weights = _scalar(base.components["weights"]) - rope_buffer_bytes(spec, setup)
    trainable = float(s.trainable_params)
    full = not setup.is_adapter
    embed, head, _, _ = param_groups(spec)
    largest = max(float(largest_tensor(spec)), embed, head) / layout.tp
    root_bpp, layer_bpp = _weight_bytes_per_param(spec, setup, weights, embed + head)
    return ReplicaBytes(
        weights=stage.root * root_bpp + (stage.params - stage.root) * layer_bpp,
        adapters=s.weights * frac,
        grads=s.grads * frac,
        masters=s.masters * frac,
        optimizer=s.optimizer * frac,
        step_transient=s.step_transient * frac,
        trainable=trainable * frac,
        root_weights=stage.root * root_bpp,
        root_trainable=stage.root if full else 0.0,
        head_trainable=(head / layout.tp if stage.last else 0.0) if full else 0.0,
        head_weights=(head / layout.tp if stage.last else 0.0) * root_bpp,
        tied=spec.tied_embeddings,
        unit_weights=stage.layer * layout.wrap_layers * _gather_bytes_per_param(setup, layer_bpp),
        unit_trainable=trainable * stage.layer * layout.wrap_layers / total,
        largest_module=largest if full else min(largest, trainable * frac),
    )


def _gather_bytes_per_param(setup: TrainingSetup, layer_bpp: float) -> float:
    """Bytes per parameter a layer unit is all-gathered in: its storage, except over a
    quantized base on a stack whose fact `fsdp_gathers_storage_dtype` is false (gathered at
    bf16, as `model._gathered_layer_bytes` counts it for the same stack)."""
    if quantized_base(setup) and not load_stack(setup.stack).get("fsdp_gathers_storage_dtype"):
        return float(BF16)
    return layer_bpp


def _weight_bytes_per_param(
    spec: ModelSpec, setup: TrainingSetup, weights: float, root_params: float
) -> tuple[float, float]:
    """(embedding / lm_head, decoder layers) bytes per parameter of the one-device weights.
    Alike, except over a quantized base (`weights.weight_bytes`): there the quantizer replaces
    the layers' Linear weights only, and the embedding and lm_head stay in the dense dtype
    (bitsandbytes via transformers skips the lm_head; torchtune@30b8519e8
    models/llama3_1/_component_builders.py:247-253 "quantize_base is not applied to final
    output_proj", nn.Embedding and nn.Linear), which is what FSDP2's root unit gathers whole."""
    total = float(spec.params_total) or 1.0
    average = weights / total
    if not quantized_base(setup) or not spec.geometry_known or root_params >= total:
        return average, average
    dense = float(FP32 if kbit_fp32(setup) or setup.precision == "fp32" else BF16)
    rest = max(weights - root_params * dense, 0.0)
    return dense, rest / (total - root_params)


def _tp_shares(spec: ModelSpec, setup: TrainingSetup, layout: Layout) -> tuple[float, float]:
    """(saved activations, backward transient) a tp rank keeps of one layer's.

    A dense softmax-attention layer is split tensor by tensor: what lies between a
    column-parallel input and a row-parallel output (q, k, v, the attention output and
    logsumexp, o_proj's input, the three MLP-wide tensors, down_proj's input) is divided by t;
    the RMSNorm tensors and the inputs of q/k/v and gate/up (the norm outputs) are replicated
    (Korthikanti et al. 2022 section 4.2.1). Sequence parallelism (DTensor, as torchtitan and
    transformers' tp_plan run it: SequenceParallel norms, ColwiseParallel with a Shard(1)
    input) splits the norms too, but each column-parallel matmul saves its all-gathered input,
    so the q/k/v and gate/up inputs stay whole (Megatron-LM re-gathers them in the backward
    instead: everything / t). The transient's two hidden-wide gradients are replicated, its
    MLP-wide ones split. The shares are read from the eager layer and applied to compiled or
    fused layers too. Other layer kinds (linear attention, MoE, MLA, eager scores) take Table
    2's ratio."""
    t = layout.tp
    if t == 1:
        return 1.0, 1.0
    dense = (
        spec.geometry_known
        and spec.hidden
        and spec.mla is None
        and not spec.attention_sinks
        and all(lt in (LAYER_FULL, LAYER_SLIDING) for lt in spec.layer_types)
        and all(mt == MLP_DENSE for mt in spec.mlp_types)
        and setup.attention != "eager"
    )
    if not dense:
        if layout.sp:
            return 1.0 / t, 1.0 / t
        ratio = tp_activation_factor(
            layout, attention_score_term(spec, 1.0, setup.attention == "eager")
        )
        return ratio, ratio
    cb = compute_bytes(setup.precision)
    ctx = dataclasses.replace(Context.build(spec, setup, cb), fused=False, compiled=False)
    h, m = spec.hidden or 0, spec.intermediate or 0
    full = layer_activations(ctx, spec, LAYER_FULL, MLP_DENSE).per_token
    gathered = inputs_saved(ctx, ["q_proj", "k_proj", "v_proj", "qkv_proj"], h)
    gathered += inputs_saved(ctx, ["gate_proj", "up_proj", "gate_up_proj", "c_fc"], h)
    whole = gathered if layout.sp else gathered + 2 * rms_norm_saved(ctx, h)
    saved = (whole + (full - whole) / t) / full if full else 1.0
    transient = (2 * h + 2 * m) / t if layout.sp else 2 * h + 2 * m / t
    return saved, transient / (2 * h + 2 * m) if h + m else 1.0


def _head_input_extra(
    spec: ModelSpec, setup: TrainingSetup, profile: Profile, tokens: Any, layout: Layout
) -> Any:
    """What a tp rank keeps of the last norm's and the head's saved inputs beyond the 1/t share
    of `activations.head_input_saved` that the one-device loss carries. The head is
    column-parallel with a replicated input (torch 2.13 tensor/parallel/style.py:114-118
    redistributes a sequence-sharded input to Replicate; torchtitan@004b3148
    torchtitan/parallelisms/parallelize_llama.py:122-126 `"output": ColwiseParallel(
    input_layouts=Shard(1), ...)`), so the matmul saves the whole input on every rank; the
    last norm is sequence-sharded with sp (`"norm": SequenceParallel()`, :121), replicated
    without. The probe stack and a profile's hand rule leave the term out of the one-device
    loss (`model.memory_breakdown`): there the head's whole input is added."""
    if not spec.geometry_known or not spec.hidden:
        return tokens * 0.0
    ctx = Context.build(spec, setup, compute_bytes(setup.precision))
    h, t = spec.hidden, layout.tp
    head = 0.0 if setup.loss in ("liger", "unsloth") else inputs_saved(ctx, ["lm_head"], h)
    norm = head_input_saved(ctx, spec, setup.loss) - head
    counted = setup.stack != "probe" and not profile.get("memory", "logits_bytes_per_logit")
    if not counted:
        return tokens * head
    whole = head + (0.0 if layout.sp else norm)
    return tokens * whole * (1.0 - 1.0 / t)


def _tp_loss_extra(
    spec: ModelSpec, setup: TrainingSetup, profile: Profile, tokens: Any, layout: Layout
) -> Any:
    """What a tp rank's loss phase holds beyond its 1/t share of the one-device loss; 0
    without tensor parallelism: the vocab-parallel loss's extra copies
    (`estimator.memory.logits.loss_parallel_extra_bytes`) and the whole head input
    (`_head_input_extra`). The logits' dtype follows `model.memory_breakdown`."""
    if layout.tp == 1 or not spec.vocab:
        return tokens * 0.0
    cb = compute_bytes(setup.precision)
    stream = stream_bytes(setup, cb)
    dtype = BF16 if setup.autocast and setup.precision != "fp32" else stream
    local = tokens * spec.vocab / layout.tp
    return loss_parallel_extra_bytes(local, setup, profile, dtype) + _head_input_extra(
        spec, setup, profile, tokens, layout
    )


def _activations(
    spec: ModelSpec,
    setup: TrainingSetup,
    base: MemoryBreakdown,
    stage: Stage,
    layout: Layout,
    tokens: Any,
) -> tuple[Any, Any, Any]:
    """(checkpoints, recompute peak, logits) on one device of the stage; the logits without
    a tp rank's loss extra (`_tp_loss_extra`, added by the caller). Under cp the recompute
    peak carries ring attention's backward buffers (estimator/parallel/ring.py), K/V at the
    query heads where the stack repeats them before SDPA (stack fact `sdpa_repeats_kv`)."""
    zero = np.asarray(base.components["overhead"]) * 0.0
    layers = spec.layers or 1
    share = stage.layers / layers * stage.in_flight
    tp_act, tp_transient = _tp_shares(spec, setup, layout)
    c = base.components["checkpoints"]
    c = zero if c is None else np.asarray(c)
    kept = tp_act if setup.checkpointing in ("none", "selective") else checkpoint_factor(layout)
    checkpoints = c * share * kept
    r = base.components["recompute_peak"]
    recompute = zero if r is None else np.asarray(r) * tp_transient
    if layout.cp > 1 and setup.attention != "eager":  # ring attention's backward buffers
        ctx = Context.build(spec, setup, compute_bytes(setup.precision))
        cb = ctx.attn_bytes or ctx.compute_bytes
        repeats = bool(load_stack(setup.stack).get_optional("sdpa_repeats_kv", False))
        recompute = recompute + tokens * ring_backward_extra_per_token(spec, layout, cb, repeats)
    lg = base.components["logits"]
    # GPipe's last rank keeps every micro-batch's loss for its backward (parallel/schedule.py)
    logits = zero if (lg is None or not stage.last) else np.asarray(lg) / layout.tp * stage.losses
    return checkpoints, recompute, logits


def _pipeline_buffers(
    spec: ModelSpec, setup: TrainingSetup, layout: Layout, stage: Stage, tokens: Any
) -> Any:
    """Bytes of the stage-boundary tensors a pipeline rank keeps beyond its layers
    (`schedule.boundary_tensors`): one micro-batch's hidden states each, in the residual
    stream's dtype, sequence-split by tp under sequence parallelism (the block output is
    row-parallel with Shard(1) output layouts in torchtitan's plan) and whole without it."""
    if layout.pp == 1 or not spec.hidden:
        return tokens * 0.0
    m = micro_batches(layout, setup.grad_accum)
    count = boundary_tensors(m, layout.virtual, stage.in_flight, stage.first, stage.last)
    each = tokens * spec.hidden * stream_bytes(setup, compute_bytes(setup.precision))
    return each * count / (layout.tp if layout.sp else 1)


def _kept_outputs(
    spec: ModelSpec, setup: TrainingSetup, layout: Layout, stage: Stage, tokens: Any
) -> Any:
    """Bytes of the model outputs the last pipeline rank keeps until the step ends
    (`schedule.last_stage_outputs_kept`, the stack's fact `pp_keeps_outputs`): one
    micro-batch's logits each, vocab-split by tp (torchtitan's loss-parallel output layer is
    ColwiseParallel with Shard(-1) outputs, torchtitan@9dec370 parallelize_llama.py:129-133),
    in the dtype `_tp_loss_extra` gives the logits."""
    if layout.pp == 1 or not stage.last or not spec.vocab:
        return tokens * 0.0
    keeps = bool(load_stack(setup.stack).get("pp_keeps_outputs"))
    count = last_stage_outputs_kept(micro_batches(layout, setup.grad_accum), keeps)
    cb = compute_bytes(setup.precision)
    dtype = BF16 if setup.autocast and setup.precision != "fp32" else stream_bytes(setup, cb)
    return tokens * spec.vocab / layout.tp * dtype * count


def _stage_name(stage: Stage) -> str:
    if stage.first and stage.last:
        return "only"
    return "first" if stage.first else "last"


class PipelineMoments(NamedTuple):
    """A pipeline rank's extra bytes at its moments (all zero without a pipeline): `held`, the
    fractions of the checkpoints held at the chunk backwards (`schedule.held_at_chunk_backwards`);
    `pipe`, the stage's receive buffers and cached outputs; `loss_accumulated`, the gradients the
    last rank has accumulated at its later losses; `outputs`, the model outputs it keeps."""

    held: tuple[float, float] = (0.0, 0.0)
    pipe: Any = 0.0
    loss_accumulated: float = 0.0
    outputs: Any = 0.0


NO_PIPELINE = PipelineMoments()


class RankPhases(NamedTuple):
    """One rank's memory moments for `_reserved`: its stage and replica, its stream-blind
    `phases`, whether it keeps its outputs (`_kept_outputs`), and FSDP2's `streams` (the
    default stream's phases, the reduce-scatter stream's pool) or None."""

    stage: Stage
    replica: ReplicaBytes
    phases: dict[str, dict[str, Any]]
    outputs_kept: bool = False
    streams: tuple[dict[str, dict[str, Any]], float] | None = None


def _phases(
    dp: DataParallelBytes,
    acts: tuple[Any, Any, Any],
    profile: Profile,
    keep_grads: bool,
    layers: int,
    pipeline: PipelineMoments = NO_PIPELINE,
) -> dict[str, dict[str, Any]]:
    """What is alive at each moment, by part (the same moments as `model._phases`). Under a
    pipeline with FSDP2 the unsharded accumulated gradients exist from the first
    micro-batch's backward on, when that micro-batch's checkpoints are gone: the backward holds
    the larger of all checkpoints and, for each moment of `pipeline.held`
    (`schedule.held_at_chunk_backwards`: the rank's first backward, and chunk 0's first when
    the chunks are reduced one after the other), that fraction of them plus the gradients then
    accumulating (`dp.accumulated`, `dp.accumulated_last`). `loss_accumulated`: the gradients
    a pipeline's last rank has accumulated when it computes its later micro-batches' losses
    (`schedule.accumulated_at_loss`); `outputs`: the model outputs it keeps through the step
    (`_kept_outputs`), alive at every moment from the last micro-batch's loss on."""
    checkpoints, recompute, logits = acts
    held, pipe, loss_accumulated, outputs = pipeline
    zero = checkpoints * 0.0
    states = zero + dp.states + (dp.grads if keep_grads else 0.0)
    if profile.get("memory", "peak_rule") == "sum":
        parts = {
            "weights": zero + dp.weights + dp.backward_extra,
            "trainable_states": zero + dp.states + dp.grads,
            "buckets": zero + dp.persistent,
            "checkpoints": checkpoints,
            "recompute_peak": recompute,
            "logits": logits,
        }
        return {"all": parts}
    made = zero + (0.0 if keep_grads else dp.grads - dp.grads_late)
    held_now = checkpoints
    accumulated = zero
    for fraction, acc in zip(held, (dp.accumulated, dp.accumulated_last), strict=True):
        if not acc:
            continue
        rest = checkpoints * fraction
        later = rest + acc >= held_now + accumulated
        held_now = np.where(later, rest, held_now)
        accumulated = np.where(later, zero + acc, accumulated)
    # Two moments of a unit's backward, the larger counts: while the layer recomputes and runs
    # its backward (the previous unit's reduce-scatter input kept), and after it, when its
    # reduce buffers exist and its own activations (one layer's share) are freed. Both are
    # written against the larger of the checkpoints and the gradients made, so each grows with
    # the sequence (subtracting the layer's share from the recompute term alone did not when
    # the gradients were the larger: found by test_fsdp2_units_monotone_in_sequence_and_ranks).
    per_layer = checkpoints / max(layers, 1)
    counted = np.maximum(held_now, made)
    after_unit = np.maximum(held_now - per_layer, made) + dp.reduce_buffers
    # FSDP2 during a unit's backward: its unsharded gradients are made as its own saved
    # tensors are released (`data.fsdp_bytes`), so they count beyond the layer's share; the
    # previous unit's kept reduce-scatter input outlives that unit's activations (a second
    # layer's share), a separate lm_head's is kept through the first layer's backward
    during = zero
    if dp.unit_grads or dp.reduce_kept or dp.reduce_kept_first:
        own = np.maximum(per_layer, dp.unit_grads)
        first = np.maximum(held_now - per_layer, made) + own + dp.reduce_kept_first
        later = np.maximum(held_now - 2 * per_layer, made) + own + dp.reduce_kept
        during = np.maximum(np.maximum(first, later) - counted, 0.0)
    layer_work = np.maximum(recompute + during, after_unit - counted)
    return {
        "loss": {
            "weights": zero + dp.weights,
            "trainable_states": states,
            "buckets": zero + dp.persistent,
            "unsharded_params": zero + dp.forward_extra,
            "checkpoints": checkpoints,
            "logits": logits,
            "accumulated_grads": zero + loss_accumulated,
            "pipeline_buffers": zero + pipe,
            "pipeline_outputs": zero + outputs,
        },
        "backward": {
            "weights": zero + dp.weights,
            "trainable_states": states,
            "buckets": zero + dp.persistent,
            "unsharded_params_and_grads": zero + dp.backward_extra,
            "checkpoints": np.where(held_now >= made, held_now, 0.0),
            "gradients": np.where(held_now >= made, 0.0, made),
            "accumulated_grads": accumulated,
            "recompute_peak_or_reduce": layer_work,
            "pipeline_buffers": zero + pipe,
            "pipeline_outputs": zero + outputs,
        },
        "end_of_backward": {
            "weights": zero + dp.weights,
            "trainable_states": zero + dp.states + dp.grads,
            "buckets": zero + dp.persistent,
            "root_reduce": zero + dp.end_extra,
            "pipeline_buffers": zero + pipe,
            "pipeline_outputs": zero + outputs,
        },
        "step": {
            "weights": zero + dp.weights,
            "trainable_states": zero + dp.states + dp.grads,
            "buckets": zero + dp.persistent,
            "optimizer_step": zero + dp.step_extra + dp.step_transient,
            "pipeline_outputs": zero + outputs,
        },
    }


def _add_evaluation(
    phases: dict[str, dict[str, Any]], dp: DataParallelBytes, base: MemoryBreakdown, layout: Layout
) -> None:
    """The evaluation moment (memory/evaluation.py) of a data-parallel rank: its sharded
    weights and states (no gradients: zeroed with set_to_none after the step), its persistent
    buckets, the parameters its forward gathers (`forward_extra`), and the one-device pass's
    working set (`base`, at the rank's rows). Only data-parallel layouts reach here with an
    evaluation (setup_rules.check_evaluation); a pipeline's or tensor split's is not modelled."""
    one = base.phases.get("evaluation")
    if one is None:
        return
    unmodelled = eval_split_unmodelled(layout)
    if unmodelled is not None:  # a searched layout (min-gpus, recommend) the rules did not see
        raise EstimatorInputError("setup.eval_batch", unmodelled)
    work = one["evaluation"]
    zero = work * 0.0
    phases["evaluation"] = {
        "weights": zero + dp.weights,
        "trainable_states": zero + dp.states,
        "buckets": zero + dp.persistent,
        "unsharded_params": zero + dp.forward_extra,
        "evaluation": work,
    }


def _reserved(
    spec: ModelSpec,
    setup: TrainingSetup,
    profile: Profile,
    layout: Layout,
    base: MemoryBreakdown,
    rank: RankPhases,
) -> Any:
    """The stage's reserved bytes: its allocated peak with the allocator's slack and holes
    (memory/fragmentation.py, memory/reserved.py). `outputs_kept`: the last rank keeps its
    micro-batches' logits (`_kept_outputs`), so they leave no hole at the loss's backward
    (fragmentation.py 1: a held model output is allocated, not a hole). `streams`: FSDP2's
    (default stream's phases, reduce-scatter stream's pool) (fragmentation.py 5): the pools
    add up, so the default stream's peak and loss phase count with that pool, in place of the
    stream-blind `phases`."""
    stage, replica, phases, outputs_kept, streams = rank
    allocated = _largest(phases)
    default, reduce_pool = streams if streams is not None else (phases, 0.0)
    # the allocator's per-tensor slack on the tensors as the layout shards them: FSDP2 / ZeRO-3
    # over the shard group (the same rule the one-device model applies to `sharding`), so a
    # legacy `sharding` alias and its `parallel` layout are one model
    sharded_kind = layout.data if layout.data in ("fsdp", "zero3") else "none"
    slack_setup = setup.model_copy(update={"sharding": sharded_kind, "parallel": None})
    slack = (
        allocator_slack(spec, slack_setup, allocated, shard_degree(layout))
        if profile.get("memory", "count_allocator_slack")
        else 0.0
    )
    # the loss's hole and the last layer's cached forward (memory/fragmentation.py 1, 3)
    hole = last_rank_holes(spec, setup, layout, base, outputs_kept) if stage.last else 0.0
    pool = (
        gather_pool_bytes(setup, profile, replica.root_weights, replica.unit_weights)
        if layout.data == "fsdp"  # fully_shard all-gathers through the buffers on 1 rank too
        else 0.0
    )
    # the pool of FSDP2's reduce-scatter stream adds to the default stream's peak, which is
    # at least the allocated peak less the gradients the stream-blind phases let share the
    # checkpoints' blocks; the larger of the two (the stream-blind end of the backward also
    # counts a reduce output that is its own sharded gradient twice, data.py `end_outputs`)
    peak = np.maximum(allocated, _largest(default) + reduce_pool)
    loss_phase = sum(default["loss"].values()) + reduce_pool if "loss" in default else peak
    return reserved_with_fragmentation(peak, loss_phase, hole, pool, slack)


def last_rank_holes(
    spec: ModelSpec, setup: TrainingSetup, layout: Layout, base: MemoryBreakdown, kept: bool
) -> Any:
    """Bytes cached and unusable at the loss on a rank that runs it (fragmentation.py 1, 3).
    The loss's hole is a vocab-parallel logits tensor: 1/t of the one-device one (none when
    the rank keeps its outputs, `kept`). The last layer's forward leaves what its recompute
    would keep on this rank cached (fragmentation.py 3): the tp rank's share of the layer's
    saved activations (`_tp_shares`), not 1/t of them, because under sequence parallelism
    each column-parallel matmul's input is the all-gathered norm output, whole on every rank
    (torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py:175-190: "attention" and
    "feed_forward" get prepare_module_input(input_layouts=Shard(1), desired_input_layouts=
    Replicate()), the all-gather's output feeding wq/wk/wv and w1/w3), and without it the
    norms are replicated too. Before i10titan the whole cache was divided by t."""
    loss_hole = 0.0 if kept else np.asarray(base.loss_hole)
    share = _tp_shares(spec, setup, layout)[0]
    return loss_hole / layout.tp + np.asarray(base.forward_cache) * share


def _largest(phases: dict[str, dict[str, Any]]) -> Any:
    totals = [sum(parts.values()) for parts in phases.values()]
    worst = totals[0]
    for total in totals[1:]:
        worst = np.maximum(worst, total)
    return worst


def layout_breakdown(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq_len: Any,
    batch: Any,
    profile: Profile,
    layout: Layout,
) -> MemoryBreakdown:
    """Per-device memory of the worst device under `layout` (module docstring)."""
    # the one-device breakdown of the sequences a micro-batch runs (a DPO pair's two,
    # estimator/objective.py), its reference weights added here, sharded as the policy's
    local = setup.model_copy(
        update={"parallel": None, "sharding": "none", "num_gpus": 1, "objective": "sft"}
    )
    batch = sequences(batch, setup)
    seq = np.asarray(seq_len, dtype=np.float64)
    local_seq = np.ceil(seq / layout.cp)
    tokens = local_seq * np.asarray(batch, dtype=np.float64)
    with masters_layout(True):  # layouts keep bf16 copies of fp32 masters (weights.amp_full)
        base = memory_breakdown(spec, local, local_seq, batch, profile, devices=1)
    overhead = np.asarray(base.components["overhead"]) + nccl_buffer_bytes(layout)
    workspaces = workspaces_in(base.phases)  # each rank's own (memory/workspaces.py)
    # gradients accumulate over micro-batches: grad_accum, or a pipeline's micro-batches
    keep = (setup.grad_accum or 1) > 1 or layout.pp > 1
    m = micro_batches(layout, setup.grad_accum)
    # FSDP2 reduces each stage at its own last backward (parallel/schedule.py reduced_per_chunk)
    per_chunk = reduced_per_chunk(layout.schedule, m, layout.pp, layout.virtual)
    chunks = layout.virtual if per_chunk else 1
    best: tuple[Any, dict[str, Any], DataParallelBytes, Any, Stage, Any, Any] | None = None
    for stage in stages(spec, layout, setup.grad_accum):
        replica = _replica(spec, setup, base, stage, layout)
        dp = data_parallel_bytes(
            replica,
            layout,
            reduce_bytes(setup),
            chunks,
            bool(load_stack(setup.stack).get("pp_keeps_last_reduce_input")),
        )
        dp = torchtitan.fsdp_units(dp, replica, layout, reduce_bytes(setup), setup)
        if reference_weights_held(setup):  # prepared as the policy (trl dpo_trainer.py:984-990)
            dp = dataclasses.replace(dp, weights=2 * dp.weights)
        # RoPE buffers (weights.rope_buffer_bytes): FSDP2 shards parameters, not buffers
        dp = dataclasses.replace(dp, weights=dp.weights + rope_buffer_bytes(spec, setup))
        acts = _activations(spec, setup, base, stage, layout, tokens)
        if stage.last:
            acts = (
                acts[0],
                acts[1],
                acts[2] + _tp_loss_extra(spec, setup, profile, tokens, layout),
            )
        pipe = _pipeline_buffers(spec, setup, layout, stage, tokens)
        held = held_at_chunk_backwards(m, layout.virtual, stage.in_flight)
        at_loss = accumulated_at_loss(layout.schedule, m, layout.pp) and stage.last
        outputs = _kept_outputs(spec, setup, layout, stage, tokens)
        moments = PipelineMoments(held, pipe, dp.accumulated if at_loss else 0.0, outputs)
        phases = _phases(dp, acts, profile, keep, stage.layers, moments)
        _add_evaluation(phases, dp, base, layout)
        torchtitan.add_rope_cache(phases, spec, setup, seq)
        add_workspaces(phases, workspaces)
        streams = None
        if layout.data == "fsdp" and counts_fragmentation(setup, profile):
            # fragmentation.py (5): the default stream's bytes, and the reduce-scatter pool
            default_dp = default_stream_bytes(dp)
            default = _phases(default_dp, acts, profile, keep, stage.layers, moments)
            _add_evaluation(default, default_dp, base, layout)
            torchtitan.add_rope_cache(default, spec, setup, seq)
            add_workspaces(default, workspaces)  # the default stream's, per thread
            streams = (default, reduce_pool_bytes(setup, profile, dp.reduce_stream))
        allocated = _largest(phases)
        host = np.asarray(base.host) * stage.layers / (spec.layers or 1) + dp.host
        components = {
            "weights": overhead * 0.0 + dp.weights + dp.forward_extra,
            "trainable_states": overhead * 0.0 + dp.states + dp.grads,
            "checkpoints": acts[0],
            "recompute_peak": acts[1],
            "logits": acts[2],
            "overhead": overhead,
        }
        kept = bool(np.any(np.asarray(outputs) > 0))
        rank = RankPhases(stage, replica, phases, kept, streams)
        reserved = _reserved(spec, setup, profile, layout, base, rank)
        # the worst rank by what the caching allocator holds (torchtitan's benchmark takes the
        # maximum of max_memory_reserved over all GPUs, llama3_h100_202412_torchtitan.md
        # footnote 1); the last rank's loss holes count only there
        if best is None or float(np.max(reserved)) > float(np.max(best[6])):
            best = (allocated, components, dp, host, stage, phases, reserved)
    assert best is not None
    allocated, components, dp, host, stage, phases, reserved = best
    n = layout.gpus
    detail = {
        "layout": layout.text,
        "gpus": n,
        "stage": _stage_name(stage),
        **(
            {
                "pp_schedule": layout.schedule,
                "pp_virtual": layout.virtual,
                "in_flight": stage.in_flight,
            }
            if layout.pp > 1
            else {}
        ),
        "nccl_buffer_bytes": nccl_buffer_bytes(layout),
        "nccl_channels_assumed": ASSUMED_CHANNELS,
        **{k: float(v) for k, v in dp.terms.items()},
    }
    return MemoryBreakdown(
        components,
        host,
        reserved + overhead,
        n,
        layout.text,
        base.states,
        base.not_computable,
        allocated,
        reserved,
        phases=phases,
        parallel=detail,
    )
