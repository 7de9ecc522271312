"""Liger's RMSNorm / SwiGLU / RoPE kernels (setup `liger_kernels`, estimator/memory/liger.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.compare import compare, setup_from_memtest
from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.model_source import resolve_model
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.request import ModelInput
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec
from estimator.train_config.load import read_train_config_text

ROOT = Path(__file__).resolve().parents[2]
LIGER_RUN = ROOT / "tests/data/memtests/memtest_h200_2026-12-04_hf-llama-lora-liger.json"
MIB = 2**20
HF = "per_device_train_batch_size: 1\nuse_liger_kernel: true\n"  # TRL / Trainer arguments


def _spec(preset: str = "llama-3.1-8b") -> ModelSpec:
    return resolve_model(ModelInput(config=preset_config(preset)))


def test_the_h200_liger_run_is_within_a_mib() -> None:
    """transformers' Trainer with use_liger_kernel=True on an H200: the estimate was 120.0 and
    239.9 MiB over at 2048 and 4096 tokens while it counted transformers' eager norms and MLP."""
    rows = [r for r in compare(json.loads(LIGER_RUN.read_text()))["rows"] if r["status"] == "ok"]
    assert [r["seq_len"] for r in rows] == [2048, 4096]
    for row in rows:
        assert abs(row["error_bytes"]) < MIB


def test_the_kernels_keep_8h_plus_2m_less_per_token_at_the_recompute_peak() -> None:
    """The run's peak is the recompute reaching down_proj's LoRA branch: per token the two
    norms' fp32 input copies (2 x 4h) and SwiGLU's silu output (2m) are not there."""
    doc = json.loads(LIGER_RUN.read_text())
    setup = setup_from_memtest(doc)
    assert setup.liger_kernels is True  # the probe's Trainer ran use_liger_kernel=True
    eager = setup.model_copy(update={"liger_kernels": False})
    spec, profile = _spec(), load_profile("default")
    h, m = spec.hidden or 0, spec.intermediate or 0
    for tokens in (2048, 4096):
        with_kernels = memory_breakdown(spec, setup, [tokens], 1, profile)
        without = memory_breakdown(spec, eager, [tokens], 1, profile)
        saved = float(without.allocated[0] - with_kernels.allocated[0])
        assert saved == (8 * h + 2 * m) * tokens


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.parametrize("checkpointing", ["gpu", "none"])
def test_the_kernels_never_add_memory(method: str, checkpointing: str) -> None:
    spec, profile = _spec("qwen3-8b"), load_profile("default")
    for seq in (512, 4096, 16384):
        setups = [
            TrainingSetup(method=method, checkpointing=checkpointing, liger_kernels=on)
            for on in (False, True)
        ]
        eager, liger = (memory_breakdown(spec, s, [seq], 1, profile) for s in setups)
        assert float(liger.peak[0]) <= float(eager.peak[0])


def test_a_model_type_liger_does_not_patch_is_refused() -> None:
    config = {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 1000,
        "n_positions": 512,
    }
    spec = resolve_model(ModelInput(config=config))
    setup = TrainingSetup(liger_kernels=True)
    with pytest.raises(EstimatorInputError) as err:
        memory_breakdown(spec, setup, [256], 1, load_profile("default"))
    assert err.value.field == "setup.liger_kernels"


@pytest.mark.parametrize("stack", ["unsloth", "torchtune", "torchtitan", "probe"])
def test_stacks_with_their_own_modules_refuse_it(stack: str) -> None:
    with pytest.raises(ValueError, match="liger_kernels"):
        TrainingSetup(stack=stack, liger_kernels=True)


@pytest.mark.parametrize(
    ("text", "expected", "ignored"),
    [
        (HF, True, set()),
        (
            HF + "liger_kernel_config: {swiglu: false}\n",
            None,
            {"liger_kernel_config"},
        ),
        (
            HF + "liger_kernel_config: {swiglu: false, rms_norm: false}\n",
            None,
            set(),
        ),
        ("base_model: x\nliger_rms_norm: true\nliger_glu_activation: true\n", True, set()),
        ("base_model: x\nliger_rms_norm: true\n", None, {"liger_rms_norm"}),
        ("model_name_or_path: x\nstage: sft\nenable_liger_kernel: true\n", True, set()),
    ],
)
def test_train_configs_map_to_it(text: str, expected: bool | None, ignored: set[str]) -> None:
    m = read_train_config_text(text)
    assert m.setup.get("liger_kernels") is expected
    assert ignored <= {i.key for i in m.ignored}


