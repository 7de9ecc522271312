"""Per-device memory under --parallel layouts: each term's behaviour, from the sourced rules."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.memory.weights import masters_layout
from estimator.parallel.split import param_groups
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
LLAMA70B = spec_from_config(preset_config("llama-3.1-70b"))
DEFAULT = load_profile("default")
GIB = 2**30


def _mem(spec, gpus: int, seq: int = 4096, **setup):
    s = TrainingSetup(num_gpus=gpus, **setup)
    return memory_breakdown(spec, s, [seq], 1, DEFAULT, devices=gpus)


def _peak(mem) -> float:
    return float(mem.peak[0])


def test_ddp_keeps_a_full_replica_plus_a_gradient_sized_bucket() -> None:
    # the hf stack's one-card `mixed` is AMP; layouts keep bf16 weights + fp32 masters
    with masters_layout(True):
        one = _mem(LLAMA8B, 1, method="full")
    ddp = _mem(LLAMA8B, 8, method="full", parallel="dp")
    grads = one.states.grads
    assert ddp.parallel["ddp_buckets"] == pytest.approx(grads)
    # same per-device model as one card, plus the buckets and NCCL's buffers
    extra = float(ddp.allocated[0] - one.allocated[0])
    assert extra == pytest.approx(grads, rel=0.01)


def test_fsdp2_root_unit_stays_unsharded_with_its_gradients() -> None:
    mem = _mem(LLAMA70B, 16, method="full", parallel="fsdp")
    embed, head, _, _ = param_groups(LLAMA70B)
    assert mem.parallel["fsdp_root_unsharded"] == pytest.approx((embed + head) * 2)
    assert mem.parallel["fsdp_root_grads_unsharded"] == pytest.approx((embed + head) * 2)
    # fp32 sharded parameters (16 bytes/param of Adam over 16 ranks, fp32 shard included)
    assert mem.parallel["fsdp_sharded_params"] == pytest.approx(4 * LLAMA70B.params_total / 16)


def test_fsdp2_70b_full_fine_tuning_on_16_h100_at_4k_does_not_fit() -> None:
    """The issue's case: 80 GiB H100s (capacity 79.6 GiB, 73.3 usable), HF default wrapping:
    the root unit, two gathered layers and the reduce buffers take it over the budget."""
    mem = _mem(LLAMA70B, 16, method="full", parallel="fsdp")
    assert _peak(mem) > 0.92 * 85520809984


def test_reshard_after_forward_false_keeps_every_unit_unsharded() -> None:
    on = _mem(LLAMA8B, 8, method="full", parallel="fsdp")
    off = _mem(LLAMA8B, 8, method="full", parallel="fsdp", reshard_after_forward=False)
    assert off.parallel["fsdp_gathered_units"] > 10 * on.parallel["fsdp_gathered_units"]
    assert _peak(off) > _peak(on)


def test_bigger_fsdp_units_gather_more() -> None:
    one = _mem(LLAMA8B, 8, method="full", parallel="fsdp")
    four = _mem(LLAMA8B, 8, method="full", parallel="fsdp", fsdp_wrap="block-of-4")
    assert four.parallel["fsdp_gathered_units"] == pytest.approx(
        4 * one.parallel["fsdp_gathered_units"]
    )


def test_embedding_and_head_as_units_of_their_own_leave_the_root() -> None:
    """torchtune's custom_sharded_layers ['tok_embeddings', 'output'] (70B_full.yaml): each is
    an FSDP2 unit resharded after forward, so neither stays unsharded through the backward;
    the root keeps nothing of them, and the lm_head's gradient is freed after its backward."""
    embed, head, _, _ = param_groups(LLAMA70B)
    root = _mem(LLAMA70B, 8, method="full", parallel="fsdp", precision="bf16", stack="torchtune")
    both = _mem(
        LLAMA70B,
        8,
        method="full",
        parallel="fsdp",
        precision="bf16",
        stack="torchtune",
        fsdp_wrap="layer+embeddings+lm_head",
    )
    assert root.parallel["fsdp_root_unsharded"] == pytest.approx((embed + head) * 2)
    assert both.parallel["fsdp_root_unsharded"] == pytest.approx(0.0, abs=1.0)
    assert both.parallel["fsdp_separate_units_unsharded"] == pytest.approx((embed + head) * 2)
    assert both.parallel["fsdp_root_grads_unsharded"] == pytest.approx(0.0, abs=1.0)
    # the loss phase loses the whole root; the unit the root's pre-backward prefetches is the
    # lm_head's (the last to run forward), regathered with the last layer prefetched for its
    # own backward, in place of the one layer unit
    layer = (LLAMA70B.params_total - embed - head) / LLAMA70B.layers
    assert root.parallel["fsdp_gathered_at_loss"] == pytest.approx(layer * 2)
    assert both.parallel["fsdp_gathered_at_loss"] == pytest.approx((head + layer) * 2)
    loss = sum(root.phases["loss"].values()) - sum(both.phases["loss"].values())
    assert float(loss[0]) == pytest.approx((embed + head) * 2 + layer * 2 - (head + layer) * 2)
    assert _peak(both) < _peak(root) - head * 2 * 0.99
    # the lm_head alone: the embedding stays in the root
    head_only = _mem(
        LLAMA70B, 8, method="full", parallel="fsdp", precision="bf16", fsdp_wrap="layer+lm_head"
    )
    assert head_only.parallel["fsdp_root_unsharded"] == pytest.approx(embed * 2)


