"""The new layer kinds (MLA, chunked attention, attention sinks, MXFP4 expert banks, vision
extras) through the memory and FLOP paths."""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.architectures import spec_from_config
from estimator.architectures.attention import chunked_pairs
from estimator.lora import runnable_targets
from estimator.memory import memory_breakdown
from estimator.memory.activations import Context, layer_activations
from estimator.profile import load_profile
from estimator.setup import TrainingSetup
from estimator.spec import LAYER_CHUNKED, MXFP4_BYTES_PER_PARAM, ModelSpec
from estimator.time.flops import attention_core_forward, attention_pairs, step_flops
from tests.estimator.test_architectures import MULTIMODAL, NEW_FAMILIES, TINY, _multimodal_config

DEFAULT = load_profile("default")
SETUPS = [
    TrainingSetup(method="full", checkpointing="none"),
    TrainingSetup(method="full", checkpointing="gpu", attention="eager"),
    TrainingSetup(method="lora", lora_rank=4, checkpointing="gpu"),
    TrainingSetup(method="qlora", lora_rank=4, checkpointing="none", attention="flash"),
]


def _tiny(model_type: str) -> ModelSpec:
    transformers = pytest.importorskip("transformers")
    return spec_from_config(transformers.CONFIG_MAPPING[model_type](**TINY[model_type]).to_dict())


def _all_specs() -> list[tuple[str, str]]:
    return [("tiny", t) for t in NEW_FAMILIES] + [("multimodal", t) for t in sorted(MULTIMODAL)]


@pytest.mark.parametrize("kind,model_type", _all_specs())
@pytest.mark.parametrize("setup_index", range(len(SETUPS)))
def test_memory_and_flops_are_finite_and_positive(kind: str, model_type: str, setup_index: int):
    spec = _tiny(model_type) if kind == "tiny" else spec_from_config(_multimodal_config(model_type))
    setup = runnable_targets(spec, SETUPS[setup_index])  # Llama 4: all-linear fails in peft
    mem = memory_breakdown(spec, setup, [64, 256], 2, DEFAULT)
    assert not mem.not_computable
    for name, value in mem.components.items():
        arr = np.asarray(value, dtype=float)
        assert np.all(np.isfinite(arr)) and np.all(arr >= 0), name
    assert np.all(np.diff(np.asarray(mem.peak, dtype=float)) > 0)  # longer sequences cost more
    flops = step_flops(spec, setup, 256, 2)
    assert flops.total > flops.model_flops * 0 and math.isfinite(flops.total)
    assert flops.parts["attention_core"].forward > 0


def test_mla_attention_core_uses_qk_and_v_head_dims() -> None:
    spec = _tiny("deepseek_v3")
    assert spec.mla is not None and spec.qk_head_dim == 24 and spec.v_head_dim == 16
    assert spec.num_heads and spec.layers
    seq = 128
    expected = 2.0 * attention_pairs(seq) * spec.num_heads * (24 + 16) * spec.layers
    assert attention_core_forward(spec, seq, 1) == expected


