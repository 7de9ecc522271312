"""Saved activations per token of one decoder layer, as autograd keeps them for the backward.

The tensors are those the transformers v5 modeling code creates (RMSNorm upcasts its input to
fp32; frozen weights save no inputs; peft's LoRA casts each adapted Linear's input to the
adapter dtype, a separate copy per adapter when the dtypes differ), with SDPA/flash attention
(q, k, v, out and an fp32 logsumexp; no s x s matrix; GQA native, no repeated k/v,
unless the stack repeats them: `sdpa_repeats_kv`, `torchtune_modules`) or eager
attention (fp32 softmax output and its bf16 copy, s per head per token). The Gated DeltaNet
core is modelled as fla's `chunk_gated_delta_rule` (saves q, k repeated to the value heads, v,
g, beta and the chunk matrix A of width 64). Method after Korthikanti et al. 2022 (Table 2):
every term names the tensor it stores. Units: bytes per token (eager: plus s-proportional
terms). Verified against real CPU steps by bench/accuracy.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from estimator.dtypes import BF16, FP32, compute_bytes
from estimator.lora import expert_adapter_tensors, expert_banks, lora_targets
from estimator.memory import liger
from estimator.memory.activations_compiled import adapted_count, compiled_layer_saved
from estimator.memory.logits import trl_vocab_tile
from estimator.memory.torchtitan import (
    norm_input_reused,
    norm_saved_per_row,
    selective_saved_fused_qkv,
    torch_rms_norm,
)
from estimator.memory.weights import amp_full, kbit_fp32
from estimator.spec import LAYER_LINEAR, MLP_MOE, ModelSpec
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

GDN_CHUNK = 64  # fla chunk size for chunk_gated_delta_rule


# Unsloth patches a layer's MLP with LoRA_MLP only when gate, up and down all carry adapters, and
# its attention with LoRA_QKV / LoRA_W only when q, k, v (and o) do, with lora_dropout 0 and no
# bias (unsloth 015bdef0d9 models/llama.py:3695-3768); its default targets are these seven
# (get_peft_model). A setup adapting fewer takes the eager terms (an overestimate where part of
# the layer is patched).
UNSLOTH_PATCHED_TARGETS = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
)


@dataclass(frozen=True)
class Context:
    """What decides whether a tensor is saved: dtypes, what is trainable, which Linears adapt.

    `compute_bytes` is the dtype of the residual stream and the MLP's elementwise tensors
    (fp32 after peft's prepare_model_for_kbit_training, see `stream_bytes`); `attn_bytes` that
    of the tensors SDPA saves (bf16 under autocast, which casts SDPA's inputs). An adapted
    Linear's input is saved once, `adapter_shared` bytes per element, when every adapter can
    use the same tensor, else `adapter_each` per adapter; `rank_bytes` is lora_A's output kept
    for lora_B; `mask_bytes` the dropout mask per adapter."""

    compute_bytes: int
    full: bool  # base weights trainable
    adapter_bytes: int
    targets: frozenset[str]
    rank: int
    eager: bool
    expert_lora: bool = False  # expert banks adapted (peft ParamWrapper, `all-linear` on MoE)
    attn_bytes: int = 0
    adapter_shared: int = 0
    adapter_each: int = 0
    rank_bytes: int = 0
    mask_bytes: int = 0
    fused: bool = False  # Unsloth's fused RMSNorm / LoRA QKV / LoRA MLP kernels (its own models)
    compiled: bool = False  # torch.compile of each decoder layer (activations_compiled)
    adapter_transient: int = 0  # bytes per element of an adapted input's unsaved copies
    weight_casts: float = 0.0  # bytes per layer of autocast's bf16 copies of fp32 trained weights
    autocast: bool = False
    input_bytes: int = 0  # bytes per element of a decoder layer's input (the checkpoint)
    torch_norm: bool = False  # torchtitan 0.3.0's modules: nn.RMSNorm, fused wqkv (torchtitan.py)
    torchtune: bool = False  # torchtune's attention and RMSNorm (`torchtune_modules`)
    repeats_kv: bool = False  # K/V repeated to the query heads before SDPA (`sdpa_repeats_kv`)
    liger: bool = False  # Liger's RMSNorm / SwiGLU / RoPE kernels (memory/liger.py)
    xformers: bool = False  # Unsloth's xformers backend: k, v expanded to the query heads
    held_output: int = 0  # bytes per element of the recomputed layer output its backward holds
    # quantized expert banks that a parametrization dequantizes per forward (`quantize_experts`
    # on a stack with `experts_dequant`): each MoE layer saves its dequantized banks, this many
    # bytes per element (bf16 from NF4, fp32 from int8: `dequantized_bank_bytes`); 0 if none
    dequantized_banks: int = 0
    # transformers' RMSNorm multiplies the weight into the fp32 normalised tensor
    # (`FP32_PRODUCT_NORMS`): a trained weight's mul saves that fp32 tensor
    norm_product_fp32: bool = False
    # lora_A + lora_B values of one MoE layer's adapted expert banks (estimator.lora
    # `expert_adapter_tensors`; `_merged_expert_weights`)
    expert_factors: float = 0.0
    # the layer's forward runs again inside the backward (any checkpointing): its forward
    # moments then coexist with the backward's gradients (`_forward_transient`)
    recomputed: bool = True

    @classmethod
    def build(cls, spec: ModelSpec, setup: TrainingSetup, compute_bytes: int) -> Context:
        targets = (
            frozenset(t.name for t in lora_targets(spec, setup))
            if setup.is_adapter
            else frozenset()
        )
        stack = load_stack(setup.stack)
        adapter = FP32 if setup.adapter_dtype == "fp32" or setup.precision == "fp32" else BF16
        stream = stream_bytes(setup, compute_bytes)
        autocast = bool(setup.autocast) and setup.precision != "fp32"
        shared, each, rank_bytes, mask = _adapter_inputs(setup, stream, adapter, autocast)
        casts = autocast_layer_casts(spec) if amp_full(setup) else 0.0
        if autocast and adapter == FP32 and targets and spec.layers:
            casts = (
                sum(
                    BF16 * setup.lora_rank * (t.in_features + t.out_features) * t.count
                    for t in lora_targets(spec, setup)
                )
                / spec.layers
            )
        eager = setup.attention == "eager" or (
            setup.attention in ("sdpa", "xformers")
            and (spec.requires_eager or spec.model_type in stack.get("eager_models"))
        )
        expert_lora = setup.is_adapter and bool(expert_banks(spec, setup))
        return cls(
            stream,
            not setup.is_adapter,
            adapter,
            targets,
            setup.lora_rank,
            eager,
            expert_lora,
            BF16 if autocast else stream,
            shared,
            each,
            rank_bytes,
            mask,
            spec.model_type in (stack.get("fused_kernels") or ())
            and targets >= UNSLOTH_PATCHED_TARGETS
            and not setup.lora_dropout,
            bool(setup.compile),
            _adapter_transient(setup, stream, adapter, autocast),
            casts,
            autocast,
            FP32 if amp_full(setup) else stream,
            torch_rms_norm(setup),
            bool(stack.get_optional("torchtune_modules", False)),
            bool(stack.get_optional("sdpa_repeats_kv", False)),
            liger.liger_applies(spec, setup.liger_kernels),
            setup.attention == "xformers",
            _held_output(setup, FP32 if amp_full(setup) else stream),
            dequantized_bank_bytes(setup, stack.get_optional("experts_dequant", None)),
            _norm_product_fp32(spec, setup) and not stack.get_optional("torchtune_modules", False),
            _expert_factors(spec, setup) if expert_lora else 0.0,
            setup.checkpointing != "none",
        )


def _expert_factors(spec: ModelSpec, setup: TrainingSetup) -> float:
    """lora_A + lora_B values of one MoE layer's adapted expert banks (`Context`)."""
    return float(sum(a + b for a, b, _ in expert_adapter_tensors(spec, setup)))


def dequantized_bank_bytes(setup: TrainingSetup, experts_dequant: str | None) -> int:
    """Bytes per element of a quantized expert bank as its parametrization dequantizes it
    (stack fact `experts_dequant`), 0 where the banks are not quantized that way. NF4:
    bitsandbytes 0.50.2 nn/parametrize.py:28-39, `F.dequantize_4bit` to the dtype the bank was
    quantized from (bf16 as loaded). int8 (axolotl's `quantize_moe_experts` under
    `load_in_8bit`): axolotl 067b021c monkeypatch/moe_quant.py:24-38, Bnb8bitParametrization
    returns bitsandbytes' `int8_vectorwise_dequant`, fp32 (bitsandbytes 0.50.2
    functional.py:1641-1652)."""
    if not setup.quantize_experts or experts_dequant != "bnb_parametrize":
        return 0
    return {"nf4": BF16, "int8": FP32}.get(setup.base or "", 0)


def _held_output(setup: TrainingSetup, stream: int) -> int:
    """Bytes per element of the layer output the stack's checkpoint function keeps through the
    layer's backward (stack fact `offload_holds_output`: Unsloth's reentrant
    UnslothCheckpointFunction under its offloaded checkpointing); 0 elsewhere."""
    holds = load_stack(setup.stack).get_optional("offload_holds_output", False)
    return stream if holds and setup.checkpointing == "offload" else 0


def torchtune_modules(ctx: Context) -> str:
    """What the stack fact `torchtune_modules` changes (torchtune 0.6.1's modules; "" when
    off, else a description):
    1. MultiHeadAttention expands k and v to `num_heads` before SDPA (modules/attention.py:
       285-291, `k.unsqueeze(2).expand(...).flatten(1, 2)`: a copy), which saves them at that
       width (`_attention_core`).
    2. Its output is `output.transpose(1, 2).contiguous().view(b, s_x, -1)` (:303), a view of
       SDPA's saved output (see `sdpa_output_reused`), and a LoRA output projection whose
       adapters share their input (LoRALinear `lora_a(self.dropout(x))`, nn.Identity at
       dropout 0, modules/peft/lora.py:137) saves that very tensor.
    3. RMSNorm is `F.rms_norm(x.float(), weight=self.scale)` (modules/rms_norm.py), whose bf16
       scale differs from the fp32 input's dtype, so torch takes the composite (aten/src/ATen/
       native/layer_norm.cpp `rms_norm_symint` -> `rms_norm_composite` on a dtype mismatch; on
       the CPU always): `upcasted_input.mul(rsqrt)` then `.mul(weight)`, which saves the fp32
       normed tensor when the scale trains (`rms_norm_saved`). This form is in the 0.6.0 and
       0.6.1 releases only (pytorch/torchtune 1450d6126, 2024-11-25, to c5c160b42, 2025-03-26,
       on main): the 2024 README rows (1814feb17) and main bd2a0fc7c cast the normed to bf16
       before the scale, as transformers does (1 and 2 hold at all three).
    4. TransformerSelfAttentionLayer.forward keeps `attn_out` bound while the MLP runs
       (modules/transformer.py:122-128: `attn_out = self.attn(...)`, `h = attn_out + x`,
       `self.mlp(self.mlp_norm(h))`), where transformers' layer rebinds it
       (`_forward_transient`); the MLP input is held there only when nothing saved it."""
    return "torchtune 0.6.1 attention and RMSNorm" if ctx.torchtune else ""


def autocast_layer_casts(spec: ModelSpec) -> float:
    """Bytes per decoder layer of autocast's bf16 copies of the layer's fp32 Linear weights
    under AMP full fine-tuning (`amp_full`). torch's `cached_cast` (aten/src/ATen/autocast_mode.cpp:
    `can_try_cache` for an fp32 leaf that requires grad, not a view) makes one bf16 copy per
    weight, and `F.linear` saves that copy for the input's gradient, so the layer's copies live
    with its saved activations (in the backward's recompute under checkpointing). Expert banks
    (`experts` > 1) run by transformers' grouped_mm experts (`grouped_mm_experts`) are not
    cast: `_grouped_mm` is on none of autocast's lists (`expert_bytes`), so they multiply with
    the fp32 banks themselves."""
    if not spec.layers:
        return 0.0
    body = sum(
        lin.in_features * lin.out_features * lin.count
        for lin in spec.linears
        if lin.group != "head" and (lin.experts == 1 or not grouped_mm_experts(spec))
    )
    return float(BF16 * body / spec.layers)


def autocast_forward_casts(spec: ModelSpec, setup: TrainingSetup) -> float:
    """Bytes of autocast's cast cache at the end of the model's forward that the layers' saved
    activations do not already hold: the cache keeps every bf16 weight copy until the outermost
    autocast region exits (torch/amp/autocast_mode.py:346-349 clear_autocast_cache), and
    accelerate's region is `model.forward` (accelerate accelerator.py:1791-1801), which computes
    the loss when given labels. Under checkpointing the layers' copies are not saved, so the
    cache alone keeps them; the head's copy (the tied embedding's for tied models) always."""
    if not amp_full(setup) or not spec.hidden or not spec.vocab:
        return 0.0
    head = BF16 * spec.hidden * (spec.vocab or 0)
    layers = (
        autocast_layer_casts(spec) * (spec.layers or 0) if setup.checkpointing != "none" else 0.0
    )
    return head + layers


def frozen_head_cast(spec: ModelSpec, setup: TrainingSetup) -> float:
    """Bytes of the bf16 copy of a frozen fp32 LM head that autocast makes at the head's
    forward and the head's matmul keeps until its backward, i.e. through the loss moment. QLoRA
    after peft's prepare_model_for_kbit_training (`kbit_fp32`: lm_head, or the tied embedding,
    cast to fp32) under autocast: `linear` is on autocast's lower-precision list and the weight
    is cast on every call, uncached (torch aten/src/ATen/autocast_mode.cpp `cached_cast`:
    `can_try_cache` needs `arg.requires_grad()`, a frozen head has none); the matmul saves that
    copy for its input's gradient (tools/autograd/derivatives.yaml `mm`: `self:
    mm_mat1_backward(grad, mat2, ...)`). TRL 1.16.0's fused head never calls the Linear: it
    casts one tile at a time (`logits.trl_logprob_bytes`), so none here. A trained fp32 head
    (AMP full fine-tuning) is `autocast_forward_casts`'s."""
    if not (kbit_fp32(setup) and setup.autocast) or setup.loss not in ("full", "chunked"):
        return 0.0
    if trl_vocab_tile(setup):  # TRL 1.16.0's fused head casts one vocab tile at a time
        return 0.0
    return float(BF16 * (spec.hidden or 0) * (spec.vocab or 0))


def rope_table_bytes(spec: ModelSpec, setup: TrainingSetup, seq: Any) -> Any:
    """The rotary cos and sin tables the model's forward builds once (stack fact
    `rope_tables_per_forward`: transformers 5.24.0 models/llama/modeling_llama.py:110-116,
    called at :391): (1, seq, `rope_width`) each, position_ids being
    `arange(seq).unsqueeze(0)` (:379-380; a collator that passes position_ids makes them batch
    wide), in the dtype of the hidden states (`cos.to(dtype=x.dtype)`: fp32 under AMP full
    fine-tuning and kbit preparation, whose embeddings are fp32). Every decoder layer takes them
    as its `position_embeddings` input (:397), which a checkpointed layer keeps for its
    recompute and `q * cos` saves without checkpointing, so they live through the backward,
    like the mask (`mask_bytes`)."""
    if not spec.rope_width or not load_stack(setup.stack).get("rope_tables_per_forward"):
        return seq * 0.0
    dtype = FP32 if amp_full(setup) else stream_bytes(setup, compute_bytes(setup.precision))
    return 2 * seq * spec.rope_width * dtype


def stream_bytes(setup: TrainingSetup, compute_bytes: int) -> int:
    """Dtype of the residual stream: fp32 once peft's prepare_model_for_kbit_training has cast
    the embeddings and norms to fp32 (peft 0.22.0 utils/other.py:234-238) and bnb's Linear4bit
    returns its input's dtype (bitsandbytes 0.50.2 nn/modules.py:626-637)."""
    return FP32 if kbit_fp32(setup) else compute_bytes


def _adapter_inputs(
    setup: TrainingSetup, stream: int, adapter: int, autocast: bool
) -> tuple[int, int, int, int]:
    """(shared, each, rank, mask) bytes per element of what peft's LoRA forward
    `lora_B(lora_A(dropout(x)))` saves (peft 0.22.0 tuners/lora/layer.py:1201-1205; bnb layers
    tuners/lora/bnb.py:213-219).
    No autocast: x is cast to the adapter dtype (`_cast_input_dtype`), one copy per adapter
    unless the dtypes agree, then shared. Autocast: the bnb path skips the cast
    (bnb.py:216 `requires_conversion = not torch.is_autocast_enabled()`) and autocast runs
    lora_A in bf16: a bf16 stream is shared as is, an fp32 stream (kbit) gets a bf16 copy per
    adapter; the plain path casts to fp32 first, so autocast makes a bf16 copy per adapter.
    Dropout p > 0 (torch native_dropout, torch/_decomp/decompositions.py:1280-1290): a bool mask
    per adapter and its output is a new tensor per adapter, the one lora_A saves."""
    quantized = setup.base in ("nf4", "int8")
    dropout = bool(setup.lora_dropout)
    mask = 1 if dropout else 0
    if autocast:
        each = BF16
        if quantized and stream == BF16 and not dropout:
            return BF16, 0, BF16, 0
        return 0, each, BF16, mask
    if dropout:
        return 0, adapter, adapter, mask
    if adapter != stream:
        return 0, adapter, adapter, 0
    return stream, 0, adapter, 0


def _adapter_transient(setup: TrainingSetup, stream: int, adapter: int, autocast: bool) -> int:
    """Bytes per element of what peft's LoRA branch makes of its input and does not save, alive
    while the branch runs (peft 0.22.0 tuners/lora/layer.py:1201-1205: `x =
    self._cast_input_dtype(x, lora_A.weight.dtype)` stays bound until the loop ends;
    `lora_A(dropout(x))`): the cast copy (tuners_utils.py:2339-2341, only when the dtypes
    differ; the bnb layers skip it under autocast, bnb.py:216) unless lora_A saves it, and the
    dropout output unless lora_A saves it (under autocast lora_A saves its own bf16 cast of a
    non-bf16 input instead, see `_adapter_inputs`)."""
    if not setup.is_adapter:
        return 0
    dropout = bool(setup.lora_dropout)
    quantized = setup.base in ("nf4", "int8")
    if autocast:
        cast = 0 if quantized or adapter == stream else adapter
        dtype = cast or stream  # the dropout output's dtype
        return cast + (dtype if dropout and dtype != BF16 else 0)
    if adapter != stream and dropout:
        return adapter  # the cast copy; lora_A saves the dropout output
    return 0


# Model types whose transformers RMSNorm multiplies its weight into the fp32 normalised tensor
# and casts after: Gemma's `output * (1.0 + self.weight.float())` (transformers 5.25.0
# models/gemma/modeling_gemma.py:73-78, the same in gemma2 and gemma3), OLMo 2's
# `(self.weight * hidden_states).to(input_dtype)` (models/olmo2/modeling_olmo2.py Olmo2RMSNorm,
# the same in olmo3). With the weight trained the mul saves the fp32 normalised tensor, where
# Llama's `self.weight * hidden_states.to(input_dtype)` saves it in the input's dtype
# (`rms_norm_saved`). Fake traces of the hf stack's full fine-tuning of small Gemma 2 and OLMo 2
# models (tests/probe/test_activation_accuracy.py). qwen3_next / qwen3_5 use Gemma's norm
# (Qwen3_5RMSNorm) but are left out under checkpointing: their hybrid layer's most is in a
# moment after the post-attention norm's backward has freed its saved tensors, which
# `layer_activations` does not separate, and the saved-set figure already sits at their trace
# without this term (`HYBRID_GEMMA_NORMS`, `_norm_product_fp32`: counted without it).
FP32_PRODUCT_NORMS = frozenset({"gemma", "gemma2", "gemma3_text", "olmo2", "olmo3"})
# Gemma's norm in the hybrid models (Qwen3_5RMSNorm, Qwen3NextRMSNorm: transformers 5.25.0
# models/qwen3_5/modeling_qwen3_5.py:921-931 `output * (1.0 + self.weight.float())`)
HYBRID_GEMMA_NORMS = frozenset(
    {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"}
)


def _norm_product_fp32(spec: ModelSpec, setup: TrainingSetup) -> bool:
    """`Context.norm_product_fp32`: `FP32_PRODUCT_NORMS`, and the hybrid models' Gemma norm
    without checkpointing. Their saved fp32 normalised tensor is left out under checkpointing
    (the hybrid layer's most comes after the post-attention norm's backward freed it: see
    above); without checkpointing every layer's saved tensors are alive when the final norm's
    backward starts, so it counts (fake trace of small Qwen3.5's full bf16 fine-tuning: six
    fp32 `mul` outputs of the norms at :924 alive then)."""
    if spec.model_type in FP32_PRODUCT_NORMS:
        return True
    return spec.model_type in HYBRID_GEMMA_NORMS and setup.checkpointing == "none"


@dataclass(frozen=True)
class LayerActivations:
    """Bytes per token saved by one layer (`per_token`), plus eager attention's `per_token_seq`
    (multiply by tokens and by sequence length), and the backward transient per token."""

    per_token: float
    per_token_seq: float
    transient_per_token: float
    per_layer: float = 0.0  # independent of tokens (LoRA-merged expert weights)
    transient_per_layer: float = 0.0
    checkpoint_reused: float = 0.0  # of `per_token`: the layer's input itself (`input_reused`)
    # a second moment of the layer's backward, without `transient_per_layer` (MoE under LoRA on
    # the expert banks: the combine's temporaries before the merged weights' gradient)
    other_transient_per_token: float = 0.0
    # eager attention's softmax backward, a moment of its own (`eager_softmax_moment`): bytes
    # per token (negative: saved tensors already freed) and per token per sequence position
    softmax_transient_per_token: float = 0.0
    softmax_transient_per_token_seq: float = 0.0


def input_reused(ctx: Context, spec: ModelSpec) -> float:
    """Bytes per token of a layer's saved tensors that are the layer's input itself. Under
    checkpointing that input is the checkpoint, counted once already, so the recomputed layer
    does not hold it again. HF RMSNorm saves its input when it is fp32 already:
    `hidden_states.to(torch.float32)` returns the tensor itself (transformers 5.24.0
    models/llama/modeling_llama.py:64; an fp32 residual stream under AMP or after
    prepare_model_for_kbit_training). GPT-2's ln_1 (nn.LayerNorm, aten native_layer_norm saves
    `input`) saves the layer input as is without autocast; autocast runs layer_norm in fp32
    (torch aten/src/ATen/autocast_mode.h `AT_FORALL_FP32`: `layer_norm`), a copy of a bf16
    input, the fp32 input itself (AMP full fine-tuning's fp32 stream: the cast is a no-op)."""
    h = spec.hidden or 0
    if spec.model_type == "gpt2":
        copied = ctx.autocast and ctx.input_bytes != FP32
        return 0.0 if copied else float(ctx.input_bytes * h)
    if ctx.fused or ctx.compiled or spec.model_type in POST_NORM_MODEL_TYPES:
        # OLMo 2's layers norm the sublayers' outputs, never their input (transformers 5.25.0
        # models/olmo2/modeling_olmo2.py Olmo2DecoderLayer.forward): no norm saves the input
        return 0.0
    if ctx.liger:  # the input layernorm keeps X, the layer input itself (memory/liger.py)
        return float(ctx.input_bytes * h)
    if ctx.torch_norm:  # torch.nn.RMSNorm saves the layer input itself (memory/torchtitan.py)
        return norm_input_reused(ctx.input_bytes, h)
    return float(FP32 * h) if ctx.input_bytes == FP32 else 0.0


def amp_input_casts(ctx: Context, spec: ModelSpec, consumers: list[str], width: int) -> float:
    """Bytes per token of autocast's extra bf16 copies of an fp32 norm output read by several
    separate Linears under `amp_fp32_stream`. Each F.linear casts its fp32 input anew and saves
    that copy for its weight gradient: torch aten/src/ATen/autocast_mode.cpp `cached_cast`
    caches only when `can_try_cache` (a leaf that requires grad, i.e. a weight), and an
    activation is no leaf. `inputs_saved` counts one copy per group; a group of n separate
    Linears (llama's q_proj, k_proj, v_proj at modeling_llama.py:244-246; gate_proj, up_proj at
    :164) saves n. A fused Linear (qkv_proj, gate_up_proj) is one consumer: nothing extra."""
    if not amp_fp32_stream(ctx):
        return 0.0
    present = {lin.name for lin in spec.linears if lin.experts == 1}
    n = sum(1 for c in consumers if c in present)
    return float(max(n - 1, 0) * width * ctx.compute_bytes)


def inputs_saved(ctx: Context, consumers: list[str], width: int) -> float:
    """A tensor consumed by Linear layers `consumers`: saved once in the compute dtype when the
    weights train; under LoRA each adapted consumer saves its own adapter-dtype copy (peft
    `_cast_input_dtype`) unless the dtypes agree, and lora_A's output (r) for lora_B."""
    targeted = [c for c in consumers if c in ctx.targets]
    saved = 0.0
    if ctx.full:
        saved += width * ctx.compute_bytes
    elif targeted:
        saved += width * ctx.adapter_shared
        saved += len(targeted) * width * (ctx.adapter_each + ctx.mask_bytes)
    saved += len(targeted) * ctx.rank * ctx.rank_bytes
    return saved


def amp_fp32_stream(ctx: Context) -> bool:
    """AMP full fine-tuning with an fp32 residual stream (`amp_full`): the decoder layers'
    RMSNorms take fp32 input, so `input_dtype` is fp32 (transformers 5.24.0
    models/llama/modeling_llama.py:63) and their output is fp32."""
    return ctx.full and ctx.autocast and ctx.input_bytes == FP32


# MoE families whose experts do not go through transformers' experts interface
# (`use_experts_implementation`) but through ops on autocast's lists: dbrx's DbrxExpertGLU
# (`x.matmul`, transformers 5.25.0 models/dbrx/modeling_dbrx.py:264-268) and jetmoe's
# JetMoeParallelExperts (F.linear per expert, models/jetmoe/modeling_jetmoe.py:155)
_AUTOCAST_EXPERTS = frozenset({"dbrx", "jetmoe"})


def grouped_mm_experts(spec: ModelSpec) -> bool:
    """Whether the spec's routed experts run transformers' grouped_mm experts (`expert_bytes`).
    Not under `dense_compute`: llama4's Llama4TextExperts multiply every token with `torch.bmm`
    (models/llama4/modeling_llama4.py:80-82), on autocast's lists; nor `_AUTOCAST_EXPERTS`."""
    return (
        spec.moe is not None
        and not spec.moe.dense_compute
        and spec.model_type not in _AUTOCAST_EXPERTS
    )


def expert_bytes(ctx: Context, spec: ModelSpec) -> int:
    """Bytes per element of the routed-expert tensors of transformers' grouped_mm experts (the
    default `experts_implementation`, transformers 5.25.0 modeling_utils.py:1893-1894): the
    expert banks' dtype. `_grouped_mm` casts its input to the weight's dtype
    (integrations/moe.py:374-383, `input.to(weight.dtype)`: torch's `_grouped_mm` is on none of
    autocast's lists, torch 2.13.0 aten/src/ATen/autocast_mode.h:820-852
    `AT_FORALL_LOWER_PRECISION_FP` for CUDA, autocast_mode.cpp's AutocastCPU list for the CPU),
    and its output takes its first operand's dtype (ATen/native/GroupedMMUtils.h:115-121
    `_resolve_grouped_mm_out_dtype`; fp32 operands are accepted, :93-94). On CUDA
    `_grouped_mm_cuda` (aten/src/ATen/native/cuda/GroupedBlas.cpp) takes its fast path only for
    bf16 operands and otherwise `_grouped_mm_fallback`, writing into the same fp32 output as
    the CPU: the dtypes, and so the bytes, do not depend on the device. Under
    `amp_fp32_stream` the banks are fp32 (`amp_full`) and so is the norm output they read
    (`rms_norm_saved`), hence the gathered tokens (moe.py:441), the gate_up output, silu and
    its product (:501, :568-579), the down output and the routing-weight product (:524, the
    bf16 routing weights promote to fp32) are fp32; so they are with int8 banks, which their
    parametrization dequantizes to fp32 (`dequantized_bank_bytes`): the same cast of the
    gathered tokens to the weight's dtype makes every expert tensor fp32, whatever autocast
    says; otherwise the compute dtype."""
    fp32_banks = amp_fp32_stream(ctx) or ctx.dequantized_banks == FP32
    return FP32 if fp32_banks and grouped_mm_experts(spec) else ctx.compute_bytes


def rms_norm_saved(ctx: Context, width: int, rows: int = 1, stream: bool = False) -> float:
    """HF RMSNorm: fp32 input (the upcast copy, or the fp32 input itself), rsqrt per row, and
    the normalised tensor when the norm's weight trains (weight * normed saves normed), in the
    norm's input dtype (`self.weight * hidden_states.to(input_dtype)`, transformers 5.24.0
    models/llama/modeling_llama.py:67): fp32 for a residual-stream norm (`stream`) under
    `amp_fp32_stream`, where autocast leaves the fp32 mul alone (mul is on none of
    aten/src/ATen/autocast_mode.h's cast lists).
    torch.nn.RMSNorm on CUDA (torchtitan, `ctx.torch_norm`): its input and the fp32 rstd.
    Liger's RMSNorm (`ctx.liger`, memory/liger.py): its input (the stream's dtype for a
    residual-stream norm) and the fp32 rstd."""
    if ctx.torch_norm:
        return norm_saved_per_row(ctx.compute_bytes, width, rows)
    if ctx.liger:  # LigerRMSNorm: X and an fp32 rstd per row (memory/liger.py)
        return liger.norm_saved(ctx.input_bytes if stream else ctx.compute_bytes, width, rows)
    # `torchtune_modules` 3; `norm_product_fp32`: the normalised tensor is fp32 there
    normed = FP32 if ctx.torchtune or ctx.norm_product_fp32 else ctx.compute_bytes
    if stream and amp_fp32_stream(ctx):
        normed = FP32
    return FP32 * width + FP32 * rows + (width * normed if ctx.full else 0)


def head_input_saved(ctx: Context, spec: ModelSpec, loss: str, fused_input: int = 0) -> float:
    """Bytes per token the model's last norm and the head Linear keep for the backward. The
    last norm runs after every (checkpointed) decoder layer, so what it saves lives through the
    loss: transformers LlamaModel.norm (modeling_llama.py LlamaRMSNorm: fp32 upcast, rsqrt,
    weight * normed), torchtitan@9dec370 models/llama/model.py:444-445 and models/norms.py:96-101
    (RMSNorm `_norm(x.float()).type_as(x) * self.weight`), torchtune TransformerDecoder.norm
    (modules/rms_norm.py, the same ops): `rms_norm_saved`. Unsloth's fast RMSNorm keeps X and an
    fp32 r per row (unsloth kernels/rms_layernorm.py:205); GPT-2's ln_f (nn.LayerNorm) its input,
    mean and rstd. The head's input is saved as any Linear input (`inputs_saved`), except by
    losses that take the hidden states and make their gradient in the forward (Liger
    fused_linear_cross_entropy.py:72, unsloth_zoo cross_entropy_loss.py:243). TRL 1.16.0's fused
    LM head (`fused_input`: the hidden states' bytes per value, `logits.trl_logprob_bytes`) saves
    its own copy of the positions with a label whatever trains (trl/trainer/utils.py:1645
    `hidden_states[mask]`, kept by trl/kernels/chunked_logprob.py:386)."""
    h = spec.hidden or 0
    norm: float
    if spec.model_type == "gpt2":  # ln_f saves its input, the last layer's output (the stream)
        norm = ctx.input_bytes * h + 2 * FP32
    elif ctx.fused:
        norm = ctx.compute_bytes * h + FP32
    elif ctx.liger:  # its input is the last layer's output, the stream (memory/liger.py)
        norm = liger.norm_saved(ctx.input_bytes, h)
    else:  # the last norm reads the residual stream (its output fp32 under AMP's fp32 stream)
        norm = rms_norm_saved(ctx, h, stream=True)
    if fused_input:
        return norm + h * fused_input
    head = 0.0 if loss in ("liger", "unsloth") else inputs_saved(ctx, ["lm_head"], h)
    return norm + head


def _attention_core(ctx: Context, spec: ModelSpec) -> tuple[float, float]:
    """Full attention after the projections: (bytes per token, bytes per token per seq)."""
    assert spec.num_heads and spec.head_dim and spec.num_kv_heads is not None
    cb = ctx.attn_bytes or ctx.compute_bytes
    q = spec.num_heads * spec.head_dim
    kv = spec.num_kv_heads * spec.head_dim
    saved = 0.0
    if spec.qk_norm:
        saved += rms_norm_saved(ctx, q, spec.num_heads) + rms_norm_saved(ctx, kv, spec.num_kv_heads)
    per_seq = 0.0
    if ctx.eager:
        # eager_attention_forward: repeat_kv copies, q.k^T, fp32 softmax output + its copy in
        # the query's dtype (`.to` returns the tensor itself when that is fp32)
        saved += cb * q * 3
        per_seq = spec.num_heads * (FP32 + (cb if cb != FP32 else 0))
        if spec.attn_softcap:  # `/ softcap`, `tanh`, `* softcap`: tanh saves its output
            per_seq += spec.num_heads * cb  # (models/gemma2/modeling_gemma2.py:195-198)
    else:
        # k, v repeated to the query heads before SDPA, which saves them at that width:
        # `torchtune_modules` 1, or torchtitan@9dec370 models/llama/model.py:201-202
        # (`keys = repeat_kv(xk, self.n_rep)`, a copy: :121-125 expand + reshape) and :209
        # (`F.scaled_dot_product_attention(xq, xk, xv, ...)`) (`sdpa_repeats_kv`)
        kv_saved = q if ctx.torchtune or ctx.repeats_kv else kv
        saved += cb * (q + 2 * kv_saved) + cb * q + FP32 * spec.num_heads  # q, k, v, out, lse
        if kv_saved == kv and any(t.name == "qkv_proj" for t in spec.linears):
            # a fused qkv_proj's v is a slice view of its output (transformers 5.25.0
            # models/phi3/modeling_phi3.py:219-223): the v SDPA saves keeps the whole output
            saved += cb * (q + kv)
    if spec.attn_output_gate:
        saved += 2 * cb * q  # sigmoid(gate) and the attention output kept by the gating mul
    qkv, h = ["q_proj", "k_proj", "v_proj", "qkv_proj"], spec.hidden or 0
    saved += inputs_saved(ctx, qkv, h) + amp_input_casts(ctx, spec, qkv, h)
    saved += inputs_saved(ctx, ["o_proj"], q) - sdpa_output_reused(ctx, q)
    return saved, per_seq


def sdpa_output_reused(ctx: Context, width: int) -> float:
    """Bytes per token of the output projection's saved input that are SDPA's saved output.
    transformers 5.24.0 integrations/sdpa_attention.py:195 returns
    `attn_output.transpose(1, 2).contiguous()` and the model reshapes it
    (models/llama/modeling_llama.py:269, models/gpt2/modeling_gpt2.py:224): SDPA's kernels
    write their output as (batch, seq, heads, dim) and return its transpose (torch
    aten/src/ATen/native/transformers/cuda/attention.cu `_scaled_dot_product_flash_attention_cuda`:
    `Tensor attention = output.transpose(1, 2)`; the CPU flash kernel likewise), so both calls
    are views and a trained o_proj saves the very tensor SDPA saved as `out`. Eager attention's
    matmul output is (batch, heads, seq, dim): its `contiguous()` is a copy, counted."""
    if ctx.eager:
        return 0.0
    shared = ctx.torchtune and "o_proj" in ctx.targets and ctx.adapter_shared > 0
    if ctx.full or shared:  # `torchtune_modules` 2
        return float(width * ctx.compute_bytes)
    return 0.0


def _attention(ctx: Context, spec: ModelSpec) -> tuple[float, float]:
    """The attention core of the spec's kind (MLA, sinks: modules that import this one)."""
    if spec.mla is not None:
        from estimator.memory.activations_mla import mla_attention

        return mla_attention(ctx, spec)
    if spec.attention_sinks:
        from estimator.memory.activations_sinks import sinks_attention

        return sinks_attention(ctx, spec)
    return _attention_core(ctx, spec)


def _gated_deltanet(ctx: Context, spec: ModelSpec) -> float:
    """Qwen3.5 / Qwen3-Next linear attention: projections, causal conv (input and silu output
    kept), q/k repeated to the value heads, the fla kernel's saved g, beta, A, and the torch
    gated RMSNorm (fp32 copies of o and z, silu(z), weighted normed)."""
    geo = spec.linear_attention
    assert geo is not None and spec.hidden
    cb = ctx.compute_bytes
    nv, vd = geo.num_value_heads, geo.value_dim
    saved = inputs_saved(
        ctx,
        ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba"],
        spec.hidden,
    )
    saved += 2 * cb * geo.conv_dim  # conv output (silu's input) and silu(conv): q, k, v views
    if ctx.full:
        saved += cb * geo.conv_dim  # conv1d's input, kept for its weight gradient
    if nv > geo.num_key_heads:
        saved += 2 * cb * nv * geo.key_head_dim  # repeat_interleave copies of q and k
    saved += 3 * FP32 * nv + cb * nv  # softplus input, g, g cumsum (fp32); beta
    saved += cb * nv * GDN_CHUNK  # A: per chunk, per head, a 64 x 64 block -> 64 per token
    saved += 3 * FP32 * vd + FP32 * nv + cb * vd  # gated norm: o, z fp32, silu(z), rsqrt, w*normed
    if ctx.full:
        saved += cb * vd
    saved += inputs_saved(ctx, ["out_proj"], vd)
    return saved


def _mlp(ctx: Context, spec: ModelSpec, moe: bool) -> tuple[float, float]:
    """SwiGLU MLP (or MoE experts): (saved bytes per token, widest intermediate per token)."""
    cb = ctx.compute_bytes
    h = spec.hidden or 0
    if not moe:
        m = spec.intermediate or 0
        names = ["gate_proj", "up_proj", "gate_up_proj", "c_fc"]
        saved = inputs_saved(ctx, names, h) + amp_input_casts(ctx, spec, names, h)
        # gate output (silu input), silu output, up output; Liger's SwiGLU recomputes silu
        saved += (2 if ctx.liger else 3) * cb * m
        saved += inputs_saved(ctx, ["down_proj", "mlp.c_proj"], m)
        return saved, float(m)
    assert spec.moe is not None
    if spec.moe.activation == "clamped_swiglu":
        from estimator.memory.activations_gptoss import gpt_oss_experts

        return gpt_oss_experts(ctx, spec)
    if spec.moe.router == "grouped_sigmoid":
        from estimator.memory.activations_deepseek import deepseek_moe

        return deepseek_moe(ctx, spec)
    k, me = spec.moe.executed_per_token, spec.moe.expert_intermediate
    eb = expert_bytes(ctx, spec)
    router_input = inputs_saved(ctx, ["gate"], h)
    saved = router_input + FP32 * spec.moe.num_experts  # router, fp32 probs
    if ctx.liger and liger.fused_experts(spec):  # LigerExperts (memory/liger.py)
        if router_input == eb * h:  # the router saved x itself, which Liger saves too
            saved -= router_input
        saved += liger.fused_moe_saved(spec, eb, ctx.compute_bytes)
        return _with_shared_expert(ctx, spec, saved, float(spec.moe.experts_per_token * me))
    if ctx.full or ctx.expert_lora:
        saved += eb * k * h  # tokens gathered per expert, saved by the expert matmuls
    saved += 3 * eb * k * me + (eb * k * me if ctx.full or ctx.expert_lora else 0) + eb * k * h
    return _with_shared_expert(ctx, spec, saved, float(k * me))


def _with_shared_expert(
    ctx: Context, spec: ModelSpec, saved: float, width: float
) -> tuple[float, float]:
    """The routed experts' (saved, width) plus a shared expert's eager SwiGLU MLP, if any."""
    assert spec.moe is not None
    if spec.moe.shared_intermediate:
        cb, h, s = ctx.compute_bytes, spec.hidden or 0, spec.moe.shared_intermediate
        saved += inputs_saved(ctx, ["gate_proj", "up_proj", "shared_expert_gate"], h)
        saved += 3 * cb * s + inputs_saved(ctx, ["down_proj"], s) + 2 * cb  # + sigmoid gate
        width += s
    return saved, width


def layer_activations(
    ctx: Context, spec: ModelSpec, layer_type: str, mlp_type: str
) -> LayerActivations:
    """Saved bytes per token of one layer of the given kind, and its backward transient: the
    layer's incoming gradient (one hidden-wide tensor: the residual add's backward hands the
    same tensor to both branches, torch tools/autograd/derivatives.yaml `add.Tensor`: `self:
    grad`, `other: maybe_multiply(grad, alpha)`, which returns `grad` itself for alpha 1) plus
    the SwiGLU backward's MLP-wide gradients: d(down input), d(silu out) and d(up out) are
    alive together; where down_proj saved its input (trained, or adapted: lora_A's input) the
    backward has freed it by then, so the net is two MLP-wide tensors, else three (a frozen,
    unadapted down projection or frozen expert banks save no input: `_mlp_backward_tensors`);
    an fp32 adapter on down_proj adds the gradient of its fp32 input copy.
    The incoming gradient has the layer output's dtype (torch/csrc/autograd/engine.cpp
    `validate_outputs` casts each gradient to its input's metadata dtype): fp32 under AMP full
    fine-tuning, whose residual stream is fp32 (`input_bytes`); counted so for an MoE block,
    whose grouped_mm output is fp32 there too (no bf16 copy of the gradient for the branch),
    and its expert gradients in the experts' dtype (`expert_bytes`). The dense MLP under AMP
    keeps the compute dtype here: its backward moment (small-llama, 1024 tokens) holds the
    fp32 gradient but no longer down_proj's bf16 weight copy (`weight_casts`, released with
    that matmul's backward), two differences of opposite sign that this round does not model
    (at 256 tokens on small-qwen3 the most is inside down_proj's backward instead, with its
    weight copy and a bf16 weight gradient alive; bench/results/accuracy_hf_2026-12-03e.md).
    Checked to the byte on the hf stack's full fine-tuning of small-llama at 256 tokens (fake
    trace, bench/accuracy.py): 4,003,840 B estimated + rope's cos/sin (65,536 B, not modelled)
    + nine 512-byte scalars = 4,073,984 B measured."""
    cb = ctx.compute_bytes
    h = spec.hidden or 0
    if spec.model_type == "gpt2":
        return _gpt2_layer(ctx, spec)
    if ctx.fused and layer_type != LAYER_LINEAR and mlp_type != MLP_MOE:
        return _fused_layer(ctx, spec)
    if ctx.compiled and _compilable(ctx, spec, layer_type, mlp_type):
        repeats = ctx.repeats_kv or ctx.torchtune  # k, v expanded before SDPA
        saved = compiled_layer_saved(spec, cb, ctx.full, ctx.targets, ctx.rank_bytes, repeats)
        adapters = 0 if ctx.full else adapted_count(ctx.targets)
        saved += adapters * ctx.rank * ctx.rank_bytes
        saved += adapters * (spec.hidden or 0) * ctx.mask_bytes  # dropout masks (approx. width)
        m = spec.intermediate or 0
        return LayerActivations(saved, 0.0, 2 * cb * h + 2 * cb * m)
    saved = rms_norm_saved(ctx, h, stream=True) * 2  # input_layernorm, post_attention_layernorm
    if spec.norms_per_layer > 2:  # gemma2/3, glm4: post-attention and post-feedforward norms
        saved += rms_norm_saved(ctx, h) * 2  # on the sublayers' bf16 outputs: not `stream`
    per_seq = 0.0
    if layer_type == LAYER_LINEAR:
        saved += _gated_deltanet(ctx, spec)
    else:
        core, per_seq = _attention(ctx, spec)
        saved += core
    mlp_saved, width = _mlp(ctx, spec, mlp_type == MLP_MOE)
    saved += mlp_saved
    moe = mlp_type == MLP_MOE
    # the incoming gradient; an MoE block's in its output's dtype (`input_bytes`), the dense
    # MLP's as before (see the docstring)
    grad = (ctx.input_bytes if moe else cb) * h
    grad += ctx.held_output * h  # the recomputed output a reentrant checkpoint keeps (`Context`)
    # Liger's SwiGLU backward writes d(gate), d(up) into its saved gate / up (memory/liger.py)
    mlp_grads = 0 if ctx.liger and not moe else _mlp_backward_tensors(ctx, moe)
    transient = grad + mlp_grads * (expert_bytes(ctx, spec) if moe else cb) * width
    down_adapter = 0  # bytes per element of d(adapter-dtype copy of down's input), cast
    if not ctx.full and "down_proj" in ctx.targets and ctx.adapter_each not in (0, cb):
        down_adapter = ctx.adapter_each
    transient += down_adapter * width
    if mlp_type != MLP_MOE:
        transient = max(transient, _forward_transient(ctx, spec))
    # a trailing norm's backward starts the layer's: its incoming gradient has the layer
    # output's dtype (fp32 under `amp_fp32_stream`), whatever the MLP's backward holds later
    incoming = ctx.input_bytes * h if amp_fp32_stream(ctx) and not moe else grad
    trailing = trailing_norm_transient(ctx, spec, incoming)
    transient = max(transient, trailing)
    per_layer = transient_layer = other = 0.0
    if moe and ctx.liger and liger.fused_experts(spec):
        # LigerFusedMoEFunction's backward buffers and its banks' gradients (memory/liger.py);
        # a trained bank takes its gradient as .grad (counted with the gradients)
        eb = expert_bytes(ctx, spec)
        per_token, banks = liger.fused_moe_backward(spec, eb)
        transient = grad + per_token + _shared_expert_grads(ctx, spec)
        if ctx.expert_lora:  # the merged banks are saved; their gradient is Liger's banks
            per_layer = _merged_expert_weights(ctx, spec)[0]
        transient_layer = 0.0 if ctx.full else banks
    elif mlp_type == MLP_MOE and ctx.expert_lora:
        per_layer, transient_layer = _merged_expert_weights(ctx, spec)
        transient, other = _expert_lora_moments(ctx, spec, grad, mlp_grads, width)
    elif mlp_type == MLP_MOE and shared_after_routed(spec):
        transient = max(
            trailing, _late_shared_moments(ctx, spec, grad, mlp_grads, width, down_adapter)
        )
    elif mlp_type == MLP_MOE:
        transient = max(transient, grad + moe_combine_transient(ctx, spec))
        transient = max(transient, moe_forward_moment(ctx, spec))
    shared_forward = _shared_forward_transient(ctx, spec) if moe else 0.0
    if shared_forward and ctx.expert_lora:
        other = max(other, shared_forward)  # a forward moment: no bank gradient yet
    elif shared_forward:
        transient = max(transient, shared_forward)
    if moe and ctx.dequantized_banks and not ctx.expert_lora:
        per_layer += _dequantized_banks(ctx, spec)  # peft's merged banks replace them
    per_layer += ctx.weight_casts
    softmax_tok = softmax_seq = 0.0
    if ctx.eager and layer_type != LAYER_LINEAR and spec.mla is None:
        softmax_tok, softmax_seq = eager_softmax_moment(ctx, spec, mlp_saved)
    return LayerActivations(
        saved,
        per_seq,
        transient,
        per_layer,
        transient_layer,
        input_reused(ctx, spec),
        other,
        softmax_tok,
        softmax_seq,
    )


# decoder layers that end in a norm of the MLP's output (OLMo 2/3: post-attention and
# post-feedforward norms only, transformers 5.25.0 models/olmo2/modeling_olmo2.py
# Olmo2DecoderLayer.forward; the four-norm families: spec.norms_per_layer > 2)
POST_NORM_MODEL_TYPES = ("olmo2", "olmo3")
# fp32 tensors of one hidden width that an HF RMSNorm's backward makes and holds at once: the
# product's input gradient, then the mean's (`div`), the power's (`pow`, `mul` by 2) and their
# product (torch tools/autograd/derivatives.yaml `pow`, `mean`, `rsqrt`, `mul`), measured on
# transformers' LlamaRMSNorm, Gemma2RMSNorm and Olmo2RMSNorm (bf16 input, trained or frozen
# weight): 20 bytes per element
NORM_BACKWARD_FP32_TENSORS = 5


def trailing_norm_transient(ctx: Context, spec: ModelSpec, grad: float) -> float:
    """Bytes per token alive besides the saved tensors when the layer's backward starts in a
    norm of the MLP's output (`POST_NORM_MODEL_TYPES`, four-norm layers): the incoming
    gradient (`grad`) and the norm backward's fp32 temporaries, while every other saved tensor
    of the layer is still alive (a pre-norm layer's norms run their backward after the MLP's
    has freed its tensors). The temporaries peak in the power's backward, after the weight's
    mul has run its backward and released the normalised tensor it saved (a trained weight's,
    `rms_norm_saved`). Liger's and torch's fused RMSNorm backwards are kernels (0)."""
    trailing = spec.norms_per_layer > 2 or spec.model_type in POST_NORM_MODEL_TYPES
    if not trailing or ctx.liger or ctx.torch_norm or ctx.fused or ctx.torchtune:
        return 0.0
    h = spec.hidden or 0
    released = (FP32 if ctx.norm_product_fp32 else ctx.compute_bytes) if ctx.full else 0
    return grad + (NORM_BACKWARD_FP32_TENSORS * FP32 - released) * h


def eager_softmax_moment(ctx: Context, spec: ModelSpec, mlp_saved: float) -> tuple[float, float]:
    """The layer's most under eager attention, inside the softmax's backward, relative to the
    layer's saved tensors: (bytes per token, bytes per token per sequence position).
    transformers 5.25.0 `eager_attention_forward` (models/llama/modeling_llama.py) runs
    `softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)` then
    `matmul(attn_weights, value_states)`; the backward reaches it after the MLP's, the
    post-attention norm's and o_proj's backwards (their saved tensors freed: `mlp_saved`, the
    norm's, o_proj's input) and after the probabilities' matmul backward, which frees the bf16
    probabilities and the repeated values and leaves the probabilities' gradient, which
    `.to`'s backward casts to fp32 (the engine casts a gradient to its input's dtype, torch
    csrc/autograd/engine.cpp `validate_outputs`); `_softmax_backward_data` (torch
    tools/autograd/derivatives.yaml `_softmax`) then writes an fp32 gradient of the scores
    while the saved fp32 probabilities and the fp32 incoming gradient are alive: three fp32
    (batch, heads, seq, seq) tensors where the saved set counted the fp32 and the bf16
    probabilities (with fp32 compute `.to` returns the tensor itself: one). Besides them the
    layer's incoming gradient (hidden-wide) and the values' gradient from the matmul backward
    (query-wide, replacing the repeated values freed). The fake trace of small-llama's eager
    LoRA step (2048 tokens) shows these three fp32 tensors at its peak."""
    assert spec.num_heads and spec.head_dim
    cb = ctx.attn_bytes or ctx.compute_bytes
    h = spec.hidden or 0
    q = spec.num_heads * spec.head_dim
    probs_saved = FP32 + (cb if cb != FP32 else 0)
    per_seq = spec.num_heads * (3 * FP32 - probs_saved)
    if spec.attention_sinks:
        # gpt-oss (models/gpt_oss/modeling_gpt_oss.py:241-251): the softmax runs in the compute
        # dtype and saves only its output; the slice dropping the sink column has a backward
        # that writes the gradient into a zero (.., s + 1) tensor, which the softmax's backward
        # reads while writing its own: three such tensors where one was saved
        per_seq = spec.num_heads * 2 * cb
    freed = mlp_saved + rms_norm_saved(ctx, h, stream=True) + inputs_saved(ctx, ["o_proj"], q)
    if spec.norms_per_layer > 2:  # the post-attention and post-feedforward norms
        freed += 2 * rms_norm_saved(ctx, h)
    return float(ctx.compute_bytes * h - freed), float(per_seq)


def _mlp_backward_tensors(ctx: Context, moe: bool) -> int:
    """MLP-wide tensors the SwiGLU backward adds at its most (`layer_activations`): d(down
    input), d(silu out), d(up out), less the down projection's saved input, which its backward
    has released by then where it saved one (a trained projection or bank, peft's lora_A on
    down_proj). A frozen projection saves no input (torch's autograd saves a matmul's input only
    for the weight's gradient): fake traces of the hf stack's attention-only LoRA (small-llama:
    -4.6 % with two; Mixtral's frozen expert banks, the grouped_mm backward measured alone: three
    MLP-wide tensors beyond its forward's saved ones)."""
    down_saved = ctx.full or (ctx.expert_lora if moe else "down_proj" in ctx.targets)
    return 2 if down_saved else 3


def _shared_expert_grads(ctx: Context, spec: ModelSpec) -> float:
    """A shared expert's two MLP-wide backward gradients (its eager SwiGLU), if any."""
    assert spec.moe is not None
    return float(2 * ctx.compute_bytes * (spec.moe.shared_intermediate or 0))


def _forward_transient(ctx: Context, spec: ModelSpec, down_name: str = "down_proj") -> float:
    """Bytes per token alive besides the saved tensors when the layer's forward (under
    checkpointing: its recompute, inside the backward, whose incoming gradient and residual
    gradient, 2 x hidden, are alive; without checkpointing the forward runs before the
    backward, with no gradient, `Context.recomputed`) reaches the down projection's LoRA
    branch. The decoder layer holds the residual and the MLP's input, the MLP holds down_proj's
    input (transformers 5.24.0 models/llama/modeling_llama.py:164
    `down_proj(act_fn(gate_proj(x)) * up_proj(x))`, :306-313), peft holds the base layer's
    output `result` (peft 0.22.0 tuners/lora/layer.py:1191) and the branch's unsaved copies of
    the input (`_adapter_transient`). Where the backward moment (`layer_activations`' transient) is
    larger, that one counts. GPT-2's down projection is `mlp.c_proj` (transformers 5.24.0
    models/gpt2/modeling_gpt2.py GPT2MLP.forward)."""
    cb = ctx.compute_bytes
    h = spec.hidden or 0
    held = _down_branch_held(ctx, spec, spec.intermediate or 0, down_name in ctx.targets)
    if ctx.torchtune:  # `torchtune_modules` 4
        held += cb * h  # attn_out
        adapted = {"gate_proj", "up_proj"} & ctx.targets
        if ctx.full or (adapted and ctx.adapter_shared):
            held -= cb * h  # the MLP input: saved already, counted there
    return float(max(held, _input_projection_moment(ctx, spec)))


def _shared_forward_transient(ctx: Context, spec: ModelSpec) -> float:
    """Bytes per token alive besides the saved tensors when an MoE block's forward reaches its
    shared expert's down_proj LoRA branch: `_forward_transient`'s terms at the shared
    expert's width (the residual, the block's input, down_proj's input where no adapter saves
    it, peft's base output `result`, the branch's unsaved input copies, the recompute's two
    gradients), and, where the shared experts run after the routed ones
    (`shared_after_routed`: transformers 5.25.0 models/glm4_moe/modeling_glm4_moe.py:391
    `hidden_states + self.shared_experts(residuals)`), the routed experts' output held for that
    add. peft 0.22 adapts the shared experts under all-linear and the MLP names (estimator.lora
    `_lora_targets`); 0 where their down_proj is not adapted, or under full fine-tuning (the
    dense path's moments)."""
    assert spec.moe is not None
    s = spec.moe.shared_intermediate or 0
    if not s or ctx.full or "down_proj" not in ctx.targets:
        return 0.0
    held = _down_branch_held(ctx, spec, s, True)
    if shared_after_routed(spec):
        held += ctx.compute_bytes * (spec.hidden or 0)  # the routed output, waiting for the add
    return float(held)


def _down_branch_held(ctx: Context, spec: ModelSpec, width: int, down: bool) -> float:
    """Bytes per token an MLP of `width` holds, besides the saved tensors, when its forward
    reaches down_proj's LoRA branch (`down`: down_proj adapted): the residual, the MLP's input,
    down_proj's base output, the recompute's two gradients (or, in the first forward, the
    embeddings it keeps), down_proj's input where nothing saves it, the branch's unsaved input
    copies; the sources are `_forward_transient`'s."""
    cb = ctx.compute_bytes
    h = spec.hidden or 0
    held = 3 * cb * h  # the residual, the MLP input, down_proj's base output
    if ctx.recomputed:  # without checkpointing the forward runs before any gradient exists
        held += 2 * cb * h
    else:
        held += embeddings_held(ctx, spec)
    if residual_is_saved(ctx):  # the post-attention norm's saved input, counted there
        held -= cb * h
    if not (ctx.full or (down and ctx.adapter_shared)):
        held += cb * width  # down_proj's input, not saved by a frozen Linear
    if down and not ctx.full:
        held += ctx.adapter_transient * width
    if down and not ctx.full and not ctx.autocast and ctx.adapter_bytes != cb:
        # peft 0.22.0 tuners/lora/layer.py Linear.forward adds the branch in the adapter's
        # dtype, `result = result + lora_B(lora_A(dropout(x))) * scaling`, then casts back,
        # `result.to(torch_result_dtype)`. The backward of those three ops needs no saved
        # tensor, so it runs before the recompute and leaves, besides the incoming gradient,
        # the base output's gradient cast back to its dtype (the engine casts a gradient to
        # its input's dtype) and the branch's scaled gradient in the adapter's dtype pending
        # for the two matmuls' backward; under autocast the branch is bf16 and the base
        # output's gradient is the incoming one itself
        held += ctx.adapter_bytes * h
    return float(held)


def residual_is_saved(ctx: Context) -> bool:
    """Whether the decoder layer's residual (the post-attention norm's input) is itself a saved
    tensor: LigerRMSNorm saves X (memory/liger.py); transformers' RMSNorm saves
    `hidden_states.to(torch.float32)` (models/llama/modeling_llama.py:64), which is the input
    itself when the residual stream is fp32 already (`Tensor.to` returns self for its own dtype:
    the fp32 stream of `prepare_model_for_kbit_training`, or an fp32 model), so the residual is
    counted once, with the saved tensors. Found in the CPU run of small Llama's QLoRA step (the
    `aten.add` residual at :308 is the norm's only fp32 input there); not torchtune's / torch's
    norms (their own saved sets)."""
    if ctx.liger:
        return True
    return ctx.compute_bytes == FP32 and not (ctx.torchtune or ctx.torch_norm or ctx.fused)


def embeddings_held(ctx: Context, spec: ModelSpec) -> int:
    """Bytes per token the model's forward keeps of the embedding's output beside the residual
    stream, alive through the first forward (not a recompute, which runs after the model's
    forward returned): its local `inputs_embeds` (transformers 5.25.0
    models/llama/modeling_llama.py:372, :390 `hidden_states = inputs_embeds`, the same in the
    decoders copied from it). Without checkpointing no layer saves it (the first norm saves an
    fp32 copy, or nothing when the embedding is frozen: memory/outer_norms.py), so it is one more
    hidden-wide tensor at the forward's moments; with checkpointing it is the first layer's
    checkpoint, counted there. Fake traces of small Llama's and Phi-3's un-checkpointed LoRA:
    the bf16 `aten.embedding` output alive at the last layer's down projection."""
    return ctx.input_bytes * (spec.hidden or 0)


def _input_projection_moment(ctx: Context, spec: ModelSpec) -> float:
    """Bytes per token alive besides the saved tensors while peft's LoRA branch of the MLP's
    input projection finishes (peft 0.22.0 tuners/lora/layer.py:1191-1216: `result =
    self.base_layer(x)`, then `result = result + lora_B(lora_A(dropout(x))) * scaling` in the
    branch's dtype): the base output, lora_B's output and its scaled copy, each as wide as the
    projection's output (the fused gate_up_proj of Phi-3: twice the MLP width), in the
    adapter's dtype without autocast, bf16 under it; besides the backward's two gradients and
    the decoder layer's residual and MLP input (only the incoming gradient where a norm of the
    MLP's output starts the layer's backward: GLM-4's post-MLP norm; none without checkpointing,
    whose forward runs before the backward, `Context.recomputed`). The MLP's later saved
    tensors (the projection's gate / activation / up outputs, down_proj's input) are not made
    yet: less them, as the moment is counted over the layer's saved tensors. Found in the fake
    trace of small Phi-3's all-linear LoRA without autocast, whose most is there (-15.2 %
    before)."""
    if ctx.full or ctx.torchtune or ctx.liger:
        return 0.0
    fused = "gate_up_proj" in ctx.targets
    if not fused and not {"gate_proj", "up_proj"} & ctx.targets:
        return 0.0
    cb, h, m = ctx.compute_bytes, spec.hidden or 0, spec.intermediate or 0
    width = 2 * m if fused else m
    branch = cb if ctx.autocast else ctx.adapter_bytes
    later = 3 * cb * m + inputs_saved(ctx, ["down_proj"], m)
    held = 2 * cb * h  # the residual, the MLP's input
    if residual_is_saved(ctx):  # the post-attention norm's saved input, counted there
        held -= cb * h
    post_norm = spec.norms_per_layer > 2 or spec.model_type in POST_NORM_MODEL_TYPES
    if post_norm:
        later += rms_norm_saved(ctx, h)  # that norm's saved tensors, not made yet either
    if not ctx.recomputed:  # the forward before the backward: no gradient exists yet
        held += embeddings_held(ctx, spec)
    elif post_norm:
        held += cb * h  # the incoming gradient: a norm of the MLP's output waits for the recompute
    else:  # the residual add's backward and peft's on down_proj ran before the recompute
        held += 2 * cb * h
        if "down_proj" in ctx.targets and not ctx.autocast and ctx.adapter_bytes != cb:
            held += ctx.adapter_bytes * h  # its branch's gradient, pending (`_forward_transient`)
    return float(held + (cb + 2 * branch) * width - later)


def moe_forward_moment(ctx: Context, spec: ModelSpec) -> float:
    """Bytes per token alive besides the layer's saved tensors when the recomputed forward of
    transformers' grouped_mm experts applies the routing weights (transformers 5.25.0
    integrations/moe.py:524-529): `proj_out * sample_weights_g` and its gather back to token
    order, `weighted_out[inv_perm]`, both (tokens x top_k, hidden), neither saved, while the
    decoder layer holds its residual and the block's input, the backward's incoming gradient is
    alive, and so is the function's `selected_hidden_states_g` (moe.py:441, the tokens gathered
    per expert, top_k x hidden), which frozen banks do not save: three hidden-wide tensors and
    the gathered tokens, two under full fine-tuning, where the block's input and the gathered
    tokens are saved (the fake trace of small GLM-4.5's attention-only LoRA under autocast at
    this moment: the residual, the block's input, the incoming gradient, the gathered tokens,
    the product and its gather; before, a fourth hidden-wide tensor stood for the gathered
    tokens). The product takes the wider dtype of the two: DeepSeek-V3's and GLM-4.5's
    grouped-sigmoid router returns fp32 weights (`F.linear` of fp32 copies,
    modeling_glm4_moe.py:282-308), which autocast runs in bf16 (F.linear is on its
    lower-precision list); Qwen3-MoE's are cast to the logits' dtype
    (modeling_qwen3_moe.py:266). Found in the fake trace of small-glm4-moe's bf16 attention-only
    LoRA step without autocast, whose activations peak at this moment with both tensors fp32
    (the estimate was 10.6 % under). Not for Llama 4's dense bmm experts, gpt-oss's own, or the
    MoE modules of torchtitan and torchtune."""
    moe = spec.moe
    assert moe is not None
    transformers_experts = not (ctx.torch_norm or ctx.torchtune or ctx.liger)
    if moe.dense_compute or moe.activation != "swiglu" or not transformers_experts:
        return 0.0
    h, k = spec.hidden or 0, moe.experts_per_token
    # the residual, the block's input (a saved tensor when the router or the experts train:
    # full) and the incoming gradient
    held = (2 if ctx.full else 3) * ctx.compute_bytes * h
    if not (ctx.full or ctx.expert_lora):  # the gathered tokens: saved where the banks train
        held += expert_bytes(ctx, spec) * k * h
    return float(held + 2 * routing_product_bytes(ctx, spec) * k * h)


def routing_product_bytes(ctx: Context, spec: ModelSpec) -> int:
    """Bytes per element of `proj_out * sample_weights_g` (transformers 5.25.0
    integrations/moe.py:524) and of what its backward makes: the wider of the experts' dtype
    and the routing weights', which DeepSeek-V3's and GLM-4.5's grouped-sigmoid router returns
    in fp32 without autocast (`moe_forward_moment`)."""
    assert spec.moe is not None
    eb = expert_bytes(ctx, spec)
    routing = FP32 if spec.moe.router == "grouped_sigmoid" and not ctx.autocast else eb
    return max(eb, routing)


def shared_after_routed(spec: ModelSpec) -> bool:
    """The MoE block adds its shared experts after the routed ones: the `grouped_sigmoid`
    families, whose blocks are DeepseekV3MoE's (activations_deepseek.py docstring). Qwen2-MoE
    and Qwen3-Next run theirs first (modeling_qwen3_next.py:947-953)."""
    return spec.moe is not None and spec.moe.router == "grouped_sigmoid"


def _late_shared(ctx: Context, spec: ModelSpec) -> tuple[float, float]:
    """(bytes per token the shared experts save, bytes per token of their input's gradient)
    where they run after the routed ones (`shared_after_routed`, `_late_shared_moments`): not
    alive at the routed experts' moments, and waiting there to be summed; (0, 0) elsewhere."""
    from estimator.memory.activations_deepseek import shared_expert_saved

    assert spec.moe is not None
    if not (shared_after_routed(spec) and spec.moe.shared_intermediate):
        return 0.0, 0.0
    pending = (FP32 if amp_fp32_stream(ctx) else ctx.compute_bytes) * (spec.hidden or 0)
    return shared_expert_saved(ctx, spec), float(pending)


def _late_shared_moments(
    ctx: Context, spec: ModelSpec, grad: float, mlp_grads: int, width: float, down_adapter: int
) -> float:
    """The MoE block's moments where its shared experts run after the routed ones
    (`shared_after_routed`): the shared experts' own SwiGLU backward
    comes first, with every saved tensor alive; by the routed experts' backward, the combine's
    and the recomputed forward's routing product (`moe_combine_transient`,
    `moe_forward_moment`) their saved tensors are freed, or not yet made, and the gradient of
    their input (the block's input, in the norm output's dtype) waits for the routed experts'
    and the router's to be summed with it: two hidden-wide gradients in the backward moments.
    The fake trace of small GLM-4.5's full fine-tuning at its most (the combine's backward):
    the layer's incoming gradient and the shared experts' input gradient (the `add` of
    gate_proj's and up_proj's), no shared-expert tensor."""
    assert spec.moe is not None
    s = spec.moe.shared_intermediate
    late, pending = _late_shared(ctx, spec)
    shared_own = grad + mlp_grads * ctx.compute_bytes * s + down_adapter * s
    routed = grad + pending + mlp_grads * expert_bytes(ctx, spec) * (width - s) - late
    combine = grad + pending + moe_combine_transient(ctx, spec) - late
    return max(shared_own, routed, combine, moe_forward_moment(ctx, spec) - late)


def moe_combine_transient(ctx: Context, spec: ModelSpec) -> float:
    """Bytes per token the first backward ops of transformers' grouped_mm experts make while
    every saved tensor of the block is still alive (transformers 5.24.0 integrations/moe.py
    `grouped_mm_experts_forward`, the default `experts_implementation` on CPU and CUDA,
    modeling_utils.py:1893-1894), in backward order of its last lines (:516-526,
    `weighted_out = proj_out * sample_weights_g.unsqueeze(-1)`, `weighted_out[inv_perm]`,
    `.view(tokens, top_k, hidden).sum(dim=1)`): the gather's backward scatters the gradient
    into a (tokens x top_k, hidden) zeros tensor (torch FunctionsManual.cpp `index_backward`,
    in place into those zeros on CUDA), then the routing-weight product's backward makes
    d(proj_out) = grad * weights and grad * proj_out (before its reduction to the weights'
    (tokens x top_k, 1) shape; tools/autograd/derivatives.yaml `mul.Tensor`) while the zeros
    are alive: three top_k x hidden tensors, in the experts' dtype (`expert_bytes`: fp32
    under AMP full fine-tuning, where the CPU run of small-qwen3-moe at 1024 tokens shows the
    zeros and both products as fp32 (2048, 256) tensors); fp32 as well where the routing
    weights are (`routing_product_bytes`: small GLM-4.5's attention-only LoRA without autocast,
    fake trace: three fp32 (512, 256) tensors). Checked to the byte on small-qwen3-moe full
    fine-tuning at 256 tokens (fake trace)."""
    assert spec.moe is not None
    width = routing_product_bytes(ctx, spec)
    return float(3 * width * spec.moe.executed_per_token * (spec.hidden or 0))


def _compilable(ctx: Context, spec: ModelSpec, layer_type: str, mlp_type: str) -> bool:
    """Dense softmax-attention layers with SDPA/flash: the layers the compiled model of
    activations_compiled was read from; other kinds keep their eager terms (an overestimate)."""
    return (
        layer_type != LAYER_LINEAR
        and mlp_type != MLP_MOE
        and spec.mla is None
        and not spec.attention_sinks
        and not ctx.eager
        and not spec.qk_norm
        and spec.norms_per_layer <= 2
    )


def _fused_layer(ctx: Context, spec: ModelSpec) -> LayerActivations:
    """A dense decoder layer under Unsloth's kernels (unsloth main 015bdef0d9):
    Fast_RMS_Layernorm saves its input X (compute dtype) and the fp32 inverse rms per row
    (kernels/rms_layernorm.py:205); LoRA_QKV saves X once for q, k, v and their adapters
    (kernels/fast_lora.py:418-426); RoPE saves only cos/sin (rope_embedding.py:419); attention
    as SDPA/flash (q, k, v, out, logsumexp); LoRA_W saves o_proj's input (fast_lora.py:612),
    which is the attention kernel's saved output itself: the layer reshapes the kernel's
    (batch, seq, heads, dim) result, a view (llama.py:766-767 `A.reshape(...)`; every backend
    of utils/attention_dispatch.py `run_attention` returns that layout: SDPA's
    `out.transpose(1, 2)` of a kernel that writes (batch, seq, heads, dim), see
    `sdpa_output_reused`; flash-attn's `.reshape`, xformers' `.view` of their outputs), so it
    is counted once; eager attention's output is a copy. Under the xformers backend (the
    cuXXX-torchYYY install extras bring xformers; `select_attention_backend` takes it when
    flash-attn is absent) a grouped-query layer that needs gradients expands k and v to the
    query heads and reshapes them, copies, which xformers saves (attention_dispatch.py
    `run_attention`, XFORMERS branch: `K_mod.expand(...)`, `if requires_grad: K_mod =
    K_mod.reshape(bsz, kv_seq_len, n_heads, head_dim)`); the kv-wide k and v are then
    referenced by nothing. SDPA (enable_gqa) and flash-attn keep them kv-wide. LoRA_MLP saves
    X, e = gate(X), g = up(X) and recomputes silu(e) * g and the adapters' X @ A in its
    backward (fast_lora.py:110). No fp32 adapter-input copies, no fp32 norm upcasts. Transient:
    incoming and residual gradients and two MLP-wide gradients, and under the offloaded
    checkpointing the recomputed layer output UnslothCheckpointFunction holds (`held_output`)."""
    assert spec.num_heads and spec.head_dim and spec.num_kv_heads is not None
    cb = ctx.compute_bytes
    h, m = spec.hidden or 0, spec.intermediate or 0
    q = spec.num_heads * spec.head_dim
    kv = spec.num_kv_heads * spec.head_dim
    norms = 4 if spec.model_type in ("gemma2", "gemma3_text") else 2
    saved = norms * (cb * h + FP32)
    if spec.qk_norm:
        saved += cb * (q + kv) + FP32 * (spec.num_heads + spec.num_kv_heads)
    if ctx.xformers and not ctx.eager:
        kv = q  # k and v expanded to the query heads (without GQA kv == q: no change)
    saved += cb * h + cb * (q + 2 * kv) + cb * q + FP32 * spec.num_heads  # X, q, k, v, out, lse
    if ctx.eager:
        saved += cb * q  # o_proj input: the contiguous copy of the (batch, heads, seq, dim) output
    saved += cb * h + 2 * cb * m  # LoRA_MLP: X, e, g
    per_seq = spec.num_heads * (FP32 + cb) if ctx.eager else 0.0
    transient = 2 * cb * h + 2 * cb * m + ctx.held_output * h  # + the held output (`Context`)
    return LayerActivations(saved, per_seq, transient)


def selective_saved(ctx: Context, spec: ModelSpec) -> float:
    """Bytes per token per layer kept on the GPU by torchtitan's per-op selective checkpointing
    (torchtitan/distributed/activation_checkpoint.py:88-91 saves compute-intensive ops: mm and
    SDPA; :271 recomputes every second mm). A dense decoder's mms in forward order are q, k, v,
    o, gate, up, down: q, v, gate and down outputs are kept, with SDPA's output and logsumexp
    and the layer's input (the checkpoint's own input). MoE / linear-attention layers use the
    routed width as the MLP width (approximation).

    Eager, the policy's cache keeps the output of every MUST_SAVE op whether the backward reads
    it or not (torch 2.6.0 utils/checkpoint.py:1296-1297 `_CachingTorchDispatchMode`:
    `storage[func].append(...)`). Compiled (`ctx.compiled`: torchtitan compiles each wrapped
    block, torchtitan@9dec370 parallelisms/parallelize_llama.py:297-306 apply_compile), the
    tags only ban or force recomputation, and AOTAutograd saves what its min cut between the
    forward and the backward's required nodes crosses (torch 2.6.0
    _functorch/partitioners.py:906, :1003, :1010-1029): a forward value no backward op reads
    is never saved. A dense layer's down projection output feeds only the residual add
    (torchtitan@9dec370 models/llama/model.py:324 `out = h + self.feed_forward(...)`), whose
    backward reads nothing, so compiled it is not kept; an MoE's expert outputs are read by the
    routing weights' gradient and a post-FFN norm reads its input, so those keep it.
    bench/titan_sac_saved.py runs torchtitan@9dec370's block and policy both ways: eager keeps
    the four mm outputs, compiled all but down's. torchtitan 0.3.0's fused wqkv:
    `torchtitan.selective_saved_fused_qkv`."""
    if ctx.torch_norm and spec.moe is None:
        keep_down = not (ctx.compiled and _down_output_unread(spec))
        return selective_saved_fused_qkv(ctx.compute_bytes, spec, keep_down)
    cb = ctx.compute_bytes
    h = spec.hidden or 0
    heads, hd = spec.num_heads or 0, spec.head_dim or 0
    q, kv = heads * hd, (spec.num_kv_heads or 0) * hd
    m = spec.intermediate or 0
    if spec.moe is not None:
        m = spec.moe.experts_per_token * spec.moe.expert_intermediate
    down = 0 if ctx.compiled and _down_output_unread(spec) else h
    return cb * (h + q + kv + m + down) + cb * q + FP32 * heads


def _down_output_unread(spec: ModelSpec) -> bool:
    """The MLP's output feeds only the residual add (a dense MLP with no post-FFN norm)."""
    return spec.moe is None and spec.norms_per_layer <= 2 and spec.model_type != "gpt2"


def _merged_expert_weights(ctx: Context, spec: ModelSpec) -> tuple[float, float]:
    """peft's ParamWrapper adapts a fused expert parameter by parametrization: each forward
    builds W + scale * B @ A, a tensor the size of the whole expert bank in the weight's
    dtype, kept for the backward (peft 0.22.0 tuners/lora/layer.py:2488-2492, `baddbmm` with
    autocast off), with lora_A and lora_B cast to that dtype (`get_delta_factors`,
    :2712-2722: `lhs.to(param.dtype)`, copies where the adapters are fp32), which the baddbmm
    saves for their gradients; the backward materialises each bank's gradient, the size of the
    bank. (saved, transient) bytes of one layer: the merged banks and the factor copies; the
    down bank's gradient, made while the merged gate_up bank and the routed experts' saved
    tensors are alive (`_expert_lora_moments`; gate_up's gradient, twice its size, comes once
    the routed experts' tensors and the down bank are freed: smaller by the fake trace of small
    GLM-4.5's all-linear LoRA). An int8 bank's fp32 dequantized weight
    (`dequantized_bank_bytes`) makes the sum fp32."""
    assert spec.moe is not None and spec.hidden
    bank = spec.moe.num_experts * spec.hidden * spec.moe.expert_intermediate
    gate_up, down = 2 * bank, bank
    width = max(ctx.compute_bytes, ctx.dequantized_banks)
    copies = ctx.expert_factors * width if ctx.adapter_bytes != width else 0.0
    return width * (gate_up + down) + copies, width * down


def _expert_lora_moments(
    ctx: Context, spec: ModelSpec, grad: float, mlp_grads: int, width: float
) -> tuple[float, float]:
    """Per token, the MoE block's backward moments under peft's expert-bank LoRA
    (`_merged_expert_weights`): (at the down bank's gradient, the other moments' most). The
    down projection's grouped_mm backward ends with the bank's gradient and its input's
    (top_k x expert width) alive, the routed experts' output gradient standing in for their
    output; the combine's temporaries (`moe_combine_transient`) and the SwiGLU backward's
    gradients come before and after it, without a bank's gradient. Where the shared experts run
    after the routed ones (`shared_after_routed`) they are freed by then and their input
    gradient waits (`_late_shared`). Fake traces of the all-linear LoRA step at 256
    tokens: small GLM-4.5 peaks at the combine, small Mixtral at the down bank's gradient."""
    assert spec.moe is not None
    s = spec.moe.shared_intermediate
    late, pending = _late_shared(ctx, spec)
    base = grad + pending - late
    eb, k, m = expert_bytes(ctx, spec), spec.moe.executed_per_token, spec.moe.expert_intermediate
    combine = base + moe_combine_transient(ctx, spec)
    swiglu = base + mlp_grads * eb * (width - s)
    return base + eb * k * m, max(combine, swiglu)


def _dequantized_banks(ctx: Context, spec: ModelSpec) -> float:
    """Bytes of one MoE layer's expert banks as their parametrization dequantizes them
    (`dequantized_bank_bytes`: bf16 from NF4, the dtype the bank was quantized from; peft's
    kbit preparation casts no uint8 or int8 storage, so an fp32 residual stream leaves it so;
    fp32 from int8). transformers' grouped_mm experts pass the
    whole bank to the matmul (5.25.0 integrations/moe.py:479, 507), whose backward needs it for
    the input's gradient, so autograd keeps it until the layer's backward: every MoE layer's
    banks at the end of a forward without checkpointing, the recomputed layer's under it (the
    stack's `experts_dequant`). The banks of every expert Linear of one layer, without bias."""
    banks = sum(
        lin.experts * lin.in_features * lin.out_features for lin in spec.linears if lin.experts > 1
    )
    return float(ctx.dequantized_banks * banks)


def _gpt2_layer(ctx: Context, spec: ModelSpec) -> LayerActivations:
    """GPT-2 block: LayerNorm saves its input; c_attn output (q, k, v views) kept by SDPA;
    NewGELU in python ops keeps about four MLP-wide tensors; dropout masks (1 byte) where
    the config's pdrop > 0 are not modelled (probe runs set dropout to 0)."""
    cb = ctx.compute_bytes
    h, m = spec.hidden or 0, spec.intermediate or 0
    heads = spec.num_heads or 1
    # ln_1, ln_2 inputs (the residual stream: fp32 under AMP full fine-tuning), mean and rstd
    saved = 2.0 * (ctx.input_bytes * h + 2 * FP32)
    saved += inputs_saved(ctx, ["c_attn"], h) + cb * 3 * h + cb * h + FP32 * heads
    saved += inputs_saved(ctx, ["attn.c_proj"], h) - sdpa_output_reused(ctx, h)
    saved += inputs_saved(ctx, ["c_fc"], h) + 4 * cb * m + inputs_saved(ctx, ["mlp.c_proj"], m)
    per_seq = heads * (FP32 + cb) if ctx.eager else 0.0
    transient = max(cb * h + 2 * cb * m, _forward_transient(ctx, spec, "mlp.c_proj"))
    return LayerActivations(
        saved, per_seq, transient, ctx.weight_casts, 0.0, input_reused(ctx, spec)
    )
