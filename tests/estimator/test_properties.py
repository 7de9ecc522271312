"""Properties of the memory model over random setups (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from estimator.architectures import spec_from_config
from estimator.dtypes import compute_bytes
from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.memory.activations import Context
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup
from estimator.stacks import STACKS, load_stack

SPECS = {
    p: spec_from_config(preset_config(p))
    for p in ("qwen3.5-27b", "llama-3.1-8b", "qwen3-30b-a3b", "gpt2")
}
PROFILES = ("default", "seed-000")


@st.composite
def setups(draw, stack: str):
    """A setup under `stack`, with the stack's overrides drawn too; combinations the setup
    rejects (e.g. selective checkpointing outside torchtitan) are skipped."""
    fields = dict(
        stack=stack,
        method=draw(st.sampled_from(["full", "lora", "qlora"])),
        lora_rank=draw(st.integers(1, 64)),
        optimizer=draw(
            st.sampled_from(
                ["adamw", "adamw-8bit", "adamw-4bit", "sgd", "sgd-momentum", "adafactor", "lion"]
            )
        ),
        precision=draw(st.sampled_from(["mixed", "bf16", "fp32"])),
        checkpointing=draw(st.sampled_from(["none", "gpu", "offload", "selective"])),
        loss=draw(st.sampled_from(["full", "chunked", "liger", "cce", "unsloth"])),
        loss_chunk=draw(st.integers(1, 8192)),
        attention=draw(st.sampled_from(["sdpa", "eager"])),
        adapter_dtype=draw(st.sampled_from(["fp32", "bf16"])),
    )
    for name, values in (
        ("autocast", st.booleans()),
        ("optimizer_impl", st.sampled_from(["fused", "foreach", "in-backward"])),
        ("paged", st.booleans()),
        ("lora_dropout", st.sampled_from([0.0, 0.05, 0.1])),
        ("grad_accum", st.integers(1, 8)),
        ("double_quant", st.booleans()),
        ("train_embeddings", st.booleans()),
        ("kbit_prepare", st.booleans()),
        ("objective", st.sampled_from(["sft", "dpo", "dpo-precomputed"])),
    ):
        if draw(st.booleans()):  # else the stack decides
            fields[name] = draw(values)
    try:
        return TrainingSetup(**fields)
    except ValidationError:
        assume(False)
        raise


common = dict(
    model=st.sampled_from(sorted(SPECS)),
    profile=st.sampled_from(PROFILES),
    seq=st.integers(1, 200_000),
    batch=st.integers(1, 64),
)


def _peak(
    model: str, setup: TrainingSetup, profile: str, seq: int, batch: int, devices: int = 1
) -> float:
    """The peak; a model x setup pair peft cannot run (dropout on the expert banks that
    all-linear adapts on qwen3-30b-a3b: estimator.lora.lora_targets) is skipped."""
    try:
        breakdown = memory_breakdown(
            SPECS[model], setup, [seq], batch, load_profile(profile), devices=devices
        )
    except EstimatorInputError as err:
        assume(err.field != "setup.lora_dropout")
        raise
    return float(breakdown.peak[0])


@pytest.mark.parametrize("stack", STACKS)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), **common, extra=st.integers(1, 50_000))
def test_memory_never_decreases_with_sequence_length(
    stack, data, model, profile, seq, batch, extra
):
    setup = data.draw(setups(stack))
    assert _peak(model, setup, profile, seq + extra, batch) >= _peak(
        model, setup, profile, seq, batch
    )


@pytest.mark.parametrize("stack", STACKS)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), **common, extra=st.integers(1, 16))
def test_memory_never_decreases_with_batch(stack, data, model, profile, seq, batch, extra):
    setup = data.draw(setups(stack))
    assert _peak(model, setup, profile, seq, batch + extra) >= _peak(
        model, setup, profile, seq, batch
    )


@pytest.mark.parametrize("stack", STACKS)
@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    **common,
    sharding=st.sampled_from(["fsdp", "zero1", "zero2", "zero3"]),
    ranks=st.integers(4, 512),
)
def test_more_ranks_never_increase_per_device_memory(
    stack, data, model, profile, seq, batch, sharding, ranks
):
    """From 2 ranks up: `--sharding` is the exact layout, whose NCCL communicator buffers
    (estimator/parallel/nccl.py) exist from 2 ranks on and not for one process, so 1 -> 2 ranks
    may add more buffer than halving tiny states saves."""
    setup = data.draw(setups(stack))
    sharded = setup.model_copy(update={"sharding": sharding})
    assert (
        _peak(model, sharded, profile, seq, batch, ranks)
        <= _peak(model, sharded, profile, seq, batch, ranks // 2) + 1
    )


@pytest.mark.parametrize("stack", STACKS)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), **common)
def test_offload_never_increases_gpu_memory(stack, data, model, profile, seq, batch):
    """Beyond what the stack's offloading itself holds: Unsloth's reentrant checkpoint keeps
    the recomputed layer output through the layer's backward (stack fact
    `offload_holds_output`), one hidden-wide tensor that moments where the gradients outweigh
    the checkpoints (tiny lengths, full fine-tuning) see on top of transformers' checkpoint."""
    setup = data.draw(setups(stack))
    on_gpu = setup.model_copy(update={"checkpointing": "gpu"})
    offload = setup.model_copy(update={"checkpointing": "offload"})
    spec = SPECS[model]
    _peak(model, offload, profile, seq, batch)  # skips what peft cannot run
    ctx = Context.build(spec, offload, compute_bytes(offload.precision))
    held = ctx.held_output * (spec.hidden or 0) * seq * batch
    assert held == 0 or load_stack(stack).get_optional("offload_holds_output", False)
    assert _peak(model, offload, profile, seq, batch) <= (
        _peak(model, on_gpu, profile, seq, batch) + held
    )