def test_fsdp2_keeps_the_last_reduce_scatter_input_through_the_next_layers_backward() -> None:
    """ReduceScatterState: one unit's gradients in the reduce dtype (fp32 under torchtitan's
    MixedPrecisionPolicy) stay allocated while the next layer recomputes and runs backward,
    beside that layer's own bf16 gradients; each beyond the one layer's checkpoint that its
    unit's backward has released."""
    embed, head, _, _ = param_groups(LLAMA8B)
    layer = (LLAMA8B.params_total - embed - head) / LLAMA8B.layers
    # the root unit (torchtitan@9dec370's wrapping; 0.3.0 wraps the lm_head on its own)
    mem = _mem(LLAMA8B, 8, method="full", parallel="fsdp", stack="torchtitan", fsdp_wrap="layer")
    assert mem.parallel["fsdp_reduce_scatter_input_kept"] == pytest.approx(layer * 4, rel=1e-6)
    work = float(mem.phases["backward"]["recompute_peak_or_reduce"][0])
    recompute = float(mem.components["recompute_peak"][0])
    per_layer = float(mem.components["checkpoints"][0]) / LLAMA8B.layers
    assert 0 < per_layer < layer * 2  # activation checkpointing: the layer's input only
    expected = recompute + (layer * 4 - per_layer) + (layer * 2 - per_layer)
    assert work == pytest.approx(expected, rel=1e-6)
    # with the lm_head a unit of its own, its (larger) input is the one kept first
    sep = _mem(
        LLAMA8B, 8, method="full", parallel="fsdp", stack="torchtitan", fsdp_wrap="layer+lm_head"
    )
    assert sep.parallel["fsdp_reduce_scatter_input_kept"] == pytest.approx(head * 4, rel=1e-6)


def test_separate_units_without_reshard_stay_gathered_like_the_root() -> None:
    kept = _mem(
        LLAMA8B,
        8,
        method="full",
        parallel="fsdp",
        reshard_after_forward=False,
        fsdp_wrap="layer+embeddings+lm_head",
    )
    root = _mem(LLAMA8B, 8, method="full", parallel="fsdp", reshard_after_forward=False)
    loss_kept = float(sum(kept.phases["loss"].values())[0])
    assert loss_kept == pytest.approx(float(sum(root.phases["loss"].values())[0]), rel=1e-9)


def test_fsdp2_root_unit_over_a_quantized_base_is_gathered_in_bf16() -> None:
    """QLoRA: the quantizer replaces the layers' Linear weights only; the embedding and the
    lm_head the root unit gathers whole stay bf16 (2 bytes/param), not the NF4-averaged
    bytes; the layers' units carry the rest, so the one-device total is unchanged."""
    embed, head, _, _ = param_groups(LLAMA70B)
    mem = _mem(LLAMA70B, 8, method="qlora", parallel="fsdp", stack="torchtune")
    assert mem.parallel["fsdp_root_unsharded"] == pytest.approx((embed + head) * 2)
    # two gathered NF4 layer units: about 0.52 bytes/param (4 bits + scales), far from 2
    layer = (LLAMA70B.params_total - embed - head) / LLAMA70B.layers
    per_param = mem.parallel["fsdp_gathered_units"] / (2 * layer)
    assert 0.5 < per_param < 0.56


def test_zero3_matches_deepspeeds_own_estimator_for_model_states() -> None:
    """estimate_zero3_model_states_mem_needs: 4 x largest layer + 18 P / N (no offload); ours
    adds the prefetch bucket and the reduce bucket on top, nothing is missing."""
    n = 8
    mem = _mem(LLAMA8B, n, method="full", parallel="zero3")
    embed, head, _, _ = param_groups(LLAMA8B)
    deepspeed = 4 * max(embed, head) + 18 * LLAMA8B.params_total / n
    model_states = (
        float(mem.allocated[0])
        - float(mem.components["checkpoints"][0])
        - float(mem.components["recompute_peak"][0])
    )
    assert model_states >= deepspeed * 0.98


