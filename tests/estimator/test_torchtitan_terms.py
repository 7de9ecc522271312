"""estimator/memory/torchtitan.py: the `torchtitan` stack's own terms, worked out by hand from
the sources each function names (torchtitan 0.3.0, torch 2.13). The figures they produce were
checked against fake traces of torchtitan's Trainer (tests/probe/test_torchtitan_fake.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.architectures import spec_from_config
from estimator.dtypes import BF16, FP32
from estimator.memory import memory_breakdown
from estimator.memory.activations import Context, rms_norm_saved
from estimator.memory.torchtitan import cpu_referee, fsdp_units, rope_cache_bytes
from estimator.parallel.data import DataParallelBytes
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

ROOT = Path(__file__).resolve().parents[2]
SMALL = spec_from_config(
    json.loads((ROOT / "tests/data/configs/small-llama-parallel.json").read_text())
)
LLAMA70 = spec_from_config(json.loads((ROOT / "estimator/presets/llama-3.1-70b.json").read_text()))
MIB = 2**20


def _setup(stack: str = "torchtitan", n: int = 1, checkpointing: str = "gpu") -> TrainingSetup:
    return TrainingSetup(
        stack=stack,
        method="full",
        precision="mixed",
        checkpointing=checkpointing,
        loss="full",
        optimizer="adamw",
        parallel=f"fsdp={n}",
        num_gpus=n,
    )


def _phases(setup: TrainingSetup, seq: int, n: int) -> dict[str, dict[str, float]]:
    mem = memory_breakdown(SMALL, setup, [seq], 1, load_profile("default"), devices=n)
    return {p: {k: float(v[0]) for k, v in parts.items()} for p, parts in mem.phases.items()}


def test_rope_caches_are_one_complex64_table_per_layer_at_the_training_length() -> None:
    # Llama 3.1 70B: 80 layers x 8192 positions x 64 complex64 = 320 MiB (the 70B fake trace's
    # buffers: 33,962.6 MiB at the window start - 33,642.6 MiB of parameter shards)
    assert rope_cache_bytes(LLAMA70, _setup(), 8192.0) == 80 * 8192 * 64 * 8 == 320 * MIB
    assert rope_cache_bytes(LLAMA70, _setup("torchtitan-2024"), 8192.0) == 0.0
    phases = _phases(_setup(n=2), 1024, 2)
    assert all(p["rope_cache"] == 4 * 1024 * 16 * 8 for p in phases.values())
    assert "rope_cache" not in _phases(_setup("torchtitan-2024", n=2), 1024, 2)["loss"]


def test_torch_rms_norm_saves_its_input_and_rstd_on_cuda_and_two_fp32_copies_on_cpu() -> None:
    h = SMALL.hidden or 0
    titan = Context.build(SMALL, _setup(), BF16)
    assert rms_norm_saved(titan, h) == BF16 * h + FP32
    with cpu_referee():
        assert rms_norm_saved(titan, h) == 2 * FP32 * h + FP32
    older = Context.build(SMALL, _setup("torchtitan-2024"), BF16)  # its own RMSNorm
    assert rms_norm_saved(older, h) == FP32 * h + FP32 + BF16 * h


@pytest.mark.parametrize("n", [1, 2])
def test_the_embeddings_reduce_ends_the_backward_with_its_input_and_the_one_rank_temporary(
    n: int,
) -> None:
    phases = _phases(_setup(n=n), 256, n)
    end = phases["end_of_backward"]
    extra = end["root_reduce"]
    embed = (SMALL.vocab or 0) * (SMALL.hidden or 0)
    # after its reshard: fp32 reduce-scatter input (+ the divide's copy at one rank); the
    # output is the sharded gradient already in trainable_states; the copy-in before it
    # holds the bf16 gradient + input - the shard not made yet
    per_param = max(BF16 + FP32 - FP32 / n, FP32 + (FP32 if n == 1 else 0))
    assert extra == pytest.approx(embed * per_param)


def test_the_last_layers_backward_has_not_made_its_own_nor_the_embeddings_gradients() -> None:
    phases = _phases(_setup(n=2), 256, 2)
    embed = (SMALL.vocab or 0) * (SMALL.hidden or 0)
    layer = sum(lin.params for lin in SMALL.linears if lin.group != "head") / (SMALL.layers or 1)
    all_grads = FP32 * SMALL.params_total / 2
    late = FP32 * (embed + layer) / 2
    assert phases["backward"]["gradients"] == pytest.approx(all_grads - late, rel=1e-3)


def test_other_stacks_keep_the_generic_fsdp_terms() -> None:
    from estimator.parallel.layout import parse_parallel, resolve

    dp = DataParallelBytes(weights=1.0, states=2.0, grads=3.0, reduce_buffers=4.0)
    layout = resolve(parse_parallel("fsdp=2"), 2)
    assert fsdp_units(dp, None, layout, 4.0, _setup("hf", n=2)) is dp  # type: ignore[arg-type]


def test_torchtitan_2024_gets_fsdp2s_reduce_terms_but_keeps_its_last_block_at_the_loss() -> None:
    """torch 2.6's FSDP2 (the 2024 runs' line) makes a unit's sharded gradient in its own
    post-backward, so the last decoder unit's backward has not made its own yet; the 2024
    stack has no separate embedding unit, so only that layer's are late. Its last block is
    not resharded after forward (torchtitan@9dec370 parallelize_llama.py:333): the loss
    moment keeps one unit unsharded, as the generic term counts."""
    titan24 = _setup("torchtitan-2024", n=2)
    phases = _phases(titan24, 256, 2)
    layer = sum(lin.params for lin in SMALL.linears if lin.group != "head") / (SMALL.layers or 1)
    all_grads = FP32 * SMALL.params_total / 2
    assert phases["backward"]["gradients"] == pytest.approx(all_grads - FP32 * layer / 2, rel=1e-3)
    assert phases["loss"]["unsharded_params"] >= BF16 * layer


def test_torchtitan_with_the_head_in_the_root_keeps_its_last_block_at_the_loss() -> None:
    """`fsdp_wrap` "layer" under the torchtitan stack is torchtitan before pytorch/torchtitan
    #1094 (83e6941, 2025-07-28): tok_embeddings, norm and output in the root unit, and the
    last transformer block not resharded after its forward (e7c0cae
    torchtitan/models/llama3/parallelize_llama.py:349-357, `int(layer_id) <
    len(model.layers) - 1`), so the loss holds the root and that block unsharded. 0.3.0's own
    units (a kept [norm, lm_head] unit, every block resharded) hold no decoder unit there."""
    layer = sum(lin.params for lin in SMALL.linears if lin.group != "head") / (SMALL.layers or 1)
    root_only = TrainingSetup(
        **{**_setup(n=2).model_dump(exclude_unset=True), "fsdp_wrap": "layer"}
    )
    loss = _phases(root_only, 256, 2)["loss"]["unsharded_params"]
    root = 2 * (SMALL.vocab or 0) * (SMALL.hidden or 0) * BF16  # untied embedding + output
    assert loss - root == pytest.approx(layer * BF16, rel=1e-2)  # one block (norms aside)
    own_units = _phases(_setup(n=2), 256, 2)["loss"]["unsharded_params"]
    assert own_units < loss - 0.5 * layer * BF16


def test_torchtitan_2024_sdpa_saves_k_and_v_repeated_to_the_query_heads() -> None:
    """torchtitan@9dec370 models/llama/model.py:201-202 repeats K/V to every query head
    (`repeat_kv`: expand + reshape, a copy) and :209 hands them to SDPA, which saves them:
    Llama 3.1 70B's 8 KV heads are saved at the 64 query heads' width (stack fact
    `sdpa_repeats_kv`); the hf stack's SDPA takes them GQA-native."""
    from estimator.memory.activations import _attention_core

    heads, kv_heads, dim = LLAMA70.num_heads or 0, LLAMA70.num_kv_heads or 0, 128
    hidden = LLAMA70.hidden or 0

    def setup(stack: str) -> TrainingSetup:
        return TrainingSetup(stack=stack, method="full", precision="bf16", checkpointing="none")

    titan = Context.build(LLAMA70, setup("torchtitan-2024"), BF16)
    assert titan.repeats_kv and not titan.torchtune
    q = heads * dim
    # q, k, v at the query width, SDPA's out, its fp32 logsumexp, the qkv input; o_proj's
    # input is SDPA's output itself (a view), counted once
    expected = BF16 * (q + 2 * q) + BF16 * q + FP32 * heads + BF16 * hidden
    assert _attention_core(titan, LLAMA70)[0] == expected
    hf = Context.build(LLAMA70, setup("hf"), BF16)
    assert not hf.repeats_kv
    native = _attention_core(hf, LLAMA70)[0]
    assert _attention_core(titan, LLAMA70)[0] - native == 2 * BF16 * (heads - kv_heads) * dim


