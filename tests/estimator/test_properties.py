"""Properties of the memory model over random setups (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

SPECS = {
    p: spec_from_config(preset_config(p))
    for p in ("qwen3.5-27b", "llama-3.1-8b", "qwen3-30b-a3b", "gpt2")
}
PROFILES = ("default", "seed-000")

setups = st.builds(
    TrainingSetup,
    method=st.sampled_from(["full", "lora", "qlora"]),
    lora_rank=st.integers(1, 64),
    optimizer=st.sampled_from(["adamw", "adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"]),
    precision=st.sampled_from(["mixed", "bf16", "fp32"]),
    checkpointing=st.sampled_from(["none", "gpu", "offload"]),
    loss=st.sampled_from(["full", "chunked"]),
    loss_chunk=st.integers(1, 8192),
    attention=st.sampled_from(["sdpa", "eager"]),
    adapter_dtype=st.sampled_from(["fp32", "bf16"]),
)
common = dict(
    model=st.sampled_from(sorted(SPECS)),
    setup=setups,
    profile=st.sampled_from(PROFILES),
    seq=st.integers(1, 200_000),
    batch=st.integers(1, 64),
)


def _peak(
    model: str, setup: TrainingSetup, profile: str, seq: int, batch: int, devices: int = 1
) -> float:
    return float(
        memory_breakdown(
            SPECS[model], setup, [seq], batch, load_profile(profile), devices=devices
        ).peak[0]
    )


@settings(max_examples=150, deadline=None)
@given(**common, extra=st.integers(1, 50_000))
def test_memory_never_decreases_with_sequence_length(model, setup, profile, seq, batch, extra):
    assert _peak(model, setup, profile, seq + extra, batch) >= _peak(
        model, setup, profile, seq, batch
    )


@settings(max_examples=150, deadline=None)
@given(**common, extra=st.integers(1, 16))
def test_memory_never_decreases_with_batch(model, setup, profile, seq, batch, extra):
    assert _peak(model, setup, profile, seq, batch + extra) >= _peak(
        model, setup, profile, seq, batch
    )


@settings(max_examples=150, deadline=None)
@given(
    **common,
    sharding=st.sampled_from(["fsdp", "zero1", "zero2", "zero3"]),
    ranks=st.integers(2, 512),
)
def test_more_ranks_never_increase_per_device_memory(
    model, setup, profile, seq, batch, sharding, ranks
):
    sharded = setup.model_copy(update={"sharding": sharding})
    assert (
        _peak(model, sharded, profile, seq, batch, ranks)
        <= _peak(model, sharded, profile, seq, batch, ranks // 2 or 1) + 1
    )


@settings(max_examples=150, deadline=None)
@given(**common)
def test_offload_never_increases_gpu_memory(model, setup, profile, seq, batch):
    on_gpu = setup.model_copy(update={"checkpointing": "gpu"})
    offload = setup.model_copy(update={"checkpointing": "offload"})
    assert _peak(model, offload, profile, seq, batch) <= _peak(model, on_gpu, profile, seq, batch)


@settings(max_examples=150, deadline=None)
@given(**common)
def test_every_component_is_non_negative(model, setup, profile, seq, batch):
    mem = memory_breakdown(SPECS[model], setup, [seq], batch, load_profile(profile))
    for name, value in mem.components.items():
        assert value is not None and float(value[0]) >= 0, name
    assert float(mem.host[0]) >= 0
