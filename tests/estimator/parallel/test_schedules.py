"""Pipeline schedules (--pp-schedule): micro-batches in flight per rank, bubble, boundary sends
and buffers, read from torch's schedules (estimator/parallel/schedule.py), and their bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.parallel import check_model
from estimator.parallel.of_setup import layout_of
from estimator.parallel.schedule import (
    accumulated_at_loss,
    boundary_sends,
    boundary_tensors,
    bubble,
    held_at_chunk_backwards,
    in_flight,
    interleaved_warmup_ops,
    last_stage_outputs_kept,
    reduced_per_chunk,
    rounds,
)
from estimator.parallel.split import Stage, stages
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
DEFAULT = load_profile("default")
ROOT = Path(__file__).resolve().parents[3]


def _mem(gpus: int, **setup):
    s = TrainingSetup(num_gpus=gpus, method="full", precision="bf16", checkpointing="gpu", **setup)
    return memory_breakdown(LLAMA8B, s, [4096], 1, DEFAULT, devices=gpus)


def _torch_interleaved_in_flight(m: int, p: int, v: int, rank: int) -> int:
    """Replay torch's `_get_1f1b_rank_ops` op order for one rank: count chunk forwards alive
    (forward adds one, backward frees one) and return the most."""
    warmup = interleaved_warmup_ops(m, p, v, rank)
    total = m * v
    alive = best = 0
    for op in range(total):
        if op < warmup:
            alive += 1
        else:
            if op < total:  # 1F1B phase: the forward is appended before the backward
                alive += 1
                best = max(best, alive)
                alive -= 1
        best = max(best, alive)
    return best


def test_1f1b_holds_p_minus_rank_and_gpipe_all() -> None:
    assert [in_flight("1f1b", 8, 4, 1, r) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight("1f1b", 2, 4, 1, 0) == 2  # fewer micro-batches than stages
    assert in_flight("gpipe", 8, 4, 1, 0) == in_flight("gpipe", 8, 4, 1, 3) == 8


@pytest.mark.parametrize(("m", "p", "v"), [(8, 4, 2), (16, 4, 2), (8, 8, 2), (12, 4, 3)])
def test_interleaved_in_flight_matches_the_op_order_and_megatrons_penalty(m, p, v) -> None:
    for rank in range(p):
        assert in_flight("interleaved-1f1b", m, p, v, rank) * v == _torch_interleaved_in_flight(
            m, p, v, rank
        )
    if m > p:  # Megatron theoretical_memory_usage: p (1 + (p - 1) / (p v)) on the first rank
        assert in_flight("interleaved-1f1b", m, p, v, 0) == pytest.approx(
            p * (1 + (p - 1) / (p * v))
        )


def test_bubble_and_sends_shrink_and_grow_with_virtual_stages() -> None:
    assert bubble("1f1b", 8, 4, 1) == bubble("gpipe", 8, 4, 1) == pytest.approx(3 / 8)
    assert bubble("interleaved-1f1b", 8, 4, 2) == pytest.approx(3 / 16)
    assert boundary_sends("interleaved-1f1b", 8, 2) == 2 * boundary_sends("1f1b", 8, 1)
    assert bubble("1f1b", 8, 1, 1) == 0.0


def test_boundary_buffers_first_middle_last() -> None:
    # 1F1B, m=4: the first rank keeps 4 gradient buffers + 4 cached outputs; the last keeps 4
    # input buffers, one of which is its in-flight micro-batch's first-layer input
    assert boundary_tensors(4, 1, 4.0, True, False) == 8
    assert boundary_tensors(4, 1, 1.0, False, True) == 3


def test_gpipe_holds_more_than_1f1b_and_interleaved_more_on_the_first_rank() -> None:
    def first_rank(schedule: str) -> Stage:
        s = TrainingSetup(num_gpus=4, parallel="pp=4", grad_accum=8, pp_schedule=schedule)
        layout = layout_of(s, 4)
        assert layout is not None
        return stages(LLAMA8B, layout, 8)[0]

    one, gpipe, inter = (first_rank(s) for s in ("1f1b", "gpipe", "interleaved-1f1b"))
    assert (one.in_flight, gpipe.in_flight) == (4, 8)
    assert inter.in_flight == pytest.approx(4 * (1 + 3 / 8))  # 4 (1 + 3/(4 x 2))
    assert one.layers == inter.layers == 8  # 2 chunks of 4 layers
    peaks = [
        float(_mem(4, parallel="pp=4", grad_accum=8, pp_schedule=s).peak[0])
        for s in ("1f1b", "interleaved-1f1b", "gpipe")
    ]
    assert peaks == sorted(peaks)
    inter_mem = _mem(4, parallel="pp=4", grad_accum=8, pp_schedule="interleaved-1f1b")
    assert inter_mem.parallel["pp_schedule"] == "interleaved-1f1b"
    assert inter_mem.parallel["pp_virtual"] == 2


def test_fsdp_under_a_pipeline_keeps_units_unsharded_and_accumulates_gradients() -> None:
    plain = _mem(8, parallel="fsdp=4,pp=2")
    assert plain.parallel["fsdp_pipeline_accumulated_grads"] > 0
    assert plain.phases is not None
    assert "accumulated_grads" in plain.phases["backward"]


def _torch_replay_with_reduce(m: int, p: int, v: int, rank: int) -> list[tuple[str, int]]:
    """torch's own interleaved op order for `rank` with its REDUCE_GRAD actions
    (ScheduleInterleaved1F1B._calculate_single_rank_operations + _add_reduce_grad), as
    (F | B | REDUCE_GRAD, local chunk)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    from types import SimpleNamespace

    per_round = m // rounds(m, p)
    fake = SimpleNamespace(
        n_local_stages=v, microbatches_per_round=per_round, pp_group_size=p, _n_microbatches=m
    )
    ops = schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations(fake, rank)
    ops = schedules._add_reduce_grad(ops, m)
    return [(a.computation_type.name, a.stage_index // p) for a in ops if a is not None]


@pytest.mark.parametrize(
    ("m", "p", "v"), [(8, 8, 2), (8, 4, 2), (4, 4, 3), (12, 8, 2), (16, 4, 2), (12, 4, 3)]
)
def test_interleaved_chunks_are_reduced_apart_in_torchs_op_order(m, p, v) -> None:
    """Replaying torch 2.13's order: with one round each chunk's REDUCE_GRAD comes before the
    next chunk's first backward (one chunk's unsharded gradients at a time), the first backward
    is chunk v - 1's at the in-flight peak, and chunk 0's first leaves m - 1 micro-batches;
    with more rounds every chunk accumulates at once."""
    for rank in range(p):
        alive = most = 0
        accumulating: set[int] = set()
        after_first_b: dict[int, int] = {}
        first_chunk = None
        for kind, chunk in _torch_replay_with_reduce(m, p, v, rank):
            if kind == "FORWARD":
                alive += 1
            elif kind == "FULL_BACKWARD":
                alive -= 1
                first_chunk = chunk if first_chunk is None else first_chunk
                after_first_b.setdefault(chunk, alive)
                accumulating.add(chunk)
                most = max(most, len(accumulating))
            elif kind == "REDUCE_GRAD":
                accumulating.discard(chunk)
        assert first_chunk == v - 1
        assert reduced_per_chunk("interleaved-1f1b", m, p, v) == (most == 1)
        chunks = in_flight("interleaved-1f1b", m, p, v, rank) * v
        first, last = held_at_chunk_backwards(m, v, chunks / v)
        assert first * chunks == pytest.approx(after_first_b[v - 1])
        if most == 1:
            assert last * chunks == pytest.approx(after_first_b[0])
        else:
            assert most == v
    assert not reduced_per_chunk("1f1b", m, p, 1)


def _only_stage(monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    """Evaluate one pipeline rank (`first` or `last`) instead of the worst of the two."""
    import estimator.memory.sharded as sharded

    def one(*args: object) -> list[Stage]:
        both = stages(*args)  # type: ignore[arg-type]
        return [s for s in both if (s.first if which == "first" else s.last)][:1]

    monkeypatch.setattr(sharded, "stages", one)


def test_interleaved_holds_one_chunks_accumulated_gradients_and_1f1b_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FSDP2 under PP: torch reduces each stage at its own last backward, so interleaved's
    backward peak holds 1/v of the rank's layer gradients (the first-backwarded chunk), not all
    of them; 1F1B's single stage, and interleaved with two rounds, hold all of them (the first
    rank; the last rank's loss with its accumulated gradients is the worse here)."""
    _only_stage(monkeypatch, "first")

    def mem(schedule: str, accum: int | None = None):
        s = TrainingSetup(
            num_gpus=8,
            method="full",
            precision="bf16",
            checkpointing="gpu",
            parallel="fsdp=2,pp=4",
            pp_schedule=schedule,
            grad_accum=accum,
        )
        b = memory_breakdown(LLAMA8B, s, [4096], 1, DEFAULT, devices=8)
        assert b.phases is not None
        acc = float(b.phases["backward"]["accumulated_grads"][0])
        end = float(b.phases["end_of_backward"]["root_reduce"][0])
        return acc, end, float(b.peak[0]), b.parallel["stage"]

    one_acc, one_end, one_peak, stage = mem("1f1b")
    inter_acc, inter_end, inter_peak, inter_stage = mem("interleaved-1f1b")
    two_rounds_acc, *_ = mem("interleaved-1f1b", 8)
    # both schedules give each rank 8 of the 32 layers (1F1B: 8; interleaved: 2 chunks of 4)
    layer_grads = 8 * 218_112_000 * 2  # llama-3.1-8b decoder layer, bf16 reduce dtype
    embed = 128_256 * 4096 * 2  # the first rank's embedding, in chunk 0 (stage 0)
    assert stage == inter_stage == "first"
    assert one_acc == pytest.approx(layer_grads + embed, rel=1e-3)
    assert two_rounds_acc == pytest.approx(one_acc, rel=1e-3)
    # at 4k the first rank's peak moment is chunk 0's first backward (its 4 layers and the
    # embedding, 3 of 11 chunk-micro-batches of checkpoints left), not chunk 1's (4 layers)
    assert inter_acc == pytest.approx(layer_grads / 2 + embed, rel=1e-3)
    # the peak drops by about (v - 1)/v of the layers' accumulated gradients; the end of the
    # backward reduces chunk 0 only
    assert one_peak - inter_peak == pytest.approx(layer_grads / 2, rel=0.15)
    assert one_end - inter_end == pytest.approx(layer_grads / 2, rel=1e-3)


def test_bad_schedule_input_names_the_field() -> None:
    with pytest.raises(ValidationError, match="pp_schedule"):
        TrainingSetup(num_gpus=8, parallel="fsdp", pp_schedule="gpipe")
    with pytest.raises(ValidationError, match="pp_schedule"):
        TrainingSetup(num_gpus=8, pp_schedule="interleaved-1f1b")
    with pytest.raises(ValidationError, match="pp_virtual"):
        TrainingSetup(num_gpus=8, parallel="fsdp,pp=2", pp_virtual=2)
    with pytest.raises(ValidationError):
        TrainingSetup(num_gpus=8, parallel="fsdp,pp=2", pp_schedule="zb-unknown")
    s = TrainingSetup(num_gpus=8, parallel="pp=8", pp_schedule="interleaved-1f1b", pp_virtual=5)
    with pytest.raises(EstimatorInputError) as err:  # 8 x 5 = 40 stages, 32 layers
        check_model(layout_of(s, 8), LLAMA8B)  # type: ignore[arg-type]
    assert err.value.field == "setup.pp_virtual"
    odd = TrainingSetup(num_gpus=4, parallel="pp=4", pp_schedule="interleaved-1f1b", grad_accum=9)
    with pytest.raises(EstimatorInputError) as err:  # 9 micro-batches, 2 rounds
        layout_of(odd, 4)
    assert err.value.field == "setup.grad_accum"


def test_zero2_and_zero3_refuse_a_pipeline() -> None:
    with pytest.raises(EstimatorInputError, match="incompatible with pipeline"):
        _mem(8, parallel="zero3,pp=2")
    _mem(8, parallel="zero1,pp=2")  # fine


def test_ring_attention_backward_buffers_grow_with_the_ring() -> None:
    from estimator.parallel import parse_parallel, resolve
    from estimator.parallel.ring import ring_backward_extra_per_token

    def per_token(text: str, gpus: int) -> float:
        return ring_backward_extra_per_token(LLAMA8B, resolve(parse_parallel(text), gpus), 2)

    assert per_token("fsdp", 8) == 0.0
    q, kv = 4096, 1024  # llama-3.1-8b: 32 x 128 query, 8 x 128 key/value
    two, eight = per_token("cp=2", 2), per_token("cp=8", 8)
    assert two == pytest.approx(4 * (q + 2 * kv) + 2 * 2 * kv * 3 + 16 * kv)
    assert eight - two == pytest.approx(2 * 2 * kv * 6)  # the all-gathered K/V: 1 + cp chunks
    with_tp = ring_backward_extra_per_token(LLAMA8B, resolve(parse_parallel("tp=2,cp=2"), 4), 2)
    assert with_tp == pytest.approx(two / 2)
    one = _mem(2, parallel="cp=2,dp=1")
    plain = TrainingSetup(num_gpus=1, method="full", precision="bf16", checkpointing="gpu")
    single = memory_breakdown(LLAMA8B, plain, [2048], 1, DEFAULT, devices=1)
    # the cp rank's backward transient = one device's at s/cp plus the ring buffers
    extra = float(one.components["recompute_peak"][0]) - float(
        single.components["recompute_peak"][0]
    )
    assert extra == pytest.approx(2048 * two, rel=0.01)


def test_ring_attention_takes_kv_at_the_query_heads_where_the_stack_repeats_them() -> None:
    """torchtitan@9dec370's llama attention repeats K/V to every query head before SDPA
    (model.py:201-202; stack fact `sdpa_repeats_kv`), so torch 2.6.0's ring attention
    all-gathers and accumulates K/V at the query width: Llama 3.1 8B's 32 heads, not 8."""
    from estimator.parallel import parse_parallel, resolve
    from estimator.parallel.ring import ring_backward_extra_per_token
    from estimator.stacks import load_stack

    assert load_stack("torchtitan-2024").get_optional("sdpa_repeats_kv", False) is True
    assert load_stack("hf").get_optional("sdpa_repeats_kv", False) is False
    cp2 = resolve(parse_parallel("cp=2"), 2)
    native = ring_backward_extra_per_token(LLAMA8B, cp2, 2)
    repeated = ring_backward_extra_per_token(LLAMA8B, cp2, 2, repeats_kv=True)
    q = 4096  # K/V at the 32 query heads x 128
    assert repeated == pytest.approx(4 * (q + 2 * q) + 2 * 2 * q * 3 + 16 * q)
    assert repeated > native

    def recompute(gpus: int, seq: int, parallel: str | None) -> float:
        s = TrainingSetup(
            num_gpus=gpus,
            method="full",
            precision="bf16",
            checkpointing="gpu",
            stack="torchtitan-2024",
            **({"parallel": parallel} if parallel else {}),
        )
        b = memory_breakdown(LLAMA8B, s, [seq], 1, DEFAULT, devices=gpus)
        return float(b.components["recompute_peak"][0])

    # the torchtitan-2024 cp rank's backward transient = one device's at s/cp + the ring's
    extra = recompute(2, 4096, "cp=2,dp=1") - recompute(1, 2048, None)
    assert extra == pytest.approx(2048 * repeated, rel=0.01)


def test_last_rank_computes_later_losses_with_its_gradients_accumulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1F1B's last rank runs backward i, then forward i + 1 and its loss (torch schedules.py
    1B1F): from the second micro-batch on, its loss coexists with the stage's accumulated
    unsharded gradients (FSDP2 under PP). GPipe runs every loss before any backward."""
    _only_stage(monkeypatch, "last")

    def loss_phase(schedule: str):
        b = _mem(8, parallel="fsdp=2,pp=4", pp_schedule=schedule)
        assert b.phases is not None
        return b.phases["loss"], float(b.phases["backward"]["accumulated_grads"][0])

    one, acc = loss_phase("1f1b")
    assert acc > 0
    assert float(one["accumulated_grads"][0]) == pytest.approx(acc)
    gpipe, _ = loss_phase("gpipe")
    assert float(gpipe["accumulated_grads"][0]) == 0.0
    assert accumulated_at_loss("1f1b", 4, 4) and accumulated_at_loss("interleaved-1f1b", 4, 4)
    assert not accumulated_at_loss("gpipe", 4, 4)
    assert not accumulated_at_loss("1f1b", 1, 4)  # one micro-batch: no earlier backward


def test_torchtitan_2024_last_rank_keeps_every_micro_batchs_logits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's pipelining of Dec 2024 keeps every last-stage output (the logits) in
    output_chunks for step()'s merged return value; torchtitan@9dec370 did not opt out
    (return_outputs=False came in 2025): m micro-batches x tokens x vocab / tp, bf16. Today's
    torchtitan passes return_outputs=False: none kept."""
    _only_stage(monkeypatch, "last")

    def outputs(stack: str) -> float:
        s = TrainingSetup(
            num_gpus=16,
            stack=stack,
            method="full",
            precision="mixed",
            checkpointing="gpu",
            parallel="fsdp=2,tp=2,sp,pp=4",
        )
        b = memory_breakdown(LLAMA8B, s, [4096], 2, DEFAULT, devices=16)
        assert b.phases is not None
        kept = {float(p.get("pipeline_outputs", [0.0])[0]) for p in b.phases.values()}
        assert len(kept) == 1  # alive at every moment from the last loss to the next step
        return kept.pop()

    m, tokens, vocab, tp = 4, 4096 * 2, 128_256, 2
    assert outputs("torchtitan-2024") == pytest.approx(m * tokens * vocab / tp * 2)
    assert outputs("torchtitan") == 0.0
    assert last_stage_outputs_kept(8, True) == 8 and last_stage_outputs_kept(8, False) == 0


def test_the_worst_rank_is_chosen_by_reserved_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan's benchmark reports the maximum of max_memory_reserved over all GPUs
    (llama3_h100_202412_torchtitan.md, footnote 1): the layout's figure is the larger of the
    first and the last rank's reserved bytes. On its 405B 1F1B row the two ranks allocate
    about the same, and the last rank's loss leaves more cached (its last layer's forward,
    memory/fragmentation.py 3), so choosing by allocated bytes would report the first rank."""
    raw = json.loads((ROOT / "bench" / "data" / "published_cases.json").read_text())["configs"]
    spec = spec_from_config({k: v for k, v in raw["llama-3.1-405b"].items() if k != "_source"})
    s = TrainingSetup(
        num_gpus=512,
        stack="torchtitan-2024",
        method="full",
        precision="mixed",
        optimizer_impl="foreach",
        checkpointing="gpu",
        loss="full",
        compile=True,
        parallel="fsdp=8,tp=8,sp,pp=8",
        pp_schedule="1f1b",
        reshard_after_forward=False,
    )
    chosen = memory_breakdown(spec, s, [8192], 4, DEFAULT, devices=512)
    each = {}
    for which in ("first", "last"):
        with monkeypatch.context() as mp:
            _only_stage(mp, which)
            b = memory_breakdown(spec, s, [8192], 4, DEFAULT, devices=512)
            each[which] = (float(b.allocated[0]), float(b.reserved[0]))
    assert each["first"][0] >= each["last"][0]
    assert each["last"][1] > each["first"][1]
    assert chosen.parallel is not None and chosen.parallel["stage"] == "last"
    assert float(chosen.reserved[0]) == pytest.approx(each["last"][1])


def test_torchtitan_2024_keeps_the_last_reduce_scatter_input_into_the_next_step() -> None:
    """The pipelining of Dec 2024 ran FSDP2's post_backward by hand at a stage's last backward
    without the root's final callback (added by pytorch/pytorch#144535), the only place the
    last group's reduce-scatter input is released: one decoder-layer unit's gradients in the
    reduce dtype (fp32 under torchtitan) stay referenced through the next step, in every
    phase. torch 2.13 (today's torchtitan) calls the callback."""

    def mem(stack: str):
        s = TrainingSetup(
            num_gpus=16,
            stack=stack,
            method="full",
            precision="mixed",
            checkpointing="gpu",
            parallel="fsdp=2,tp=2,sp,pp=4",
        )
        return memory_breakdown(LLAMA8B, s, [4096], 2, DEFAULT, devices=16)

    old, new = mem("torchtitan-2024"), mem("torchtitan")
    assert old.parallel is not None and new.parallel is not None
    unit = 218_112_000 / 2 * 4  # one llama-3.1-8b decoder layer on a tp=2 rank, fp32
    assert old.parallel["fsdp_pipeline_reduce_input_kept"] == pytest.approx(unit, rel=1e-3)
    assert "fsdp_pipeline_reduce_input_kept" not in new.parallel
    for phase in old.phases.values():
        assert float(phase["buckets"][0]) == pytest.approx(unit, rel=1e-3)
