"""Training stacks (issue 10): each formula fix against the `probe` stack (the estimator's
behaviour before stacks) or the libraries' own defaults, so each test fails without its fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from estimator.architectures import spec_from_config
from estimator.dtypes import nf4_bytes_per_param
from estimator.memory import memory_breakdown
from estimator.memory.activations import (
    Context,
    head_input_saved,
    inputs_saved,
    layer_activations,
)
from estimator.memory.logits import loss_bytes, loss_bytes_per_logit, loss_rule
from estimator.memory.reserved import segment_waste
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup
from estimator.spec import LAYER_FULL, MLP_DENSE
from estimator.stacks import FACTS, OVERRIDES, STACKS, load_stack

LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
MOE = spec_from_config(preset_config("qwen3-30b-a3b"))
MISTRAL = spec_from_config(preset_config("mistral-7b"))
DEFAULT = load_profile("default")
REF = Path(__file__).parents[1] / "data" / "reference_configs"
QLORA = {"method": "qlora", "lora_targets": ["all-linear"]}


def _gemma2():
    """A Gemma-2-shaped config built from Llama's (model_type gemma2, sliding window)."""
    config = json.loads((REF / "meta-llama_Llama-3.1-8B.json").read_text())
    config.update(model_type="gemma2", sliding_window=4096, head_dim=128)
    return spec_from_config(config)


def _mem(setup: TrainingSetup, seq: int = 4096, batch: int = 1, spec=LLAMA8B, devices=None):
    return memory_breakdown(spec, setup, [seq], batch, DEFAULT, devices=devices)


def _c(mem, name: str) -> float:
    return float(mem.components[name][0])


# --- the stack files ---------------------------------------------------------------------


@pytest.mark.parametrize("name", STACKS)
def test_every_stack_fact_has_a_source(name: str) -> None:
    stack = load_stack(name)
    for key in OVERRIDES + FACTS:
        assert stack.entries[key].source.strip(), (name, key)
    if name != "probe":  # facts that differ from the probe loop name the file they come from
        probe = load_stack("probe")
        for key, fact in stack.entries.items():
            if fact.value != probe.get_optional(key, None):
                assert re.search(r"[\w/]+\.(py|yaml|sh|h)|et al\.", fact.source), (name, key)


def test_unset_overrides_resolve_from_the_stack_and_are_echoed() -> None:
    s = TrainingSetup(stack="unsloth", method="qlora")
    dumped = s.model_dump()
    for key in OVERRIDES:
        assert key in dumped
    assert (s.checkpointing, s.loss, s.double_quant) == ("offload", "unsloth", True)
    assert TrainingSetup(stack="unsloth", checkpointing="gpu").checkpointing == "gpu"
    assert TrainingSetup.model_validate(dumped) == s  # the echo round-trips


def test_hf_stack_defaults_are_the_installed_libraries_defaults() -> None:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    hf = TrainingSetup(method="qlora")
    assert hf.double_quant is transformers.BitsAndBytesConfig().bnb_4bit_use_double_quant
    assert hf.lora_dropout == peft.LoraConfig().lora_dropout
    args = transformers.TrainingArguments(output_dir="/tmp/trainfit-test-args", report_to=[])
    assert "fused" in str(getattr(args.optim, "value", args.optim))
    assert hf.optimizer_impl == "fused"
    assert args.gradient_accumulation_steps == hf.grad_accum


# --- formula fixes -------------------------------------------------------------------------


def test_moe_expert_banks_stay_bf16_under_transformers_bnb() -> None:
    setup = TrainingSetup(**QLORA, kbit_prepare=False)
    experts = sum(lin.params for lin in MOE.linears if lin.experts > 1)
    dense_linear = sum(
        lin.params for lin in MOE.linears if lin.experts == 1 and lin.group != "head"
    )
    expected = dense_linear * nf4_bytes_per_param(False) + (MOE.params_total - dense_linear) * 2
    weights = _c(_mem(setup, spec=MOE), "weights")
    assert weights == pytest.approx(expected)
    assert weights > 2 * experts
    probe = _c(_mem(TrainingSetup(stack="probe", **QLORA), spec=MOE), "weights")
    assert weights > 3 * probe


def test_double_quant_default_is_off_for_hf() -> None:
    on = _c(_mem(TrainingSetup(**QLORA, double_quant=True)), "weights")
    off = _c(_mem(TrainingSetup(**QLORA)), "weights")
    quantized = LLAMA8B.params_linear
    assert off - on == pytest.approx(quantized * (0.5625 - nf4_bytes_per_param(True)))


def test_kbit_preparation_makes_the_residual_stream_and_the_rest_fp32() -> None:
    prepared = _mem(TrainingSetup(**QLORA, kbit_prepare=True))
    bare = _mem(TrainingSetup(**QLORA))
    per_layer = 4096 * LLAMA8B.hidden
    rope = 2 * 4096 * 128  # cos and sin per forward (activations.rope_table_bytes), per byte
    assert _c(prepared, "checkpoints") == 4 * (per_layer * LLAMA8B.layers + rope)
    assert _c(bare, "checkpoints") == 2 * (per_layer * LLAMA8B.layers + rope)
    rest = LLAMA8B.params_total - LLAMA8B.params_linear
    assert _c(prepared, "weights") - _c(bare, "weights") == pytest.approx(2 * rest)
    ctx = Context.build(LLAMA8B, TrainingSetup(**QLORA, kbit_prepare=True), 2)
    assert ctx.compute_bytes == 4 and ctx.attn_bytes == 2  # SDPA under autocast: bf16
    assert TrainingSetup(**QLORA).kbit_prepare is False  # TRL v1.9 does not call it


def test_chunked_loss_chunks_each_row() -> None:
    setup = TrainingSetup(stack="probe", loss="chunked", loss_chunk=4096)
    mem = _mem(setup, seq=8192, batch=4)
    vocab, h = LLAMA8B.vocab, LLAMA8B.hidden
    expected = 4 * 4096 * vocab * loss_bytes_per_logit(2, False) + 4 * 8192 * h * 2
    assert _c(mem, "logits") == pytest.approx(expected)