@pytest.mark.parametrize("model_type", ["deepseek_v3", "gpt_oss", "llama4_text"])
def test_forward_equals_flop_counter_mode(model_type: str) -> None:
    """Projections (MLA's five, routed and shared experts, routers, head) and the eager
    attention matmuls of tiny DeepSeek-V3 / gpt-oss / Llama 4 models against torch's
    FlopCounterMode (`experts_implementation="eager"`: the per-expert loop, whose matmuls torch
    counts; the default grouped kernel has no FLOP formula)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    config = transformers.CONFIG_MAPPING[model_type](**TINY[model_type])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
    )
    seq = 32
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(input_ids=torch.randint(0, 300, (1, seq)))
    counts = {str(k): int(v) for k, v in counter.get_flop_counts()["Global"].items()}
    spec = spec_from_config(config.to_dict())
    parts = step_flops(spec, TrainingSetup(checkpointing="none"), seq, 1).parts
    linear = sum(p.forward for k, p in parts.items() if k != "attention_core")
    # eager attention: QK^T and PV as bmm over the full s x s (ours halves for causality)
    bmm = 2 * parts["attention_core"].forward
    if model_type == "llama4_text":
        # Llama4TextExperts: a bmm over every expert for every token (dense), E/k x routed
        assert spec.moe is not None and spec.moe.dense_compute
        dense = parts["experts"].forward * spec.moe.num_experts / spec.moe.experts_per_token
        linear -= parts["experts"].forward
        bmm += dense
    assert counts["aten.mm"] + counts.get("aten.addmm", 0) == linear
    assert counts["aten.bmm"] == bmm


def test_mla_activations_count_the_latent_path() -> None:
    spec = _tiny("deepseek_v3")
    ctx = Context.build(spec, TrainingSetup(method="full"), 2)
    mla = layer_activations(ctx, spec, "full_attention", "dense")
    plain = spec_from_config({**TINY["llama"], "model_type": "llama"})
    ctx_plain = Context.build(plain, TrainingSetup(method="full"), 2)
    llama = layer_activations(ctx_plain, plain, "full_attention", "dense")
    assert mla.per_token != llama.per_token
    assert mla.per_token_seq == 0.0
    eager = Context.build(spec, TrainingSetup(method="full", attention="eager"), 2)
    assert layer_activations(eager, spec, "full_attention", "dense").per_token_seq > 0


def test_chunked_pairs_cut_the_sequence_into_blocks() -> None:
    assert chunked_pairs(100, 32) == (3 * 32 * 32 + 4 * 4) / 2
    assert chunked_pairs(100, 32, causal=False) == 3 * 32 * 32 + 4 * 4
    assert chunked_pairs(20, 32) == attention_pairs(20)
    assert chunked_pairs(64, None) == attention_pairs(64)


def test_llama4_chunked_layers_cost_less_attention_than_full() -> None:
    spec = _tiny("llama4_text")
    assert spec.count_layers(LAYER_CHUNKED) == 3 and spec.attention_chunk == 32
    seq = 256
    chunked = attention_core_forward(spec, seq, 1)
    assert spec.num_heads and spec.head_dim
    per_pair = 2.0 * spec.num_heads * 2 * spec.head_dim
    assert chunked == per_pair * (attention_pairs(seq) + 3 * chunked_pairs(seq, 32))


def test_gpt_oss_sinks_force_eager_attention_under_sdpa() -> None:
    spec = _tiny("gpt_oss")
    assert spec.requires_eager and spec.attention_sinks
    assert [g.params for g in spec.others if g.name == "attention_sinks"] == [2 * 4]
    sdpa = Context.build(spec, TrainingSetup(attention="sdpa"), 2)
    flash = Context.build(spec, TrainingSetup(attention="flash"), 2)
    assert sdpa.eager and not flash.eager
    assert spec.layer_types == ("sliding_attention", "full_attention")
    assert spec.sliding_window == 128


def test_gpt_oss_mxfp4_expert_banks_are_recorded_with_their_bytes() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.integrations.mxfp4 import Mxfp4GptOssExperts

    raw = transformers.CONFIG_MAPPING["gpt_oss"](**TINY["gpt_oss"]).to_dict()
    assert "mxfp4" not in spec_from_config(raw).stored_bytes_by_dtype
    raw["quantization_config"] = {"quant_method": "mxfp4"}
    spec = spec_from_config(raw)
    h, i, e, layers = 64, 160, 4, 2
    assert spec.stored_bytes_by_dtype == {"mxfp4": layers * e * 3 * h * i}
    # transformers packs two FP4 values per uint8 (the blocks), plus one uint8 scale per 32
    with torch.device("meta"):
        experts = Mxfp4GptOssExperts(transformers.GptOssConfig(**TINY["gpt_oss"]))
    packed = experts.gate_up_proj.numel() + experts.down_proj.numel()
    assert experts.gate_up_proj.dtype == torch.uint8
    assert packed == e * 3 * h * i / 2
    assert (packed + packed / 16) / (e * 3 * h * i) == MXFP4_BYTES_PER_PARAM


def test_mla_eager_saved_bytes_equal_torch_saved_tensor_hooks() -> None:
    """Every tensor autograd saves in one bf16 DeepseekV3Attention (eager), deduplicated by
    storage and without the parameters and the rotary tables, against `mla_attention`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    from estimator.memory.activations_mla import mla_attention

    raw = {**TINY["deepseek_v3"], "hidden_size": 256, "num_attention_heads": 8}
    config = transformers.DeepseekV3Config(**{**raw, "num_key_value_heads": 8})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = ds.DeepseekV3Attention(config, 0).to(torch.bfloat16).train()
    batch, seq = 2, 64
    x = torch.randn(batch, seq, 256, dtype=torch.bfloat16, requires_grad=True)
    rotary = ds.DeepseekV3RotaryEmbedding(config)(x, torch.arange(seq)[None].expand(batch, -1))
    measured = _saved_bytes(attn, x, rotary, None)
    spec = spec_from_config(config.to_dict())
    ctx = Context.build(spec, TrainingSetup(method="full", attention="eager"), 2)
    per_token, per_seq = mla_attention(ctx, spec)
    tokens = batch * seq
    assert measured == per_token * tokens + per_seq * tokens * seq


