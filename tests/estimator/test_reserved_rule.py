"""memory/fragmentation.py (3): the last checkpointed layer's forward stays cached at the loss.

The mechanism is checked on the allocator model (probe/allocator.py) with a hand-made trace,
the estimator term against the layer activations it is built from."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.dtypes import compute_bytes
from estimator.memory import memory_breakdown
from estimator.memory.activations import selective_saved
from estimator.memory.model import _activations
from estimator.model_source import resolve_model
from estimator.profile import load_profile
from estimator.request import ModelInput
from estimator.setup import TrainingSetup
from probe.allocator import AllocatorConfig, MiB, replay
from probe.allocator_events import alloc, free

DEFAULT = load_profile("default")
LLAMA8B = resolve_model(ModelInput(preset="llama-3.1-8b"))


def _layer_saved(setup: TrainingSetup, tokens: int) -> float:
    _, acts = _activations(LLAMA8B, setup, compute_bytes(setup.precision))
    return max(a.per_token * tokens + a.per_layer for a, _ in acts)


def test_checkpointed_layers_leave_one_layer_cached_that_the_loss_cannot_use() -> None:
    """Three 'layers': each makes a 30 MiB and a 40 MiB transient and a 12 MiB checkpoint, and
    frees the transients; then a 100 MiB logits tensor. The layer blocks are reused layer after
    layer and are still cached at the loss, which gets a segment of its own:
    reserved = live + 100 MiB + the cached layer bytes."""
    events = []
    for i in range(3):
        events += [alloc(f"a{i}", 30 * MiB), alloc(f"b{i}", 40 * MiB), alloc(f"c{i}", 12 * MiB)]
        events += [free(f"a{i}"), free(f"b{i}")]
    events.append(alloc("logits", 100 * MiB))
    r = replay(events, AllocatorConfig())
    live = 3 * 12 * MiB + 100 * MiB
    assert r.final_allocated == live
    cached = r.final_reserved - live
    # the 70 MiB layer working set, less what the checkpoints took from it, stays cached
    assert 30 * MiB <= cached <= 70 * MiB + 3 * 12 * MiB
    assert r.free_cached["largest_free_block"] < 100 * MiB


def test_forward_cache_is_one_layer_of_recompute_activations() -> None:
    setup = TrainingSetup(stack="hf", method="lora", checkpointing="gpu")
    mem = memory_breakdown(LLAMA8B, setup, [4096], 1, DEFAULT)
    assert float(mem.forward_cache[0]) == pytest.approx(_layer_saved(setup, 4096))
    loss_phase = float(sum(mem.phases["loss"].values())[0])
    assert float(mem.reserved[0]) >= loss_phase + float(mem.loss_hole[0] + mem.forward_cache[0])


def test_selective_checkpointing_caches_only_what_the_policy_frees() -> None:
    setup = TrainingSetup(stack="torchtitan-2024", method="full", checkpointing="selective")
    mem = memory_breakdown(LLAMA8B, setup, [8192], 1, DEFAULT)
    ctx, _ = _activations(LLAMA8B, setup, compute_bytes(setup.precision))
    expected = _layer_saved(setup, 8192) - 8192 * selective_saved(ctx, LLAMA8B)
    assert expected > 0
    assert float(mem.forward_cache[0]) == pytest.approx(expected)


def test_no_checkpointing_probe_stack_and_seed_profile_cache_nothing() -> None:
    none = TrainingSetup(stack="hf", method="lora", checkpointing="none")
    assert float(memory_breakdown(LLAMA8B, none, [2048], 1, DEFAULT).forward_cache[0]) == 0.0
    probe = TrainingSetup(stack="probe", method="lora", checkpointing="gpu")
    mem = memory_breakdown(LLAMA8B, probe, [2048], 1, DEFAULT)
    assert float(np.asarray(mem.forward_cache).max()) == 0.0
    seed = memory_breakdown(
        LLAMA8B, TrainingSetup(stack="hf", method="lora"), [2048], 1, load_profile("seed-000")
    )
    assert float(np.asarray(seed.forward_cache).max()) == 0.0


def test_freed_gradients_stay_cached_less_what_the_forward_keeps() -> None:
    """fragmentation.py (4): three 40 MiB gradients freed by zero_grad, two 12 MiB checkpoints
    carved from their blocks, then a 100 MiB logits tensor: the gradient segments stay, the
    logits get their own, and 3 x 40 - 2 x 12 MiB are cached and unused."""
    events = [alloc(f"g{i}", 40 * MiB) for i in range(3)]
    events += [free(f"g{i}") for i in range(3)]
    events += [alloc("c0", 12 * MiB), alloc("c1", 12 * MiB), alloc("logits", 100 * MiB)]
    r = replay(events, AllocatorConfig())
    assert r.final_reserved == 3 * 40 * MiB + 100 * MiB
    assert r.final_reserved - r.final_allocated == 3 * 40 * MiB - 2 * 12 * MiB


def test_full_fine_tuning_counts_the_last_steps_gradient_blocks() -> None:
    setup = TrainingSetup(stack="hf", method="full", precision="bf16", checkpointing="gpu")
    mem = memory_breakdown(LLAMA8B, setup, [2048], 1, DEFAULT)
    logits = 2048 * 128256 * 2
    grads = sum(
        lin.in_features * lin.out_features * lin.experts * 2 * lin.count
        for lin in LLAMA8B.linears
        if lin.in_features * lin.out_features * lin.experts * 2 < logits
    )
    grads += sum(g.params * 2 for g in LLAMA8B.others if g.name != "embed_tokens")
    kept = float(mem.components["checkpoints"][0])
    assert float(mem.grad_cache[0]) == pytest.approx(grads - kept)
    loss_phase = float(sum(mem.phases["loss"].values())[0])
    assert float(mem.reserved[0]) >= loss_phase + float(mem.loss_hole[0] + mem.grad_cache[0])
    # LoRA's gradients are far smaller than its checkpoints: nothing; FSDP: not counted
    lora = TrainingSetup(stack="hf", method="lora", checkpointing="gpu")
    assert float(memory_breakdown(LLAMA8B, lora, [2048], 1, DEFAULT).grad_cache[0]) == 0.0
    fsdp = setup.model_copy(update={"sharding": "fsdp", "num_gpus": 8})
    assert (
        float(np.asarray(memory_breakdown(LLAMA8B, fsdp, [2048], 1, DEFAULT).grad_cache).max()) == 0
    )