def test_nf4_layers_are_gathered_in_their_storage_dtype_under_fsdp() -> None:
    # `--sharding fsdp` is the FSDP2 layout (estimator/parallel/of_setup.py): the root unit
    # (embedding + lm_head, bf16: not quantized) stays unsharded, two layer units are gathered
    config = json.loads((REF / "meta-llama_Llama-3.1-8B.json").read_text())
    spec = spec_from_config({**config, "vocab_size": 32000})
    setup = TrainingSetup(**QLORA, sharding="fsdp", num_gpus=8, kbit_prepare=False)
    hf_mem = _mem(setup, spec=spec, devices=8)
    hf = _c(hf_mem, "weights")
    # stack probe, same options: the gathered layers counted at 2 bytes per parameter
    probe = _c(_mem(setup.model_copy(update={"stack": "probe"}), spec=spec, devices=8), "weights")
    nf4 = nf4_bytes_per_param(False)
    head = sum(lin.params for lin in spec.linears if lin.group == "head")
    embed = sum(g.params for g in spec.others if g.name == "embed_tokens")
    layer_linear = sum(lin.params for lin in spec.linears if lin.group != "head")
    layer_dense = (spec.params_total - head - embed - layer_linear) / spec.layers
    per_layer_nf4 = layer_linear / spec.layers * nf4 + layer_dense * 2
    per_layer_bf16 = (layer_linear / spec.layers + layer_dense) * 2
    assert hf_mem.parallel is not None
    assert hf_mem.parallel["fsdp_root_unsharded"] == pytest.approx((embed + head) * 2)
    assert hf_mem.parallel["fsdp_gathered_units"] == pytest.approx(2 * per_layer_nf4, rel=1e-3)
    # the layer units alive at the weights' peak moment (one at the loss, FSDP2's backward
    # prefetch; two in the backward) are what differs: bf16 under probe, nf4 under hf
    units = (probe - hf) / (per_layer_bf16 - per_layer_nf4)
    assert units == pytest.approx(round(units), rel=1e-3) and round(units) in (1, 2)


def test_gemma2_runs_eager_attention_under_transformers() -> None:
    gemma = _gemma2()
    hf = Context.build(gemma, TrainingSetup(method="lora"), 2)
    probe = Context.build(gemma, TrainingSetup(stack="probe", method="lora"), 2)
    assert hf.eager and not probe.eager
    acts = layer_activations(hf, gemma, LAYER_FULL, MLP_DENSE)
    assert acts.per_token_seq > 0


def test_gemma2_runs_its_own_eager_attention_under_torchtune() -> None:
    """torchtune 0.6.1's Gemma2Attention computes the softcapped scores itself
    (models/gemma2/_attention.py:299-341); every other torchtune model calls SDPA."""
    gemma = _gemma2()
    tune = Context.build(gemma, TrainingSetup(stack="torchtune", method="lora"), 2)
    assert tune.eager
    llama = Context.build(LLAMA8B, TrainingSetup(stack="torchtune", method="lora"), 2)
    assert not llama.eager


def test_sliding_window_mask_is_materialised_from_the_window_on() -> None:
    """transformers 5.25.0 masking_utils.py:286: `kv_length >= local_attention_size` (the
    window itself included) cannot skip the mask."""
    setup = TrainingSetup(method="lora")
    short = _mem(setup, seq=4095, spec=MISTRAL)
    at_window = _mem(setup, seq=4096, spec=MISTRAL)
    at_flash = _mem(setup.model_copy(update={"attention": "flash"}), seq=4096, spec=MISTRAL)
    assert _c(at_window, "checkpoints") - _c(at_flash, "checkpoints") == 4096**2
    long = _mem(setup, seq=16384, spec=MISTRAL)
    flash = _mem(setup.model_copy(update={"attention": "flash"}), seq=16384, spec=MISTRAL)
    probe = _mem(setup.model_copy(update={"stack": "probe"}), seq=16384, spec=MISTRAL)
    assert _c(long, "checkpoints") - _c(flash, "checkpoints") == 16384**2
    rope = 2 * 128 * 2  # bf16 cos and sin per token per forward (activations.rope_table_bytes)
    assert _c(long, "checkpoints") - _c(probe, "checkpoints") == 16384**2 + 16384 * rope
    assert _c(short, "checkpoints") == 4095 * MISTRAL.hidden * 2 * MISTRAL.layers + 4095 * rope


def test_hf_trainer_keeps_embeddings_in_32bit_under_8bit_adam() -> None:
    setup = TrainingSetup(method="full", optimizer="adamw-8bit", precision="bf16")
    hf = _mem(setup).states
    probe = _mem(setup.model_copy(update={"stack": "probe"})).states
    embed = sum(g.params for g in LLAMA8B.others if g.name == "embed_tokens")
    assert hf.optimizer - probe.optimizer == pytest.approx(embed * (8 - 2 * (1 + 4 / 256)))


def test_fused_adamw_has_no_state_sized_temporary() -> None:
    setup = TrainingSetup(method="full", precision="bf16")
    fused = _mem(setup).states
    foreach = _mem(setup.model_copy(update={"optimizer_impl": "foreach"})).states
    assert fused.step_transient == 0
    assert foreach.step_transient == LLAMA8B.params_total * 2
    probe = _mem(TrainingSetup(stack="probe", method="full", precision="bf16"))
    assert float(probe.allocated[0]) - float(_mem(setup).allocated[0]) == pytest.approx(
        LLAMA8B.params_total * 2, rel=0.02
    )


def test_lora_dropout_keeps_a_mask_and_a_dropped_copy_per_adapter() -> None:
    h, r = LLAMA8B.hidden, 16
    plain = Context.build(LLAMA8B, TrainingSetup(method="lora"), 2)
    dropped = Context.build(LLAMA8B, TrainingSetup(method="lora", lora_dropout=0.05), 2)
    qkv = ["q_proj", "k_proj", "v_proj"]
    # autocast: a bf16 copy per adapter either way; dropout adds a bool mask per adapter
    assert inputs_saved(plain, qkv, h) == 3 * h * 2 + 3 * r * 2
    assert inputs_saved(dropped, qkv, h) == 3 * h * (2 + 1) + 3 * r * 2
    none = TrainingSetup(method="lora", checkpointing="none", lora_dropout=0.05)
    assert _c(_mem(none), "checkpoints") > _c(
        _mem(none.model_copy(update={"lora_dropout": 0})), "checkpoints"
    )


def test_gradient_accumulation_keeps_gradients_through_forward_and_backward() -> None:
    setup = TrainingSetup(method="full", precision="bf16")
    one, four = _mem(setup), _mem(setup.model_copy(update={"grad_accum": 4}))
    held = _c(four, "weights") + _c(four, "trainable_states") + _c(four, "checkpoints")
    assert float(four.allocated[0]) >= held + _c(four, "logits")
    assert float(four.peak[0]) > float(one.peak[0])