def _saved_bytes(module, *args) -> int:
    """Bytes of the distinct storages autograd saves in `module(*args)` and still holds after
    the forward (saved by graph nodes that reach the output; a dead branch's are freed at
    once), without the module's parameters and the extra arguments (rotary tables)."""
    import weakref

    torch = pytest.importorskip("torch")
    skip = {p.untyped_storage().data_ptr() for p in module.parameters()}
    for arg in args[1:]:
        for t in arg if isinstance(arg, tuple) else (arg,):
            if isinstance(t, torch.Tensor):
                skip.add(t.untyped_storage().data_ptr())
    refs = []

    def pack(t):
        refs.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*args)
    alive: dict[int, int] = {}
    for ref in refs:
        t = ref()
        if t is not None and t.untyped_storage().data_ptr() not in skip:
            alive[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    del out
    return sum(alive.values())


def test_sinks_eager_saved_bytes_equal_torch_saved_tensor_hooks() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss import modeling_gpt_oss as oss

    from estimator.memory.activations_sinks import sinks_attention

    config = transformers.GptOssConfig(**TINY["gpt_oss"])
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = oss.GptOssAttention(config, 0).to(torch.bfloat16).train()
    batch, seq = 2, 64
    x = torch.randn(batch, seq, 64, dtype=torch.bfloat16, requires_grad=True)
    rotary = oss.GptOssRotaryEmbedding(config)(x, torch.arange(seq)[None].expand(batch, -1))
    measured = _saved_bytes(attn, x, rotary, None)
    spec = spec_from_config(config.to_dict())
    ctx = Context.build(spec, TrainingSetup(method="full", precision="bf16"), 2)  # sdpa -> eager
    per_token, per_seq = sinks_attention(ctx, spec)
    tokens = batch * seq
    assert measured == per_token * tokens + per_seq * tokens * seq


def test_llama4_dense_experts_saved_bytes_close_to_torch() -> None:
    """Llama4TextMoe runs every expert on every token: the saved tensors are those of all
    experts (within 2 %: the generic MoE accounting counts the block input once for the router
    and once for the shared expert, and leaves out the top-k indices and scores); routed
    top-1 accounting would miss most of them."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from dataclasses import replace

    from transformers.models.llama4 import modeling_llama4 as l4

    from estimator.memory.activations import _mlp

    config = transformers.Llama4TextConfig(**TINY["llama4_text"])
    torch.manual_seed(0)
    moe = l4.Llama4TextMoe(config).to(torch.bfloat16).train()
    batch, seq = 2, 64
    x = torch.randn(batch, seq, 64, dtype=torch.bfloat16, requires_grad=True)
    measured = _saved_bytes(moe, x)
    spec = spec_from_config(config.to_dict())
    ctx = Context.build(spec, TrainingSetup(method="full", precision="bf16"), 2)  # bf16 module
    tokens = batch * seq
    assert _mlp(ctx, spec, True)[0] * tokens == pytest.approx(measured, rel=0.02)
    assert spec.moe is not None
    routed = replace(spec, moe=replace(spec.moe, dense_compute=False))
    assert _mlp(ctx, routed, True)[0] * tokens < 0.5 * measured


@pytest.mark.parametrize("method", ["full", "lora"])
def test_gpt_oss_moe_saved_bytes_equal_torch_saved_tensor_hooks(method: str) -> None:
    """GptOssMLP (router + experts with the clamped SwiGLU, transformers' default grouped_mm
    experts) against `gpt_oss_experts`; under LoRA the router and banks are frozen (peft does
    not adapt them for gpt-oss)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from estimator.memory.activations import _mlp

    config = transformers.GptOssConfig(**TINY["gpt_oss"])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, experts_implementation="grouped_mm", dtype=torch.bfloat16
    ).train()
    mlp = model.model.layers[0].mlp
    if method == "lora":
        mlp.requires_grad_(False)
    batch, seq = 2, 64
    x = torch.randn(batch, seq, 64, dtype=torch.bfloat16, requires_grad=True)
    measured = _saved_bytes(mlp, x)
    spec = spec_from_config(config.to_dict())
    precision = "bf16" if method == "full" else "mixed"  # a bf16 module, not AMP's fp32 banks
    ctx = Context.build(spec, TrainingSetup(method=method, lora_rank=4, precision=precision), 2)
    per_layer_counts = 4 * 4  # grouped_mm's int32 offsets, one per expert: not per token
    assert _mlp(ctx, spec, True)[0] * batch * seq + per_layer_counts == measured


