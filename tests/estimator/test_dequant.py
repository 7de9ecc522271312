"""torchao NF4 dequantization (torchtune QLoRA) and torchtune's own modules in the estimator."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.memory.dequant import dequant_peak, nf4_dequant_peak
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))


def test_dequant_peak_is_get_original_weights_eight_locals() -> None:
    """torchao 0.11 nf4tensor.py:756-782 for a bf16 weight of n elements: two int64 code
    arrays of n/2, two bf16 nf4 lookups of n/2, the bf16 scalers (one per 64), two scaled
    halves of n/2 and the stacked weight of n."""
    n = 4096 * 14336
    locals_ = [8 * n // 2] * 2 + [2 * n // 2] * 2 + [2 * n // 64] + [2 * n // 2] * 2 + [2 * n]
    assert nf4_dequant_peak(n, 2) == sum(locals_)
    assert nf4_dequant_peak(n, 2) == pytest.approx(7 * 2 * n, rel=0.01)  # ~7x the bf16 weight


def test_only_torchtunes_eager_qlora_dequantizes_through_torchao() -> None:
    tt = TrainingSetup(stack="torchtune", method="qlora")
    down = 4096 * 14336  # the largest Linear of a Llama-3.1-8B layer
    assert dequant_peak(LLAMA8B, tt, 2) == nf4_dequant_peak(down, 2)
    assert (
        dequant_peak(LLAMA8B, TrainingSetup(stack="torchtune", method="lora", precision="bf16"), 2)
        == 0
    )
    compiled = TrainingSetup(stack="torchtune", method="qlora", compile=True)
    assert dequant_peak(LLAMA8B, compiled, 2) == 0
    assert dequant_peak(LLAMA8B, TrainingSetup(stack="hf", method="qlora"), 2) == 0


def _recompute(setup: TrainingSetup, seq: int) -> float:
    mem = memory_breakdown(LLAMA8B, setup, [seq], 1, load_profile("default"))
    return float(mem.components["recompute_peak"][0])


def test_torchtune_qlora_recompute_peak_holds_the_dequantization_at_short_lengths() -> None:
    """At 256 tokens the dequantized down projection (~822 MB) outweighs the layer's
    activations: QLoRA's recompute peak exceeds LoRA's by most of it; at long lengths the
    backward's own moment of the layer can be the larger (never below LoRA's)."""
    qlora = TrainingSetup(stack="torchtune", method="qlora")
    lora = TrainingSetup(stack="torchtune", method="lora")
    peak = nf4_dequant_peak(4096 * 14336, 2)
    assert _recompute(qlora, 256) - _recompute(lora, 256) > 0.9 * peak
    for seq in (256, 4096, 32768):
        assert _recompute(qlora, seq) >= _recompute(lora, seq)


def test_torchtune_modules_repeat_kv_and_keep_a_trained_norms_normed_in_fp32() -> None:
    """torchtune 0.6.1 attention.py:285-291 expands k and v to num_heads before SDPA; its
    RMSNorm (F.rms_norm on x.float() with a bf16 scale: torch's composite) saves the fp32
    normed for a trained scale; a LoRA output projection sharing its input saves SDPA's own
    output (attention.py:303 a view), no copy."""
    from dataclasses import replace

    from estimator.memory.activations import Context, _attention_core, rms_norm_saved

    h, heads, kv_heads, dim = LLAMA8B.hidden, LLAMA8B.num_heads, LLAMA8B.num_kv_heads, 128
    full = Context.build(
        LLAMA8B, TrainingSetup(stack="torchtune", method="full", precision="bf16"), 2
    )
    plain = replace(full, torchtune=False)
    assert full.torchtune and not plain.torchtune
    repeated = 2 * 2 * (heads - kv_heads) * dim  # k and v, bf16
    assert _attention_core(full, LLAMA8B)[0] - _attention_core(plain, LLAMA8B)[0] == repeated
    assert rms_norm_saved(full, h) - rms_norm_saved(plain, h) == 2 * h  # fp32, not bf16
    lora = Context.build(
        LLAMA8B, TrainingSetup(stack="torchtune", method="lora", precision="bf16"), 2
    )
    assert "o_proj" in lora.targets and lora.adapter_shared
    reused = 2 * heads * dim  # the o_proj input, bf16
    plain_lora = replace(lora, torchtune=False)
    diff = _attention_core(lora, LLAMA8B)[0] - _attention_core(plain_lora, LLAMA8B)[0]
    assert diff == repeated - reused


def test_torchtune_adapters_default_to_the_models_bf16() -> None:
    """torchtune builds LoRA under set_default_dtype(dtype): bf16 adapters unless told."""
    assert TrainingSetup(stack="torchtune", method="lora").adapter_dtype == "bf16"
    assert TrainingSetup(stack="hf", method="lora").adapter_dtype == "fp32"  # peft's default
    told = TrainingSetup(stack="torchtune", method="lora", adapter_dtype="fp32")
    assert told.adapter_dtype == "fp32"


def test_compiled_torchtune_layer_keeps_k_and_v_expanded() -> None:
    """bench/tune_compiled_saved.py: torchtune 0.6.1's compiled layer (dim 512, 8 heads, 2 kv
    heads, ffn 1536) saves SDPA's k and v at the 8 query heads, 18,472 B/token trained and
    12,328 frozen besides its rope cache (bench/results/tune_compiled_saved_2026-12-04.txt)."""
    from dataclasses import replace

    from estimator.memory.activations import Context, layer_activations
    from estimator.memory.activations_compiled import compiled_layer_saved
    from estimator.spec import LAYER_FULL, MLP_DENSE

    config = dict(preset_config("llama-3.1-8b"))
    config.update(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2
    )
    block = spec_from_config(config)
    assert compiled_layer_saved(block, 2, True, frozenset(), 0, repeats_kv=True) == 18472
    assert compiled_layer_saved(block, 2, False, frozenset(), 0, repeats_kv=True) == 12328
    heads, kv_heads = LLAMA8B.num_heads or 0, LLAMA8B.num_kv_heads or 0
    for method in ("full", "lora"):
        setup = TrainingSetup(stack="torchtune", method=method, precision="bf16", compile=True)
        ctx = Context.build(LLAMA8B, setup, 2)
        assert ctx.torchtune and ctx.compiled

        def saved(c: Context) -> float:
            return layer_activations(c, LLAMA8B, LAYER_FULL, MLP_DENSE).per_token

        assert saved(ctx) - saved(replace(ctx, torchtune=False)) == 2 * 2 * (heads - kv_heads) * 128