@pytest.mark.parametrize("loss", ["liger", "cce", "unsloth"])
def test_fused_losses_never_materialise_all_logits(loss: str) -> None:
    seq = 32768  # unsloth: above its 4 GiB target, so more than one chunk
    full = _c(_mem(TrainingSetup(method="lora", loss="full"), seq=seq), "logits")
    fused = _c(_mem(TrainingSetup(method="lora", loss=loss), seq=seq), "logits")
    grad_hidden = seq * LLAMA8B.hidden * 2
    assert grad_hidden <= fused < full / 2


def test_unsloth_loss_holds_its_compiled_chunk_step() -> None:
    """Unsloth's fused cross-entropy runs each chunk compiled (unsloth_zoo ce232d6c
    fused_losses/cross_entropy_loss.py:350-356; unsloth 015bdef0d9 models/llama.py:1497-1508
    `torch_compile = True`): inductor overwrites the chunk's bf16 logits with their gradient
    (bench/unsloth_ce_compiled.py: 2.0 bytes per logit), so a chunk holds its logits, three fp32
    per row and its hidden-state gradient, not the eager chain's 12 bytes per logit; chunks keep
    their fp32 logits under the 4 GiB target."""
    rule = loss_rule(TrainingSetup(stack="unsloth", **QLORA), DEFAULT, 2)
    vocab, hidden = LLAMA8B.vocab, LLAMA8B.hidden
    shape, dtypes = (vocab, hidden), (2, 2)
    short = 2048  # fp32 logits 1.05 GB: one chunk
    expected = short * hidden * 2 + short * (vocab * 2 + 12 + 2 * hidden)
    assert loss_bytes(rule, short, short, shape, dtypes) == pytest.approx(expected)
    long = 131072  # fp32 logits 67 GB: chunks of at most 4 GiB of fp32 logits
    chunk = 4 * 2**30 / (vocab * 4)
    got = loss_bytes(rule, long, long, shape, dtypes)
    assert got == pytest.approx(long * hidden * 2 + chunk * (vocab * 2 + 12 + 2 * hidden))
    assert got - long * hidden * 2 < 2.1 * 2**30  # about half the target: bf16, not fp32 x 3


def test_torchtune_chunked_output_loss_keeps_every_chunks_log_softmax() -> None:
    """torchtune 0.6.1's CEWithChunkedOutputLoss: the model returns all 8 chunks' bf16 logits
    (modules/transformer.py:482-501), the loss keeps every chunk's fp32 log-softmax and upcasts
    one chunk at a time (ce_chunked_output_loss.py:35-43, 80-81): the forward peak is
    tokens x vocab x (2 + 4) + one chunk's fp32 upcast. (main's LinearCrossEntropyLoss, modelled
    before, made the logits per chunk: 4 bytes per logit + one chunk's 10.)"""
    seq = 8192
    tt = _c(_mem(TrainingSetup(stack="torchtune", method="lora"), seq=seq), "logits")
    vocab = LLAMA8B.vocab
    chunk = seq / 8
    expected = seq * vocab * (2 + 4) + chunk * vocab * 4
    expected += seq * (4 * LLAMA8B.hidden + 4)  # the frozen last norm's fp32 input and rsqrt
    assert tt == pytest.approx(expected)
    # batch 2: each row is split into 8 chunks (chunk(8, dim=1)), 2 x ceil(seq / 8) positions
    odd = 8190
    tt2 = _c(_mem(TrainingSetup(stack="torchtune", method="lora"), seq=odd, batch=2), "logits")
    tokens = 2 * odd
    expected2 = tokens * vocab * 6 + 2 * 1024 * vocab * 4 + tokens * (4 * LLAMA8B.hidden + 4)
    assert tt2 == pytest.approx(expected2)
    # fp32 logits: `.float()` returns them, no upcast
    fp32 = TrainingSetup(stack="torchtune", method="lora", precision="fp32")
    tt32 = _c(_mem(fp32, seq=seq), "logits")
    assert tt32 >= seq * vocab * (4 + 4)


def test_unsloth_fused_kernels_save_less_than_peft_per_layer() -> None:
    setup = TrainingSetup(stack="unsloth", method="qlora", lora_targets=["all-linear"])
    ctx = Context.build(LLAMA8B, setup, 2)
    assert ctx.fused and ctx.compute_bytes == 2
    acts = layer_activations(ctx, LLAMA8B, LAYER_FULL, MLP_DENSE)
    h, m = LLAMA8B.hidden, LLAMA8B.intermediate
    q, kv, heads = 4096, 1024, 32
    # o_proj's input is a view of the attention kernel's saved output: counted once
    expected = 2 * (2 * h + 4) + 2 * h + 2 * (q + 2 * kv) + 2 * q + 4 * heads
    expected += 2 * h + 2 * 2 * m
    assert acts.per_token == expected
    hf = layer_activations(
        Context.build(LLAMA8B, TrainingSetup(**QLORA), 2), LLAMA8B, LAYER_FULL, MLP_DENSE
    )
    assert acts.per_token < 0.7 * hf.per_token
    mem = _mem(setup, seq=65536)
    assert _c(mem, "checkpoints") == 65536 * h * 2  # one layer in flight, the rest on the host


def test_unsloth_kernels_only_for_the_models_it_dispatches_to_its_own_classes() -> None:
    """unsloth 015bdef0d9 models/loader.py:828-890 runs its kernels for llama, mistral, gemma,
    gemma2, qwen2 and qwen3 only; other types go to FastModel with transformers' modules."""
    setup = TrainingSetup(stack="unsloth", method="qlora", lora_targets=["all-linear"])
    assert Context.build(spec_from_config(preset_config("qwen3-8b")), setup, 2).fused
    assert Context.build(MISTRAL, setup, 2).fused
    gemma3 = json.loads((REF / "meta-llama_Llama-3.1-8B.json").read_text())
    gemma3.update(model_type="gemma3_text", head_dim=128)
    other = spec_from_config(gemma3)
    ctx = Context.build(other, setup, 2)
    assert not ctx.fused
    # its kernels need adapters on all of q, k, v, o, gate, up, down (llama.py:3695-3768)
    attention_only = setup.model_copy(update={"lora_targets": ["q_proj", "v_proj"]})
    assert not Context.build(LLAMA8B, attention_only, 2).fused
    hf_like = layer_activations(ctx, other, LAYER_FULL, MLP_DENSE)
    fused = layer_activations(Context.build(LLAMA8B, setup, 2), LLAMA8B, LAYER_FULL, MLP_DENSE)
    assert hf_like.per_token > fused.per_token