@pytest.mark.parametrize("stack", STACKS)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), **common)
def test_every_component_is_non_negative(stack, data, model, profile, seq, batch):
    setup = data.draw(setups(stack))
    _peak(model, setup, profile, seq, batch)  # skips what peft cannot run
    mem = memory_breakdown(SPECS[model], setup, [seq], batch, load_profile(profile))
    for name, value in mem.components.items():
        assert value is not None and float(value[0]) >= 0, name
    assert float(mem.host[0]) >= 0


WRAPS = ("layer", "layer+embeddings", "layer+lm_head", "layer+embeddings+lm_head", "block-of-2")


def _fsdp2(setup: TrainingSetup, wrap: str, reshard: bool, gpus: int) -> TrainingSetup:
    return setup.model_copy(
        update={
            "parallel": "fsdp",
            "fsdp_wrap": wrap,
            "reshard_after_forward": reshard,
            "num_gpus": gpus,
            "sharding": "device_map",
        }
    )


@pytest.mark.parametrize("stack", ["torchtune", "torchtitan", "hf"])
@settings(max_examples=25, deadline=None)
@given(
    data=st.data(),
    **common,
    wrap=st.sampled_from(WRAPS),
    reshard=st.booleans(),
    ranks=st.integers(4, 256),
    extra=st.integers(1, 20_000),
)
def test_fsdp2_units_monotone_in_sequence_and_ranks(
    stack, data, model, profile, seq, batch, wrap, reshard, ranks, extra
):
    """FSDP2 layouts with the embedding / lm_head as units of their own (torchtune's
    custom_sharded_layers) or in the root: more tokens never less, more ranks never more (from 2
    ranks on: going from 1 to 2 adds NCCL's buffers, which a tiny model's shards can undercut)."""
    setup = data.draw(setups(stack))
    few, many = _fsdp2(setup, wrap, reshard, ranks // 2), _fsdp2(setup, wrap, reshard, ranks)
    longer = _peak(model, many, profile, seq + extra, batch, ranks)
    assert longer >= _peak(model, many, profile, seq, batch, ranks)
    assert _peak(model, many, profile, seq, batch, ranks) <= (
        _peak(model, few, profile, seq, batch, ranks // 2) + 1
    )