@pytest.mark.parametrize(
    ("method", "autocast"), [("full", False), ("lora", False), ("full", True), ("lora", True)]
)
def test_deepseek_moe_saved_bytes_equal_torch_saved_tensor_hooks(
    method: str, autocast: bool
) -> None:
    """DeepseekV3MoE (grouped-sigmoid router in fp32, grouped_mm experts, shared experts)
    against `deepseek_moe`; `lora` adapts q_b_proj only, so the whole block is frozen. Under
    (CPU) autocast the router's F.linear casts its fp32 copies to bf16 and saves those, and the
    scores and weights it derives are bf16 (`router_bytes`); autocast's bf16 copy of the fp32
    router weight, saved for the input's gradient, is per layer, not per token (added here)."""
    import contextlib

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    from estimator.memory.activations import _mlp

    config = transformers.DeepseekV3Config(**{**TINY["deepseek_v3"], "moe_intermediate_size": 24})
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    moe = ds.DeepseekV3MoE(config).to(torch.bfloat16).train()
    moe.gate.weight.data = moe.gate.weight.data.float()  # kept in fp32 (_keep_in_fp32_modules)
    if method == "lora":
        moe.requires_grad_(False)
    batch, seq = 2, 64
    x = torch.randn(batch, seq, 64, dtype=torch.bfloat16, requires_grad=True)
    mode = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with mode:
        measured = _saved_bytes(moe, x)
    spec = spec_from_config(config.to_dict())
    precision = "bf16" if method == "full" else "mixed"  # a bf16 module, not AMP's fp32 banks
    setup = TrainingSetup(
        method=method,
        lora_rank=4,
        lora_targets=["q_b_proj"],
        precision=precision,
        autocast=autocast,
    )
    ctx = Context.build(spec, setup, 2)
    offsets = 4 * 8  # grouped_mm's int32 offsets, one per expert: not per token
    router_weight = 2 * 64 * config.n_routed_experts if autocast else 0  # saved for d(input)
    assert _mlp(ctx, spec, True)[0] * batch * seq + offsets + router_weight == measured