def _moe_terms(setup: TrainingSetup, spec: ModelSpec):  # type: ignore[no-untyped-def]
    from estimator.memory.activations import Context, _mlp, layer_activations
    from estimator.spec import LAYER_FULL, MLP_MOE

    ctx = Context.build(spec, setup, 2)
    return _mlp(ctx, spec, True)[0], layer_activations(ctx, spec, LAYER_FULL, MLP_MOE)


def test_liger_experts_keep_pre_activations_and_make_whole_bank_gradients() -> None:
    """Under transformers 5 Liger swaps qwen3_moe's experts for LigerExperts (liger-kernel
    0.8.5 monkey_patch.py:1916): LigerFusedMoEFunction saves x, the gate/up outputs, the
    routing weights and three int32 indices per routed token (ops/fused_moe.py:258-270), and
    its backward makes both banks' gradients with zeros_like whether they are trained or not
    (:347, :411)."""
    spec = _spec("qwen3-30b-a3b")
    assert spec.moe is not None
    h, me, k = spec.hidden or 0, spec.moe.expert_intermediate, spec.moe.experts_per_token
    e = spec.moe.num_experts
    attention_only = TrainingSetup(method="lora", lora_targets=["q_proj", "v_proj"])
    eager_saved, eager = _moe_terms(attention_only, spec)
    liger_saved, fused = _moe_terms(attention_only.model_copy(update={"liger_kernels": True}), spec)
    router = 4 * e  # fp32 routing probabilities (the frozen router saves no input)
    assert eager_saved == router + 2 * (3 * k * me + k * h)  # transformers' grouped_mm experts
    assert liger_saved == router + 2 * h + k * (2 * 2 * me + 2 + 3 * 4)
    assert fused.transient_per_layer == 2 * 3 * e * h * me  # the frozen banks' gradients
    assert eager.transient_per_layer == 0
    # d_pre_act, weighted_act, dS, dx_expanded per routed token, dx and the incoming gradient
    assert fused.transient_per_token == 2 * (k * (3 * me + 1 + h) + h) + 2 * h
    _, full = _moe_terms(TrainingSetup(method="full", liger_kernels=True), spec)
    assert full.transient_per_layer == 0  # trained banks take the gradient as .grad


@pytest.mark.parametrize("autocast", [False, True])
def test_deepseek_v3_routed_experts_are_liger_experts_too(autocast: bool) -> None:
    """liger-kernel 0.8.5 monkey_patch.py:3723 swaps DeepseekV3Experts for LigerExperts under
    transformers 5; the router's top-k weights are in its logits' dtype: fp32 as written, bf16
    under autocast (activations_deepseek.py `router_bytes`)."""
    from estimator.memory.activations import Context
    from estimator.memory.activations_deepseek import deepseek_moe

    spec = _spec("deepseek-v3")
    assert spec.moe is not None
    h, me, k = spec.hidden or 0, spec.moe.expert_intermediate, spec.moe.experts_per_token
    e, s = spec.moe.num_experts, spec.moe.shared_intermediate or 0
    setup = TrainingSetup(
        method="lora", lora_targets=["q_a_proj"], liger_kernels=True, autocast=autocast
    )
    saved, _ = deepseek_moe(Context.build(spec, setup, 2), spec)
    rb = 2 if autocast else 4
    router = rb * e + 8 * k + rb * k + rb  # scores, int64 top-k, weights and their sum
    experts = 2 * h + k * (2 * 2 * me + rb + 3 * 4)  # x, pre_act, weights, int32 indices
    assert saved == router + experts + 3 * 2 * s  # the shared expert's eager SwiGLU
    eager, _ = deepseek_moe(
        Context.build(spec, setup.model_copy(update={"liger_kernels": False}), 2), spec
    )
    assert eager > saved