def test_zero_optimizer_offload_moves_the_states_to_the_host() -> None:
    on = _mem(LLAMA8B, 8, method="full", parallel="zero3")
    off = _mem(LLAMA8B, 8, method="full", parallel="zero3", offload="optimizer")
    assert _peak(off) < _peak(on) - 10 * GIB
    assert float(off.host[0]) >= 16 * LLAMA8B.params_total / 8 * 0.99


def test_offload_needs_a_layout_that_can_do_it() -> None:
    with pytest.raises(EstimatorInputError, match="stage 3"):
        _mem(LLAMA8B, 8, method="full", parallel="zero2", offload="params")
    with pytest.raises(EstimatorInputError, match="CPUOffloadPolicy"):
        _mem(LLAMA8B, 8, method="full", parallel="fsdp", offload="optimizer")


def test_sequence_parallelism_splits_what_plain_tensor_parallelism_replicates() -> None:
    tp = _mem(LLAMA8B, 8, method="full", precision="bf16", parallel="tp=8", checkpointing="none")
    sp = _mem(LLAMA8B, 8, method="full", precision="bf16", parallel="tp=8,sp", checkpointing="none")
    one = _mem(LLAMA8B, 1, method="full", precision="bf16", checkpointing="none")
    c1 = float(one.components["checkpoints"][0])
    c_tp, c_sp = float(tp.components["checkpoints"][0]), float(sp.components["checkpoints"][0])
    # plain tp keeps the norms and the q/k/v and gate/up inputs whole (Korthikanti 4.2.1);
    # DTensor's sequence parallelism splits the norms but saves the all-gathered inputs
    assert c1 / 8 < c_sp < c_tp < c1 * 0.5
    ckpt_tp = _mem(LLAMA8B, 8, method="full", parallel="tp=8", checkpointing="gpu")
    ckpt_sp = _mem(LLAMA8B, 8, method="full", parallel="tp=8,sp", checkpointing="gpu")
    # a checkpointed layer input is sequence-sharded under sp, whole under plain tp
    assert float(ckpt_sp.components["checkpoints"][0]) == pytest.approx(
        float(ckpt_tp.components["checkpoints"][0]) / 8
    )


def test_tp_loss_phase_holds_four_fp32_logit_copies_and_the_whole_head_input() -> None:
    """torch's loss_parallel backward (tensor/parallel/loss.py:470, :518) keeps the saved
    log-probabilities, zeros_like, exp and their sum: 16 bytes per local logit where the
    one-device kernels peak at 12 (3 fp32 copies). The column-parallel lm_head saves its
    replicated (all-gathered) input: tokens x hidden in the activation dtype on every rank,
    where the one-device loss's share carries 1/t of it."""
    seq, tp = 4096, 8
    head_input = seq * LLAMA8B.hidden * 2 * (1 - 1 / tp)  # bf16 activations
    one = _mem(LLAMA8B, 1, seq=seq, method="full", precision="bf16", loss="full")
    par = _mem(
        LLAMA8B, tp, seq=seq, method="full", precision="bf16", loss="full", parallel=f"tp={tp},sp"
    )
    local = seq * LLAMA8B.vocab / tp
    share = float(one.components["logits"][0]) / tp
    assert float(par.components["logits"][0]) - share == pytest.approx(
        local * 4 + head_input, rel=1e-6
    )
    # a loss that never decomposes log_softmax on the shard adds only the head's input
    one_c = _mem(LLAMA8B, 1, seq=seq, method="full", precision="bf16", loss="chunked")
    par_c = _mem(
        LLAMA8B,
        tp,
        seq=seq,
        method="full",
        precision="bf16",
        loss="chunked",
        parallel=f"tp={tp},sp",
    )
    assert float(par_c.components["logits"][0]) - float(
        one_c.components["logits"][0]
    ) / tp == pytest.approx(head_input, rel=1e-6)


def test_context_parallelism_splits_the_sequence() -> None:
    one = _mem(LLAMA8B, 1, seq=32768, method="full", precision="bf16", checkpointing="gpu")
    cp = _mem(
        LLAMA8B,
        4,
        seq=32768,
        method="full",
        precision="bf16",
        parallel="cp=4,dp=1",
        checkpointing="gpu",
    )
    assert float(cp.components["checkpoints"][0]) == pytest.approx(
        float(one.components["checkpoints"][0]) / 4, rel=0.01
    )