def test_selective_checkpointing_keeps_every_other_matmul() -> None:
    setup = TrainingSetup(stack="torchtitan", method="full", precision="mixed")
    assert setup.checkpointing == "selective"
    sel = _mem(setup)
    gpu = _mem(setup.model_copy(update={"checkpointing": "gpu"}))
    none = _mem(setup.model_copy(update={"checkpointing": "none"}))
    h, m, q, kv = 4096, LLAMA8B.intermediate, 4096, 1024
    # torchtitan 0.3.0 fuses q, k, v into wqkv: the five mms wqkv, wo, w1, w3, w2 keep the
    # odd ones (estimator/memory/torchtitan.py selective_saved_fused_qkv), SDPA out and lse
    per_token = 2 * (h + q + 2 * kv + m + h) + 2 * q + 4 * 32
    assert _c(sel, "checkpoints") == 4096 * per_token * LLAMA8B.layers
    assert _c(gpu, "checkpoints") < _c(sel, "checkpoints") < _c(none, "checkpoints")
    # torchtitan@9dec370 had separate wq, wk, wv: q, k, v, o, gate, up, down keep q, v, gate,
    # down (its parallelize_llama.py:214-265 policy)
    older = _mem(setup.model_copy(update={"stack": "torchtitan-2024"}))
    per_token = 2 * (h + q + kv + m + h) + 2 * q + 4 * 32
    assert _c(older, "checkpoints") == 4096 * per_token * LLAMA8B.layers


def test_compiled_selective_checkpointing_drops_the_unread_down_output() -> None:
    """Eager SAC caches every MUST_SAVE output; the compiled block saves only what its backward
    reads, and a dense layer's down projection output feeds only the residual add
    (bench/titan_sac_saved.py on torchtitan@9dec370). An MoE keeps its expert outputs."""
    eager = TrainingSetup(stack="torchtitan-2024", method="full", precision="mixed")
    assert eager.checkpointing == "selective" and not eager.compile
    compiled = eager.model_copy(update={"compile": True})
    h = 4096
    drop = _c(_mem(eager), "checkpoints") - _c(_mem(compiled), "checkpoints")
    assert drop == 4096 * 2 * h * LLAMA8B.layers
    moe = _c(_mem(eager, spec=MOE), "checkpoints") - _c(_mem(compiled, spec=MOE), "checkpoints")
    assert moe == 0


