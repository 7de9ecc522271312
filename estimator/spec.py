"""The model as the estimator sees it: a parameter inventory by module name plus the geometry
that activation and FLOP formulas need. Built from a config.json by `estimator.architectures`
or from a bare parameter count by `params_only_spec`."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

LAYER_FULL = "full_attention"
LAYER_SLIDING = "sliding_attention"
LAYER_LINEAR = "linear_attention"
LAYER_CHUNKED = "chunked_attention"  # Llama 4: attention within blocks of `attention_chunk` tokens
MLP_DENSE = "dense"
MLP_MOE = "moe"

# MXFP4 (OCP Microscaling FP4, E2M1 values with one E8M0 scale per block of 32), as transformers
# stores gpt-oss's expert banks: `Mxfp4GptOssExperts` (integrations/mxfp4.py) packs two FP4 values
# per uint8 (`hidden_size // 2` bytes per row) and `_convert_moe_packed_tensors` reads one uint8
# scale per row of 16 packed bytes (32 values): 16/32 + 1/32 bytes per parameter.
MXFP4_BLOCK = 32
MXFP4_BYTES_PER_PARAM = (MXFP4_BLOCK / 2 + 1) / MXFP4_BLOCK
STORED_DTYPE_BYTES = {"mxfp4": MXFP4_BYTES_PER_PARAM}


@dataclass(frozen=True)
class Linear:
    """One kind of `nn.Linear` (or fused expert matrix), repeated `count` times in the model.

    `experts` > 1 marks an expert bank (one matrix per expert, `active_experts` used per token).
    `group`: attention | linear_attention | mlp | experts | shared_expert | router | head.
    """

    name: str
    in_features: int
    out_features: int
    count: int
    bias: bool = False
    group: str = "attention"
    experts: int = 1
    active_experts: int = 1
    stored_dtype: str | None = None  # as in the checkpoint when not the model's dtype ("mxfp4")
    nn_linear: bool = True  # False: a bare nn.Parameter (custom MoE routers), not nn.Linear

    @property
    def params_each(self) -> int:
        """Weight (+ bias) elements of one instance, all experts."""
        return self.experts * (
            self.in_features * self.out_features + (self.out_features if self.bias else 0)
        )

    @property
    def params(self) -> int:
        return self.count * self.params_each

    @property
    def active_params(self) -> int:
        """Elements a token multiplies with: only `active_experts` of an expert bank."""
        per_expert = self.in_features * self.out_features + (self.out_features if self.bias else 0)
        return self.count * self.active_experts * per_expert


@dataclass(frozen=True)
class ParamGroup:
    """Parameters that are not Linear layers (embeddings, norms, conv1d, gates...)."""

    name: str
    params: int
    note: str = ""


@dataclass(frozen=True)
class LinearAttentionGeometry:
    """Gated DeltaNet geometry (Qwen3-Next / Qwen3.5 `linear_attention` layers)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class MLAGeometry:
    """Multi-head Latent Attention (DeepSeek-V2/V3, transformers' DeepseekV3Attention): queries
    through a `q_lora_rank` bottleneck (0: a plain q_proj), keys and values from a shared
    `kv_lora_rank` latent plus one rotary key of `qk_rope_head_dim` shared by all heads."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoEGeometry:
    num_experts: int
    experts_per_token: int
    expert_intermediate: int
    shared_intermediate: int = 0
    # Llama4TextMoe (transformers v5 modeling_llama4.py) runs every expert on every token
    # (`hidden_states.repeat(num_experts, 1)` scaled by the router scores, then a bmm per bank)
    dense_compute: bool = False
    # expert activation: "swiglu", or gpt-oss's "clamped_swiglu" (GptOssExperts._apply_gate)
    activation: str = "swiglu"
    # router: "softmax" top-k, or DeepSeek-V3's "grouped_sigmoid" (DeepseekV3TopkRouter: sigmoid
    # scores, group-limited top-k)
    router: str = "softmax"

    @property
    def executed_per_token(self) -> int:
        """Experts whose matmuls run for each token (all of them under `dense_compute`)."""
        return self.num_experts if self.dense_compute else self.experts_per_token


@dataclass(frozen=True)
class ModelSpec:
    """Everything the estimator needs to know about a model.

    `params_total` counts the text decoder as transformers instantiates it (tied embeddings
    once); `extras` (vision tower, MTP head) are reported separately and only enter the weights
    when a profile says so. For a params-only spec (`geometry_known` False) geometry fields that
    were not given are None and the components that need them cannot be computed.
    """

    name: str
    model_type: str
    hidden: int | None
    layers: int | None
    vocab: int | None
    intermediate: int | None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    layer_types: tuple[str, ...] = ()
    mlp_types: tuple[str, ...] = ()
    linears: tuple[Linear, ...] = ()
    others: tuple[ParamGroup, ...] = ()
    extras: tuple[ParamGroup, ...] = ()
    tied_embeddings: bool = False
    attn_output_gate: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    linear_attention: LinearAttentionGeometry | None = None
    moe: MoEGeometry | None = None
    params_given: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    mla: MLAGeometry | None = None
    attention_chunk: int | None = None  # LAYER_CHUNKED layers attend within chunks of this size
    attention_sinks: bool = False  # gpt-oss: a learned logit per head joins the softmax
    requires_eager: bool = False  # transformers has no SDPA path for the model (gpt-oss sinks)
    # tanh softcapping (Gemma 2: config `attn_logit_softcapping`, `final_logit_softcapping`) of
    # the attention scores in eager attention and of the final logits
    attn_softcap: bool = False
    logit_softcap: bool = False
    norms_per_layer: int = 2  # RMSNorms on the residual stream per decoder layer
    # peft's `all-linear` adapts the fused expert banks and the router (peft 0.22
    # `_convert_peft_config_moe`: model types that transformers' conversion_mapping.py
    # `_MODEL_TO_CONVERSION_PATTERN` maps to the mixtral or qwen2_moe pattern, and qwen2_moe)
    peft_fused_experts: bool = False
    # the module holding the decoder layers in transformers' model (`model.layers`; a
    # multimodal model's `model.language_model.layers`): peft's regex targets match full
    # module names (`estimator.lora.module_names`)
    layers_module: str = "model.layers"
    # config.json `max_position_embeddings` (torchtune's named builders size their RoPE cache
    # with it: `memory.weights.rope_buffer_bytes`); None when the config has none
    max_positions: int | None = None
    # width of the rotary cos and sin tables transformers' RotaryEmbedding.forward builds each
    # forward (memory.activations.rope_table_bytes); 0: none (learned positions) or not read
    rope_width: int = 0
    # a checkpoint stored quantized by bitsandbytes (config.json `quantization_config`,
    # `architectures.stored_quantization`): its base loads as stored, "nf4" (4-bit, nf4 or fp4:
    # the same bytes) or "int8", with the stored double quantization; None: not quantized so
    stored_quantization: str | None = None
    stored_double_quant: bool = False
    # the config.json's own `model_type` (a composite's, e.g. gemma3 around gemma3_text), the key
    # peft's default LoRA targets are looked up by (`estimator.lora.peft_default_targets`)
    config_model_type: str = ""

    @property
    def qk_head_dim(self) -> int | None:
        """Head dimension of queries and keys (MLA: nope + rope part)."""
        return self.mla.qk_head_dim if self.mla else self.head_dim

    @property
    def v_head_dim(self) -> int | None:
        return self.mla.v_head_dim if self.mla else self.head_dim

    @property
    def stored_bytes_by_dtype(self) -> dict[str, int]:
        """Parameters stored in a dtype of their own in the checkpoint (gpt-oss: MXFP4 expert
        banks, see `STORED_DTYPE_BYTES`), by that dtype; the rest (biases included: gpt-oss keeps
        `*_proj_bias` in bf16) are in the model's dtype."""
        out: dict[str, int] = {}
        for lin in self.linears:
            if lin.stored_dtype:
                weights = lin.count * lin.experts * lin.in_features * lin.out_features
                out[lin.stored_dtype] = out.get(lin.stored_dtype, 0) + weights
        return out

    @property
    def geometry_known(self) -> bool:
        return self.params_given is None

    @cached_property  # the spec is frozen; the sums are asked for on every row
    def params_total(self) -> int:
        if self.params_given is not None:
            return self.params_given
        return sum(lin.params for lin in self.linears) + sum(g.params for g in self.others)

    @cached_property  # the spec is frozen; the sums are asked for on every row
    def params_active(self) -> int:
        """Parameters used per token (MoE: routed experts only)."""
        if self.params_given is not None:
            return self.params_given
        return sum(lin.active_params for lin in self.linears) + sum(g.params for g in self.others)

    @property
    def params_extras(self) -> int:
        return sum(g.params for g in self.extras)

    @cached_property  # the spec is frozen; the sums are asked for on every row
    def params_linear(self) -> int:
        """Parameters in Linear layers of the decoder blocks (what LoRA/QLoRA act on); lm_head is
        kept separately as a ParamGroup-like Linear with group 'head'."""
        return sum(lin.params for lin in self.linears if lin.group != "head")

    def count_layers(self, layer_type: str) -> int:
        return self.layer_types.count(layer_type)

    def linear(self, name: str) -> list[Linear]:
        return [lin for lin in self.linears if lin.name == name]

    @property
    def linear_names(self) -> list[str]:
        seen: list[str] = []
        for lin in self.linears:
            if lin.group != "head" and lin.name not in seen:
                seen.append(lin.name)
        return seen


def params_only_spec(
    params: float,
    *,
    name: str | None = None,
    hidden: int | None = None,
    layers: int | None = None,
    vocab: int | None = None,
    intermediate: int | None = None,
) -> ModelSpec:
    """A model known only by its parameter count (seed 003's presets). Geometry that is given
    lets the estimator compute checkpoints (hidden, layers), logits (vocab, hidden) and the
    recompute peak (intermediate); what is missing is reported as not computable."""
    count = int(round(params))
    missing = [
        k
        for k, v in (
            ("hidden", hidden),
            ("layers", layers),
            ("vocab", vocab),
            ("intermediate", intermediate),
        )
        if v is None
    ]
    notes: tuple[str, ...] = ("params-only spec: no config.json",)
    if missing:
        notes = notes + ("not given: " + ", ".join(missing),)
    return ModelSpec(
        name=name or f"params-{count / 1e9:.2f}B",
        model_type="params-only",
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        intermediate=intermediate,
        layer_types=tuple([LAYER_FULL] * layers) if layers else (),
        mlp_types=tuple([MLP_DENSE] * layers) if layers else (),
        params_given=count,
        notes=notes,
    )