def test_pipeline_first_stage_holds_pp_micro_batches_of_its_layers() -> None:
    from estimator.parallel.of_setup import layout_of
    from estimator.parallel.split import stages

    setup = TrainingSetup(num_gpus=4, method="full", precision="bf16", parallel="pp=4")
    layout = layout_of(setup, 4)
    assert layout is not None
    first, last = stages(LLAMA8B, layout, None)
    assert (first.layers, first.in_flight) == (8, 4)  # 8 of 32 layers, 4 micro-batches
    assert (last.layers, last.in_flight) == (8, 1)
    one = _mem(LLAMA8B, 1, method="full", precision="bf16", checkpointing="gpu")
    pp = _mem(LLAMA8B, 4, method="full", precision="bf16", parallel="pp=4", checkpointing="gpu")
    # the last rank peaks: the loss of a later micro-batch runs with the gradients the earlier
    # ones accumulated (torch pipelining keeps them across micro-batches)
    assert pp.parallel["stage"] == "last"
    assert float(pp.components["checkpoints"][0]) == pytest.approx(
        float(one.components["checkpoints"][0]) / 4, rel=0.01
    )
    assert float(pp.components["logits"][0]) > 0.0  # the loss is on the last stage


def test_more_fsdp_ranks_never_use_more_memory_per_device() -> None:
    peaks = [_peak(_mem(LLAMA8B, n, method="full", parallel="fsdp")) for n in (2, 4, 8, 16)]
    assert peaks == sorted(peaks, reverse=True)


def test_lora_under_ddp_costs_little_more_than_one_card() -> None:
    one = _mem(LLAMA8B, 1, method="lora")
    ddp = _mem(LLAMA8B, 8, method="lora", parallel="dp")
    assert _peak(ddp) - _peak(one) < 0.5 * GIB


@pytest.mark.parametrize("kind", ["fsdp", "zero1", "zero2", "zero3"])
def test_legacy_sharding_is_an_alias_of_the_layout(kind: str) -> None:
    import gpu_catalog
    from estimator.scenario import Scenario
    from estimator.time.step import step_time

    legacy = TrainingSetup(method="full", sharding=kind, num_gpus=8)
    layout = TrainingSetup(method="full", parallel=kind, num_gpus=8)
    a = memory_breakdown(LLAMA8B, legacy, [4096], 1, DEFAULT, devices=8)
    b = memory_breakdown(LLAMA8B, layout, [4096], 1, DEFAULT, devices=8)
    assert float(a.peak[0]) == float(b.peak[0])
    assert a.parallel is not None and a.parallel["layout"] == f"{kind}=8"
    card = gpu_catalog.get_gpu("h100")
    ta = step_time(Scenario(LLAMA8B, legacy, DEFAULT, 4096, 1, gpu=card, count=8))
    tb = step_time(Scenario(LLAMA8B, layout, DEFAULT, 4096, 1, gpu=card, count=8))
    assert ta.step_seconds == tb.step_seconds and ta.sharding == f"{kind}=8"
    # device_map keeps its own model (no layout)
    split = TrainingSetup(method="full", sharding="device_map", num_gpus=8)
    assert memory_breakdown(LLAMA8B, split, [4096], 1, DEFAULT, devices=8).parallel is None


def test_tp_last_layer_forward_cache_keeps_the_all_gathered_inputs_whole() -> None:
    """fragmentation.py (3) on a tp rank: the last layer's forward leaves cached what its
    recompute would keep there. Under sequence parallelism the attention's and the MLP's
    inputs are all-gathered norm outputs (torchtitan's PrepareModuleInput(Shard(1) ->
    Replicate())), tokens x hidden each on every rank, so the cache is at least those two
    tensors, not 1/t of the one-device layer's; the vocab-parallel loss hole is 1/t."""
    from estimator.memory.sharded import last_rank_holes
    from estimator.parallel.of_setup import layout_of

    seq, tp = 8192, 8
    setup = TrainingSetup(
        stack="torchtitan-2024",
        method="full",
        precision="bf16",
        checkpointing="gpu",
        loss="full",
        num_gpus=tp,
        parallel=f"tp={tp},sp",
    )
    layout = layout_of(setup, tp)
    assert layout is not None
    local = setup.model_copy(update={"parallel": None, "num_gpus": 1})
    base = memory_breakdown(LLAMA8B, local, [seq], 1, DEFAULT, devices=1)
    cache = float(base.forward_cache[0])
    hole = float(last_rank_holes(LLAMA8B, setup, layout, base, False)[0])
    gathered = 2 * seq * LLAMA8B.hidden * 2  # two all-gathered bf16 norm outputs
    assert cache > gathered
    # the gathered inputs whole, every other saved tensor of the layer split t ways
    assert hole - float(base.loss_hole[0]) / tp == pytest.approx(
        gathered + (cache - gathered) / tp, rel=1e-6
    )
    # a kept model output leaves no loss hole
    assert float(last_rank_holes(LLAMA8B, setup, layout, base, True)[0]) == pytest.approx(
        hole - float(base.loss_hole[0]) / tp
    )
