"""FLOPs per step: the 6*N*T rule, LoRA's half backward, layer types, and the count of
torch's FlopCounterMode on a real tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.architectures import spec_from_config
from estimator.setup import TrainingSetup
from estimator.spec import params_only_spec
from estimator.time.flops import (
    attention_core_forward,
    attention_pairs,
    gated_deltanet_forward,
    gated_deltanet_matmul_forward,
    step_flops,
)

CONFIGS = Path(__file__).parents[2] / "data" / "configs"


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def test_params_only_dense_follows_6nd_and_8nd_with_full_recompute() -> None:
    spec = params_only_spec(8.03e9)
    tokens = 4096 * 2
    plain = step_flops(spec, TrainingSetup(checkpointing="none"), 4096, 2)
    ckpt = step_flops(spec, TrainingSetup(checkpointing="gpu"), 4096, 2)
    assert plain.total == pytest.approx(6 * 8.03e9 * tokens)
    assert ckpt.total == pytest.approx(8 * 8.03e9 * tokens)
    assert ckpt.model_flops == plain.model_flops == pytest.approx(6 * 8.03e9 * tokens)
    assert any("attention not included" in n for n in plain.notes)


def test_dense_model_is_6nt_plus_attention_and_recompute_skips_lm_head() -> None:
    spec = spec_from_config(_config("Llama-3.1-8B.json"))
    seq, batch = 2048, 1
    tokens = seq * batch
    matmul_params = sum(lin.params for lin in spec.linears)  # embeddings are lookups
    head = sum(lin.params for lin in spec.linears if lin.group == "head")
    attn = attention_core_forward(spec, seq, batch)
    plain = step_flops(spec, TrainingSetup(checkpointing="none"), seq, batch)
    ckpt = step_flops(spec, TrainingSetup(checkpointing="gpu"), seq, batch)
    assert plain.total == pytest.approx(6 * matmul_params * tokens + 3.5 * attn)
    assert plain.model_flops == pytest.approx(6 * matmul_params * tokens + 3 * attn)
    assert ckpt.recompute == pytest.approx(2 * (matmul_params - head) * tokens + attn)
    # the rules of thumb hold within a few percent at this length
    n = spec.params_total
    assert plain.model_flops / (6 * n * tokens) == pytest.approx(1.0, abs=0.06)
    assert ckpt.total / (8 * n * tokens) == pytest.approx(1.0, abs=0.06)


def test_lora_backward_is_about_half_of_full_fine_tuning() -> None:
    spec = spec_from_config(_config("Llama-3.1-8B.json"))
    full = step_flops(spec, TrainingSetup(method="full", checkpointing="none"), 4096, 1)
    lora = step_flops(spec, TrainingSetup(method="lora", checkpointing="none"), 4096, 1)
    linear_full = sum(p.backward for k, p in full.parts.items() if k != "attention_core")
    linear_lora = sum(
        p.backward for k, p in lora.parts.items() if k not in ("attention_core", "lora")
    )
    assert linear_lora == pytest.approx(linear_full / 2)
    assert lora.backward / full.backward == pytest.approx(0.5, abs=0.05)
    assert lora.forward > full.forward  # adapters add forward work
    assert lora.parts["attention_core"] == full.parts["attention_core"]


def test_moe_counts_active_experts_only() -> None:
    spec = spec_from_config(_config("tiny-qwen3-moe.json"))
    f = step_flops(spec, TrainingSetup(checkpointing="none"), 64, 1)
    experts = [lin for lin in spec.linears if lin.group == "experts"]
    active = sum(2 * lin.in_features * lin.out_features * lin.count * 2 for lin in experts)
    assert f.parts["experts"].forward == pytest.approx(active * 64)  # 2 of 4 experts per token
    assert f.parts["router"].forward > 0


def test_causal_attention_counts_half_the_pairs_and_a_window_bounds_them() -> None:
    assert attention_pairs(1000) == 500_000
    assert attention_pairs(1000, causal=False) == 1_000_000
    assert attention_pairs(1000, window=4000) == attention_pairs(1000)
    # beyond the window the pairs grow linearly: w keys per query
    w = 512
    assert attention_pairs(8192, w) - attention_pairs(4096, w) == pytest.approx(4096 * w)


def test_gated_deltanet_is_linear_in_sequence_length() -> None:
    spec = spec_from_config(_config("qwen3.5-27b.json"))
    a = gated_deltanet_forward(spec, 64 * 100, 1)
    b = gated_deltanet_forward(spec, 64 * 200, 1)
    conv_tail = 2 * spec.linear_attention.conv_dim * spec.linear_attention.conv_kernel * 3 * 48
    assert b - conv_tail == pytest.approx(2 * (a - conv_tail))
    full = attention_core_forward(spec, 64 * 200, 1) / attention_core_forward(spec, 64 * 100, 1)
    assert full == pytest.approx(4.0)


def test_hybrid_model_parts_cover_every_layer_type() -> None:
    spec = spec_from_config(_config("qwen3.5-27b.json"))
    f = step_flops(spec, TrainingSetup(method="lora", checkpointing="offload"), 48000, 1)
    assert {
        "attention",
        "linear_attention",
        "mlp",
        "head",
        "lora",
        "attention_core",
        "linear_attention_core",
    } <= set(f.parts)
    assert f.recompute == pytest.approx(sum(p.recompute for p in f.parts.values()))
    assert f.parts["head"].recompute == 0


# --- against torch.utils.flop_counter on a real model -------------------------------------


def _flop_counter_step(model, ids, backward: bool = True) -> dict[str, int]:
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import (
        FlopCounterMode,
        sdpa_backward_flop_count,
        sdpa_flop_count,
    )

    aten = torch.ops.aten
    mapping = {
        # FlopCounterMode has no formula for the CPU flash kernel (counts 0): use torch's own
        aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, **kw: sdpa_flop_count(
            q, k, v
        ),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda g, q, k, v, *a, **kw: (
            sdpa_backward_flop_count(g, q, k, v)
        ),
    }
    counter = FlopCounterMode(display=False, custom_mapping=mapping)
    with counter:
        out = model(input_ids=ids, labels=ids) if backward else model(input_ids=ids)
        if backward:
            out.loss.backward()
    return {str(k): int(v) for k, v in counter.get_flop_counts()["Global"].items()}


def test_tiny_llama_step_equals_flop_counter_mode() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = _config("tiny-llama.json")
    hf = transformers.LlamaConfig(
        **{k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        hf, attn_implementation="sdpa", dtype=torch.float32
    ).train()
    seq, batch = 128, 2
    counts = _flop_counter_step(model, torch.randint(0, cfg["vocab_size"], (batch, seq)))
    ours = step_flops(spec_from_config(cfg), TrainingSetup(checkpointing="none"), seq, batch)

    matmuls = sum(p.total for k, p in ours.parts.items() if k != "attention_core")
    assert counts["aten.mm"] == pytest.approx(matmuls, rel=1e-9)
    # torch counts attention without the causal halving: 2x our convention
    attn = ours.parts["attention_core"]
    assert counts["aten._scaled_dot_product_flash_attention_for_cpu"] == 2 * attn.forward
    assert counts["aten._scaled_dot_product_flash_attention_for_cpu_backward"] == 2 * attn.backward
    torch_total = sum(counts.values())
    same_convention = ours.total + attn.forward + attn.backward
    assert same_convention == pytest.approx(torch_total, rel=0.02)


def test_tiny_qwen35_linear_attention_forward_equals_flop_counter_mode() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = _config("tiny-qwen3.5.json")
    hf = transformers.AutoConfig.for_model(**cfg["text_config"])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        hf, attn_implementation="sdpa", dtype=torch.float32
    )
    seq = 128
    counts = _flop_counter_step(model, torch.randint(0, 512, (1, seq)), backward=False)
    spec = spec_from_config(cfg)
    ours = step_flops(spec, TrainingSetup(checkpointing="none"), seq, 1)
    projections = sum(p.forward for k, p in ours.parts.items() if not k.endswith("_core"))
    assert counts["aten.mm"] == projections
    # bmm (chunked delta rule) + conv1d; the triangular solves are not matmuls to torch
    assert counts["aten.bmm"] + counts["aten.convolution"] == gated_deltanet_matmul_forward(
        spec, seq, 1
    )
    assert counts["aten._scaled_dot_product_flash_attention_for_cpu"] == 2 * attention_core_forward(
        spec, seq, 1
    )