def test_qwen3_moe_amp_experts_saved_bytes_equal_torch_saved_tensor_hooks() -> None:
    """Qwen3MoeSparseMoeBlock under AMP full fine-tuning (fp32 weights, the fp32 norm output as
    input, CPU autocast to bf16): transformers' grouped_mm experts cast their input to the
    banks' dtype and `_grouped_mm` is on no autocast list, so the expert tensors are fp32
    (`expert_bytes`); counting them in bf16 misses half of them. Besides `_mlp`, the block
    saves, per layer, the router weight's bf16 autocast copy and grouped_mm's int32 offsets,
    and per token int64 indices the generic MoE accounting leaves out (topk's indices,
    `perm // top_k`, `perm`, `inv_perm`: k each) and the fp32 top-k sum."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from estimator.memory.activations import _mlp

    config = transformers.Qwen3MoeConfig(**TINY["qwen3_moe"])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, experts_implementation="grouped_mm"
    ).train()
    mlp = model.model.layers[0].mlp
    batch, seq = 2, 64
    x = torch.randn(batch, seq, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        measured = _saved_bytes(mlp, x)
    spec = spec_from_config(config.to_dict())
    assert spec.moe is not None and spec.hidden
    ctx = Context.build(spec, TrainingSetup(method="full", precision="mixed"), 2)
    e, k, tokens = spec.moe.num_experts, spec.moe.experts_per_token, batch * seq
    per_layer = 2 * e * spec.hidden + 4 * e  # router weight's bf16 copy, int32 offsets
    indices = tokens * (4 * 8 * k + 4)
    assert _mlp(ctx, spec, True)[0] * tokens + per_layer + indices == measured


def test_amp_weight_casts_equal_autocast_copies_of_a_moe_model() -> None:
    """`autocast_layer_casts` against the bf16 copies of parameters a tiny Qwen3-MoE's forward
    makes under CPU autocast (fp32 weights): the attention, router and dense-MLP Linears are
    cast, the grouped_mm expert banks are not (the LM head is `autocast_forward_casts`')."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils._python_dispatch import TorchDispatchMode

    from estimator.memory.activations import autocast_layer_casts

    config = transformers.Qwen3MoeConfig(**TINY["qwen3_moe"])
    model = transformers.AutoModelForCausalLM.from_config(
        config, experts_implementation="grouped_mm"
    ).train()
    names = {p.untyped_storage().data_ptr(): n for n, p in model.named_parameters()}
    casts: dict[str, int] = {}

    class Casts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and out.dtype == torch.bfloat16:
                name = names.get(args[0].untyped_storage().data_ptr())
                if name is not None and not name.startswith("lm_head"):
                    casts[name] = out.untyped_storage().nbytes()
            return out

    with torch.autocast("cpu", dtype=torch.bfloat16), Casts():
        model(input_ids=torch.randint(0, 300, (2, 16)))
    spec = spec_from_config(config.to_dict())
    assert not [n for n in casts if ".experts." in n]
    assert autocast_layer_casts(spec) * (spec.layers or 0) == sum(casts.values())


def test_gpt_oss_amp_experts_saved_bytes_equal_torch_saved_tensor_hooks() -> None:
    """GptOssMLP with fp32 weights under CPU autocast (AMP full fine-tuning): the grouped_mm
    expert tensors are fp32 (`expert_bytes`), the router's softmax and routing weights stay
    bf16 (its F.linear is autocast's, softmax keeps that dtype); per layer the router weight's
    bf16 copy and grouped_mm's int32 offsets."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from estimator.memory.activations import _mlp

    config = transformers.GptOssConfig(**TINY["gpt_oss"])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, experts_implementation="grouped_mm"
    ).train()
    mlp = model.model.layers[0].mlp
    batch, seq = 2, 64
    x = torch.randn(batch, seq, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        measured = _saved_bytes(mlp, x)
    spec = spec_from_config(config.to_dict())
    assert spec.moe is not None and spec.hidden
    ctx = Context.build(spec, TrainingSetup(method="full", precision="mixed"), 2)
    e = spec.moe.num_experts
    per_layer = 2 * e * spec.hidden + 4 * e  # router weight's bf16 copy, int32 offsets
    assert _mlp(ctx, spec, True)[0] * batch * seq + per_layer == measured