def test_compiled_torchtitan_2024_layer_keeps_k_and_v_at_the_query_heads() -> None:
    """bench/titan_sac_saved.py compiles torchtitan@9dec370's TransformerBlock without
    checkpointing (dim 512, 8 heads, 2 kv heads, ffn 1536, bf16): the partition keeps SDPA's q,
    k and v at the 8 query heads, 18,728 B/token of which 256 are the rotary table's complex64
    conjugate (bench/results/titan_sac_saved_2026-12-04.txt)."""
    from estimator.memory.activations import layer_activations
    from estimator.memory.activations_compiled import compiled_layer_saved
    from estimator.spec import LAYER_FULL, MLP_DENSE

    config = json.loads((ROOT / "tests/data/configs/small-llama-parallel.json").read_text())
    config.update(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2
    )
    block = spec_from_config(config)
    assert compiled_layer_saved(block, BF16, True, frozenset(), 0, repeats_kv=True) == 18728 - 256
    assert compiled_layer_saved(block, BF16, True, frozenset(), 0) == 18728 - 256 - 2 * 2 * 384

    def per_token(stack: str) -> float:
        setup = TrainingSetup(stack=stack, method="full", precision="bf16", compile=True)
        ctx = Context.build(LLAMA70, setup, BF16)
        return layer_activations(ctx, LLAMA70, LAYER_FULL, MLP_DENSE).per_token

    heads, kv_heads = LLAMA70.num_heads or 0, LLAMA70.num_kv_heads or 0
    assert per_token("torchtitan-2024") - per_token("hf") == 2 * BF16 * (heads - kv_heads) * 128