def test_optimizer_in_backward_frees_each_gradient_after_its_step() -> None:
    setup = TrainingSetup(method="full", precision="bf16", optimizer_impl="in-backward")
    states = _mem(setup).states
    largest = max(
        [lin.params // lin.count for lin in LLAMA8B.linears]
        + [g.params for g in LLAMA8B.others if g.name == "embed_tokens"]
    )
    assert states.grads == pytest.approx(largest * 2)
    fused = _mem(setup.model_copy(update={"optimizer_impl": "fused"}))
    assert float(_mem(setup).peak[0]) < float(fused.peak[0])


def test_paged_optimizer_states_leave_torchs_allocator() -> None:
    setup = TrainingSetup(method="full", precision="bf16", optimizer="adamw-8bit", paged=True)
    paged = _mem(setup)
    plain = _mem(setup.model_copy(update={"paged": False}))
    moved = plain.states.optimizer - paged.states.optimizer
    assert moved > 0.99 * plain.states.optimizer
    assert float(paged.host[0]) - float(plain.host[0]) == pytest.approx(moved)
    assert float(plain.allocated[0]) - float(paged.allocated[0]) >= 0.99 * moved


def test_train_embeddings_adds_peft_modules_to_save_copies() -> None:
    setup = TrainingSetup(method="lora", train_embeddings=True)
    states = _mem(setup).states
    base = _mem(setup.model_copy(update={"train_embeddings": False})).states
    embed = sum(g.params for g in LLAMA8B.others if g.name == "embed_tokens")
    head = max(lin.params for lin in LLAMA8B.linears if lin.group == "head")
    assert states.trainable_params - base.trainable_params == embed + head
    assert states.weights - base.weights == 2 * (embed + head)


def test_int8_base_is_one_byte_plus_a_row_scale() -> None:
    mem = _mem(TrainingSetup(method="lora", base="int8", kbit_prepare=False))
    expected = sum(
        lin.params * (1 + 4 / lin.in_features) for lin in LLAMA8B.linears if lin.group != "head"
    )
    expected += (LLAMA8B.params_total - LLAMA8B.params_linear) * 2
    assert _c(mem, "weights") == pytest.approx(expected)


# --- allocated vs reserved --------------------------------------------------------------------


def test_segment_rounding_follows_the_caching_allocator() -> None:
    mib = 2**20
    assert segment_waste(32 * mib) == 0  # own segment, already a 2 MiB multiple
    assert segment_waste(33 * mib) == mib  # rounded up to 34 MiB
    assert segment_waste(8 * mib) == 2 * mib  # two per 20 MiB segment, 4 MiB left
    assert segment_waste(1000) == 24  # 512-byte blocks


def test_reserved_is_allocated_plus_slack_and_the_verdict_uses_it() -> None:
    for stack in ("probe", "hf", "unsloth"):
        mem = _mem(TrainingSetup(stack=stack, method="full", precision="bf16"))
        assert float(mem.reserved[0]) >= float(mem.allocated[0])
        assert float(mem.peak[0]) == pytest.approx(float(mem.reserved[0]) + _c(mem, "overhead"))
    probe = _mem(TrainingSetup(stack="probe", method="full"))
    assert float(probe.reserved[0]) == float(probe.allocated[0])
    hf = _mem(TrainingSetup(method="full", precision="mixed"))
    assert float(hf.reserved[0]) > float(hf.allocated[0])  # 32-bit masters of 58.7 MiB, etc.
    seed = memory_breakdown(
        LLAMA8B, TrainingSetup(method="full"), [4096], 1, load_profile("seed-000")
    )
    assert float(seed.reserved[0]) == float(seed.allocated[0])


def test_estimate_rows_report_allocated_and_reserved() -> None:
    from estimator.document import estimate_document
    from estimator.request import EstimateRequest

    doc = estimate_document(
        EstimateRequest.model_validate(
            {"model": {"preset": "llama-3.1-8b"}, "setup": {"method": "full"}, "gpus": ["h200"]}
        )
    )
    row = doc["rows"][0]
    assert row["allocated_bytes"] <= row["reserved_bytes"] <= row["peak_bytes"]
    assert doc["setup"]["stack"] == "hf" and doc["setup"]["optimizer_impl"] == "fused"
    fit = row["fit"]["h200"]
    assert fit["peak_bytes"] == row["peak_bytes"]


def test_acceptance_unsloth_offload_reaches_further_than_hf() -> None:
    from estimator.solvers import Budget, max_seq
    from gpu_catalog import get_gpu

    gpu = get_gpu("h100-80gb")
    budget = Budget(gpu.capacity_bytes, 0.92)
    common = {"method": "qlora", "lora_rank": 16, "lora_targets": ["all-linear"]}
    unsloth = TrainingSetup(stack="unsloth", checkpointing="offload", **common)
    hf = TrainingSetup(stack="hf", checkpointing="gpu", **common)
    reach_u = max_seq(LLAMA8B, unsloth, budget, DEFAULT, 256, 1)["seq_len"]
    reach_h = max_seq(LLAMA8B, hf, budget, DEFAULT, 256, 1)["seq_len"]
    assert reach_u > 2 * reach_h > 0


def test_arrays_broadcast_for_every_stack() -> None:
    for stack in STACKS:
        mem = memory_breakdown(
            LLAMA8B, TrainingSetup(stack=stack, method="lora"), np.array([1024, 8192]), 2, DEFAULT
        )
        assert mem.peak.shape == (2,) and mem.peak[1] > mem.peak[0]


def test_compiled_layers_keep_what_inductors_partitioner_keeps() -> None:
    """torch.compile (activations_compiled): no fp32 norm / rotary copies and no silu output
    are kept, so a compiled layer saves less than the eager one, full and LoRA alike; the
    full-FT layer keeps 4h + 3q + 2kv + 3m compute-dtype values per token, torchtune's k and v
    at the query heads (bench/results/tune_compiled_saved_2026-12-04.txt): 4h + 5q + 3m."""
    for method in ("full", "lora"):
        eager = TrainingSetup(stack="torchtune", method=method, checkpointing="none")
        compiled = TrainingSetup(
            stack="torchtune", method=method, checkpointing="none", compile=True
        )
        assert _c(_mem(compiled), "checkpoints") < _c(_mem(eager), "checkpoints"), method
    full = TrainingSetup(stack="torchtune", method="full", checkpointing="none", compile=True)
    h, q, kv, m = 4096, 4096, 1024, 14336
    per_token = 2 * (4 * h + 3 * q + 2 * q + 3 * m) + 4 * (2 + 32)  # k, v expanded to q
    assert kv < q
    assert _c(_mem(full), "checkpoints") == pytest.approx(per_token * 4096 * 32, rel=1e-9)


def test_compiled_chunked_loss_keeps_bf16_logits_not_fp32_log_softmax() -> None:
    """torchtune compiles the chunk's cross-entropy: inductor keeps the chunk's bf16 logits and
    two floats per row instead of the fp32 log-softmax (bench/compile_saved.py --loss);
    torchtitan at 9dec370 kept its loss eager under compile (train.py:136-138), torchtitan main
    compiles it (components/loss.py:245-252): the held bf16 logits and their bf16 gradient."""
    lora = {"method": "lora", "checkpointing": "gpu"}
    eager = _c(_mem(TrainingSetup(stack="torchtune", **lora)), "logits")
    compiled = _c(_mem(TrainingSetup(stack="torchtune", compile=True, **lora)), "logits")
    tokens, vocab, h = 4096, 128256, 4096
    chunk = tokens / 8
    assert compiled == pytest.approx(
        (tokens + chunk) * vocab * 2 + tokens * 8 + tokens * h * 2 + tokens * (4 * h + 4),
        rel=1e-9,
    )
    assert compiled < eager
    titan = {"stack": "torchtitan-2024", "checkpointing": "gpu", "loss": "full"}
    assert _c(_mem(TrainingSetup(compile=True, **titan)), "logits") == _c(
        _mem(TrainingSetup(**titan)), "logits"
    )
    # the last norm (torch.nn.RMSNorm, outside the compiled blocks) keeps its bf16 input and
    # an fp32 rstd on CUDA (estimator/memory/torchtitan.py torch_rms_norm), the head its input
    main = {"stack": "torchtitan", "checkpointing": "gpu", "loss": "full", "compile": True}
    assert _c(_mem(TrainingSetup(**main)), "logits") == pytest.approx(
        tokens * vocab * 2 * 2 + tokens * 8 + tokens * (2 * h + 4 + 2 * h), rel=1e-9
    )


def test_chunked_losses_keep_the_heads_weight_gradient_with_the_chunks() -> None:
    """Full fine-tuning: the output projection's gradient is made at the first chunk's backward
    while the other chunks' saved tensors are alive (Liger allocates it in the forward);
    adapters and the full loss add none. torchtune 0.6.1's eager loss holds every chunk's bf16
    logits in its forward, before any gradient; its backward runs every chunk's cross-entropy
    backward first, then the chunks' head matmul backwards (recorded earlier, in the model's
    forward): the head's gradient buffer and the next chunk's contribution (two head
    gradients, the second a temporary: activations) with the other chunks' bf16 logit
    gradients. The largest of the three moments counts."""
    full = TrainingSetup(stack="torchtune", method="full", optimizer_impl="fused")
    lora = TrainingSetup(stack="torchtune", method="lora")
    vocab, h = 128256, 4096
    head = vocab * h * 2
    norm_and_head_input = 4096 * h * (4 + 2)  # the trained last norm's fp32 normed + head input
    for tokens in (1024, 4096):
        chunk = tokens // 8
        forward = tokens * vocab * (2 + 4) + chunk * vocab * 4
        ce = tokens * vocab * 4 + chunk * vocab * 2 * 4 + tokens * h * 2
        matmul = (tokens - chunk) * vocab * 2 + tokens * h * 2 + 2 * head
        full_mem, lora_mem = _mem(full, seq=tokens), _mem(lora, seq=tokens)
        without = max(forward, ce, matmul - 2 * head)
        added = max(forward, ce, matmul) - without
        assert full_mem.logits_other["gradients"][0] == pytest.approx(min(added, head))
        # the activations' own most in the loss's backward (whichever moment sets the loss's
        # peak): the chunks' hidden-state gradients, with a trained head the second temporary
        lora_other = lora_mem.logits_other["activations"][0]
        full_other = full_mem.logits_other["activations"][0]
        assert full_other - lora_other == pytest.approx(
            norm_and_head_input * tokens / 4096 + head, rel=1e-9
        )
        assert full_other >= norm_and_head_input * tokens / 4096 + tokens * h * 2 + head
        assert _c(full_mem, "logits") - _c(lora_mem, "logits") == pytest.approx(
            added + norm_and_head_input * tokens / 4096, rel=1e-9
        )
        if tokens == 1024:  # the matmul phase decides: one gradient and one temporary
            assert matmul > forward > ce and added - head > 0
        else:  # the forward decides: no gradient alive at the loss's most
            assert forward > matmul and added == 0
    # torchtitan's last norm is torch.nn.RMSNorm: its bf16 input and fp32 rstd on CUDA
    # (estimator/memory/torchtitan.py torch_rms_norm); the head's bf16 input
    titan = TrainingSetup(stack="torchtitan", method="full", loss="full", checkpointing="gpu")
    assert _c(_mem(titan), "logits") == pytest.approx(
        4096 * 128256 * 12 + 4096 * (2 * 4096 + 4 + 2 * 4096), rel=1e-9
    )


def test_eager_full_loss_leaves_the_logits_hole_reserved() -> None:
    """memory/fragmentation.py (1): the backward's second fp32 tensor cannot use the hole the
    bf16 logits left, so reserved exceeds the loss phase's allocated by the logits' bytes; a
    compiled loss (torchtitan main compiles it) makes no fp32 copy and leaves none."""
    eager = TrainingSetup(stack="torchtitan-2024", method="full", checkpointing="gpu")
    mem = _mem(eager, seq=8192)
    loss_phase = float(sum(mem.phases["loss"].values())[0])
    logits_bf16 = 8192 * 128256 * 2
    assert float(mem.reserved[0]) >= loss_phase + logits_bf16
    compiled = TrainingSetup(stack="torchtitan", method="full", checkpointing="gpu", compile=True)
    assert float(_mem(compiled, seq=8192).loss_hole[0]) == 0.0
    assert float(_mem(eager.model_copy(update={"stack": "probe"}), seq=8192).loss_hole[0]) == 0


def test_fsdp_all_gather_buffers_stay_reserved_on_their_stream() -> None:
    """memory/fragmentation.py (2): FSDP2's flat all-gather buffers live in the copy-in
    stream's pool, so reserved grows by the root unit's buffer plus a layer's over one device's
    alone; the probe stack (the estimator before stacks) counts none."""
    setup = dict(method="full", checkpointing="gpu", loss="full", sharding="fsdp", num_gpus=8)
    one = _mem(TrainingSetup(stack="torchtitan-2024", **setup), seq=2048)
    root = 2 * 128256 * 4096 * 2
    layer = (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336) * 2
    slack_free = float(one.reserved[0]) - float(one.allocated[0])
    assert slack_free >= root + layer
    probe = _mem(TrainingSetup(stack="probe", **setup), seq=2048)
    assert float(probe.reserved[0]) - float(probe.allocated[0]) < root


def test_fsdp_sharded_gradients_stay_reserved_on_the_reduce_scatter_stream() -> None:
    """memory/fragmentation.py (5): FSDP2's sharded gradients are views of reduce-scatter
    outputs allocated on that stream; freed by zero_grad they stay cached there, so at the loss
    they reserve what gradients kept over micro-batches (grad_accum 2) allocate."""
    setup = TrainingSetup(
        stack="torchtitan-2024", method="full", precision="mixed", sharding="fsdp", num_gpus=8
    )
    one, two = _mem(setup, 8192, 2), _mem(setup.model_copy(update={"grad_accum": 2}), 8192, 2)
    grads = LLAMA8B.params_total * 4 / 8  # fp32 sharded gradients
    kept_grads = float(two.allocated[0]) - float(one.allocated[0])
    assert kept_grads == pytest.approx(grads, rel=1e-3)
    assert float(one.reserved[0]) == pytest.approx(float(two.reserved[0]))
    probe = _mem(setup.model_copy(update={"stack": "probe"}), 8192, 2)
    assert float(probe.reserved[0]) - float(probe.allocated[0]) < grads


def test_bitsandbytes_8bit_adam_stepped_in_backward_makes_no_temporary() -> None:
    """bitsandbytes' 8-bit update is one in-place kernel (optimizer.py:535-590 update_step),
    also when torchtune steps each parameter from its gradient hook: the step phase holds no
    optimizer temporary, where torch's AdamW stepped in backward makes its sqrt buffer."""
    setup = TrainingSetup(
        method="full", precision="bf16", optimizer="adamw-8bit", optimizer_impl="in-backward"
    )
    assert _mem(setup).states.step_transient == 0.0
    adamw = _mem(setup.model_copy(update={"optimizer": "adamw"}))
    assert adamw.states.step_transient > 0.0


def test_last_norm_and_head_input_live_through_the_loss() -> None:
    """The model's last RMSNorm runs after every checkpointed layer (torchtitan@9dec370
    models/norms.py:96-101, transformers LlamaRMSNorm): its fp32 input and rsqrt, the normalised
    bf16 tensor kept by the weight's mul and the head's input stay until the loss's backward;
    frozen (LoRA) norm and head keep only the fp32 input and rsqrt."""
    setup = TrainingSetup(
        stack="torchtitan-2024", method="full", precision="bf16", checkpointing="selective"
    )
    h, vocab, tokens = LLAMA8B.hidden, LLAMA8B.vocab, 4096
    full = _c(_mem(setup), "logits")
    assert full == pytest.approx(tokens * vocab * 12 + tokens * (4 * h + 4 + 2 * h + 2 * h))
    lora = _c(_mem(setup.model_copy(update={"method": "lora"})), "logits")
    assert lora == pytest.approx(tokens * vocab * 12 + tokens * (4 * h + 4))
    ctx = Context.build(LLAMA8B, setup, 2)  # Liger makes the hidden gradient in the forward
    assert head_input_saved(ctx, LLAMA8B, "liger") == 4 * h + 4 + 2 * h


def test_hf_mixed_full_fine_tuning_is_amp_fp32_weights_and_no_masters() -> None:
    """HF Trainer's bf16=True is torch AMP (accelerate wraps model.forward in autocast): the
    fp32 weights are trained as they are, so 4 (weights) + 4 (gradients) + 8 (AdamW) bytes per
    parameter and no master copy; the probe loop's `mixed` keeps bf16 weights + fp32 masters."""
    assert load_stack("hf").get("mixed_precision") == "amp"
    assert load_stack("probe").get("mixed_precision") == "masters"
    n = LLAMA8B.params_total
    amp = _mem(TrainingSetup(method="full", precision="mixed"))
    masters = _mem(TrainingSetup(stack="probe", method="full", precision="mixed"))
    assert _c(amp, "weights") == pytest.approx(4 * n, rel=0.01)
    assert _c(masters, "weights") == pytest.approx(2 * n, rel=0.01)
    assert amp.states.masters == 0 and masters.states.masters == 4 * n
    assert amp.states.grads == 4 * n and masters.states.grads == 2 * n
    assert amp.states.optimizer == 8 * n + 512 * 291  # + fused AdamW's 291 step tensors
    assert amp.states.step_transient == 0  # fused AdamW steps the fp32 weights in place
    # the layer input kept by each checkpoint is fp32: the residual stream stays fp32
    per_layer = 4096 * LLAMA8B.hidden
    rope = 2 * 4096 * 128  # cos and sin of the fp32 hidden states' dtype (rope_table_bytes)
    assert _c(amp, "checkpoints") == 4 * (per_layer * LLAMA8B.layers + rope)
    # with autocast off, `mixed` is not AMP
    plain = _mem(TrainingSetup(method="full", precision="mixed", autocast=False))
    assert _c(plain, "weights") == pytest.approx(2 * n, rel=0.01)


def test_amp_keeps_autocasts_bf16_weight_copies_through_the_forward() -> None:
    """torch's cached_cast keeps a bf16 copy of every fp32 weight that requires grad until the
    autocast region (accelerate: model.forward, which computes the full loss) exits; each
    Linear saves its copy for the backward."""
    setup = TrainingSetup(method="full", precision="mixed", loss="full")
    body = sum(lin.params for lin in LLAMA8B.linears if lin.group != "head")
    ctx = Context.build(LLAMA8B, setup, 2)
    assert ctx.weight_casts == pytest.approx(2 * body / LLAMA8B.layers, rel=0.01)
    assert Context.build(LLAMA8B, setup.model_copy(update={"stack": "probe"}), 2).weight_casts == 0
    # the loss moment: forward logits (2 + 4 + 4 bytes) + every copy + the last norm's fp32
    # output (the CausalLM forward's `hidden_states`), against the backward's 12 bytes per
    # logit + the head's copy
    tokens, vocab, h = 4096, LLAMA8B.vocab, LLAMA8B.hidden
    mem = _mem(setup)
    amp = _c(mem, "logits")
    bf16_mem = _mem(setup.model_copy(update={"precision": "bf16"}))
    bf16 = _c(bf16_mem, "logits")
    forward = tokens * vocab * 10 + 2 * body + 2 * h * vocab + 4 * tokens * h
    backward = tokens * vocab * 12 + 2 * h * vocab
    # and the last norm's saved normalised tensor, fp32 under AMP's fp32 stream (bf16 without:
    # tests/estimator/test_last_norm_saved.py)
    normed = 2 * tokens * h
    assert amp - bf16 == pytest.approx(
        max(forward, backward) - tokens * vocab * 12 + normed, rel=1e-6
    )
    # what the probe counts as activations: the copies and that output, at the forward moment
    extra = float(mem.logits_other["activations"][0]) - float(
        bf16_mem.logits_other["activations"][0]
    )
    assert extra == pytest.approx(2 * body + 2 * h * vocab + 4 * tokens * h + normed, rel=1e-6)


def test_torchtune_rope_cache_buffers_count_in_weights_on_every_rank() -> None:
    """torchtune's one RoPE module per model registers fp32 `theta` (head_dim/2) and `cache`
    (max_seq_len x head_dim/2 x cos, sin) on the device (v0.6.1
    models/llama3_1/_position_embeddings.py:62-101), max_seq_len = the config's 131072:
    64 MiB for Llama 3.1 8B, 32 MiB for a head_dim-64 model (Llama 3.2 1B); FSDP does not
    shard buffers. transformers' rotary embedding keeps no such cache."""
    lora = {"method": "lora", "optimizer_impl": "foreach"}
    tt = _c(_mem(TrainingSetup(stack="torchtune", **lora)), "weights")
    hf = _c(_mem(TrainingSetup(stack="hf", **lora)), "weights")
    assert tt - hf == 131072 * 64 * 2 * 4 + 512 == 64 * 2**20 + 512
    config = preset_config("llama-3.1-8b")
    config.update(hidden_size=2048, num_attention_heads=32, num_key_value_heads=8)
    small = spec_from_config(config)
    assert small.head_dim == 64 and small.max_positions == 131072
    tt1 = _c(_mem(TrainingSetup(stack="torchtune", **lora), spec=small), "weights")
    hf1 = _c(_mem(TrainingSetup(stack="hf", **lora), spec=small), "weights")
    assert tt1 - hf1 == 32 * 2**20 + 512
    fsdp = {"method": "full", "precision": "bf16", "sharding": "fsdp", "num_gpus": 8}
    tt8 = _c(_mem(TrainingSetup(stack="torchtune", **fsdp), devices=8), "weights")
    hf8 = _c(_mem(TrainingSetup(stack="hf", **fsdp), devices=8), "weights")
    assert tt8 - hf8 == 64 * 2**20 + 512


def test_fused_adamw_keeps_a_step_tensor_per_parameter_on_the_device() -> None:
    """torch.optim.AdamW(fused=True) creates each parameter's `step` as a 0-dim fp32 tensor on
    the parameter's device (torch 2.13 torch/optim/adam.py:168-176), foreach keeps it on the
    CPU: one 512-byte block per trained tensor. Llama 3.1 8B has 291 parameter tensors
    (224 decoder Linears, lm_head, embed_tokens, 65 RMSNorms); LoRA all-linear, 448 adapters."""
    from estimator.memory.states import trainable_state_bytes

    for method, extra, tensors in (
        ("full", {"precision": "bf16"}, 291),
        ("lora", {"lora_targets": ["all-linear"]}, 2 * 7 * 32),
    ):
        fused = trainable_state_bytes(
            LLAMA8B, TrainingSetup(method=method, optimizer_impl="fused", **extra)
        )
        foreach = trainable_state_bytes(
            LLAMA8B, TrainingSetup(method=method, optimizer_impl="foreach", **extra)
        )
        assert fused.optimizer - foreach.optimizer == 512 * tensors
    eight = {"method": "lora", "optimizer": "adamw-8bit"}  # bitsandbytes: a Python int step
    assert (
        trainable_state_bytes(LLAMA8B, TrainingSetup(optimizer_impl="fused", **eight)).optimizer
        == trainable_state_bytes(
            LLAMA8B, TrainingSetup(optimizer_impl="foreach", **eight)
        ).optimizer
    )


def test_amp_casts_the_fp32_norm_output_once_per_separate_linear() -> None:
    """Under AMP full fine-tuning each separate Linear reading the fp32 norm output saves its
    own bf16 cast (autocast caches weights only): llama's q, k, v and gate, up are 3 + 2
    copies where one per group is counted by `inputs_saved`; phi3's fused qkv_proj and
    gate_up_proj are one each. The residual-stream norms save their normalised tensor in fp32."""
    from estimator.memory.activations import amp_input_casts, rms_norm_saved

    amp = TrainingSetup(method="full", precision="mixed")
    h = LLAMA8B.hidden
    qkv = ["q_proj", "k_proj", "v_proj", "qkv_proj"]
    mlp = ["gate_proj", "up_proj", "gate_up_proj", "c_fc"]
    ctx = Context.build(LLAMA8B, amp, 2)  # bf16 compute; the fp32 stream is `input_bytes`
    assert amp_input_casts(ctx, LLAMA8B, qkv, h) == 2 * 2 * h
    assert amp_input_casts(ctx, LLAMA8B, mlp, h) == 2 * h
    assert rms_norm_saved(ctx, h, stream=True) - rms_norm_saved(ctx, h) == 2 * h
    phi3 = spec_from_config({**preset_config("llama-3.1-8b"), "model_type": "phi3"})
    assert {"qkv_proj", "gate_up_proj"} <= set(phi3.linear_names)
    fused = Context.build(phi3, amp, 2)
    assert amp_input_casts(fused, phi3, qkv, h) == amp_input_casts(fused, phi3, mlp, h) == 0
    plain = Context.build(LLAMA8B, TrainingSetup(method="full", precision="bf16"), 2)
    assert amp_input_casts(plain, LLAMA8B, qkv, h) == 0
    assert rms_norm_saved(plain, h, stream=True) == rms_norm_saved(plain, h)


def test_unsloth_o_proj_input_is_the_attention_kernels_saved_output() -> None:
    """unsloth 015bdef0d9 utils/attention_dispatch.py (SDPA branch, enable_gqa) returns
    `out.transpose(1, 2)` and models/llama.py:766-767 reshapes it for o_proj: with torch's
    flash kernel (the CPU one here) that is a view of the output autograd saved, so
    `_fused_layer` counts it once."""
    torch = pytest.importorskip("torch")
    b, s, heads, kv_heads, d = 1, 64, 8, 2, 16
    x = torch.randn(b, s, heads * d, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(b, s, kv_heads * d, dtype=torch.bfloat16, requires_grad=True)
    q = x.view(b, s, heads, d).transpose(1, 2)
    k = kv.view(b, s, kv_heads, d).transpose(1, 2)
    v = (kv * 2).view(b, s, kv_heads, d).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    o_proj_input = out.transpose(1, 2).reshape(b, s, heads * d)
    saved = out.grad_fn._saved_output
    assert o_proj_input.data_ptr() == saved.data_ptr()
    assert o_proj_input.untyped_storage().data_ptr() == saved.untyped_storage().data_ptr()
    assert out.grad_fn._saved_key.shape[1] == kv_heads  # GQA native: k, v not repeated
    eager = TrainingSetup(stack="unsloth", method="qlora", lora_targets=["all-linear"])
    ctx = Context.build(LLAMA8B, eager.model_copy(update={"attention": "eager"}), 2)
    sdpa = Context.build(LLAMA8B, eager, 2)
    with_copy = layer_activations(ctx, LLAMA8B, LAYER_FULL, MLP_DENSE).per_token
    assert with_copy - layer_activations(sdpa, LLAMA8B, LAYER_FULL, MLP_DENSE).per_token == 2 * 4096


def test_unsloth_xformers_saves_k_and_v_expanded_to_the_query_heads() -> None:
    """unsloth 015bdef0d9 utils/attention_dispatch.py `run_attention`, XFORMERS branch: with
    grouped-query heads and gradients, `K_mod.expand(...).reshape(bsz, kv_seq_len, n_heads,
    head_dim)` (a copy) for k and v, which xformers saves; SDPA and flash keep them kv-wide."""

    def layer(spec, attention: str):
        s = TrainingSetup(
            stack="unsloth", method="qlora", lora_targets=["all-linear"], attention=attention
        )
        return layer_activations(Context.build(spec, s, 2), spec, LAYER_FULL, MLP_DENSE)

    sdpa, xf = layer(LLAMA8B, "sdpa"), layer(LLAMA8B, "xformers")
    assert xf.per_token - sdpa.per_token == 2 * 2 * (4096 - 1024)
    assert xf.transient_per_token == sdpa.transient_per_token
    assert layer(LLAMA8B, "flash").per_token == sdpa.per_token
    # a type Unsloth runs with transformers' modules (FastModel): SDPA there, no change
    gemma3 = json.loads((REF / "meta-llama_Llama-3.1-8B.json").read_text())
    gemma3.update(model_type="gemma3_text", head_dim=128)
    other = spec_from_config(gemma3)
    assert layer(other, "xformers").per_token == layer(other, "sdpa").per_token


def test_unsloth_offload_holds_the_recomputed_layer_output_through_its_backward() -> None:
    """unsloth_zoo ce232d6c gradient_checkpointing.py:990-1013: UnslothCheckpointFunction keeps
    `outputs` referenced through `torch.autograd.backward`; transformers' non-reentrant
    checkpoint (`gpu`) does not."""
    setup = TrainingSetup(stack="unsloth", method="qlora", lora_targets=["all-linear"])
    assert setup.checkpointing == "offload"
    h, m = LLAMA8B.hidden, LLAMA8B.intermediate
    offload = layer_activations(Context.build(LLAMA8B, setup, 2), LLAMA8B, LAYER_FULL, MLP_DENSE)
    assert offload.transient_per_token == 2 * 2 * h + 2 * 2 * m + 2 * h
    gpu_setup = setup.model_copy(update={"checkpointing": "gpu"})
    gpu = layer_activations(Context.build(LLAMA8B, gpu_setup, 2), LLAMA8B, LAYER_FULL, MLP_DENSE)
    assert gpu.transient_per_token == 2 * 2 * h + 2 * 2 * m
    # the same for a type Unsloth runs with transformers' modules, and not for other stacks
    qwen35 = spec_from_config(preset_config("qwen3.5-27b"))
    ctx = Context.build(qwen35, setup, 2)
    assert not ctx.fused and ctx.held_output == 2
    hf_offload = TrainingSetup(method="qlora", lora_targets=["all-linear"], checkpointing="offload")
    assert Context.build(LLAMA8B, hf_offload, 2).held_output == 0
    offload_peak = _c(_mem(setup, seq=65536), "recompute_peak")
    assert offload_peak - _c(_mem(gpu_setup, seq=65536), "recompute_peak") == 65536 * 2 * h
