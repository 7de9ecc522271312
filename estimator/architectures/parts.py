"""Building blocks shared by the architecture builders of `estimator/architectures/`: attention
and SwiGLU Linear kinds, embeddings, MoE layer selection,
`layer_types` validation, and the ModelSpec fields every decoder has.

Shapes follow transformers v5's modeling files (LlamaAttention, LlamaMLP, Qwen3MoeDecoderLayer).
"""

from __future__ import annotations

from typing import Any

from estimator.config_fields import ConfigReader
from estimator.errors import EstimatorInputError
from estimator.spec import (
    LAYER_CHUNKED,
    LAYER_FULL,
    LAYER_LINEAR,
    LAYER_SLIDING,
    MLP_DENSE,
    MLP_MOE,
    Linear,
    ModelSpec,
    MoEGeometry,
    ParamGroup,
)


def attention_linears(
    c: ConfigReader,
    hidden: int,
    layers: int,
    *,
    qkv_bias: bool,
    o_bias: bool,
    gated: bool = False,
    fused: bool = False,
) -> tuple[list[Linear], int, int, int]:
    heads = c.integer("num_attention_heads")
    kv_heads = c.integer("num_key_value_heads", heads)
    head_dim = c.integer("head_dim", hidden // heads) if c.has("head_dim") else hidden // heads
    if head_dim < 1:
        raise EstimatorInputError(c.field("num_attention_heads"), "more heads than hidden size")
    if not c.has("head_dim") and hidden % heads:
        raise EstimatorInputError(
            c.field("num_attention_heads"),
            f"{heads} heads do not divide hidden_size {hidden} (and no head_dim is given)",
        )
    if kv_heads > heads or heads % kv_heads:
        raise EstimatorInputError(
            c.field("num_key_value_heads"),
            f"{kv_heads} key/value heads must divide the {heads} attention heads (GQA)",
        )
    q_out = heads * head_dim * (2 if gated else 1)  # gated attention: q_proj also emits the gate
    kv_out = kv_heads * head_dim
    if fused:
        lins = [Linear("qkv_proj", hidden, q_out + 2 * kv_out, layers, qkv_bias)]
    else:
        lins = [
            Linear("q_proj", hidden, q_out, layers, qkv_bias),
            Linear("k_proj", hidden, kv_out, layers, qkv_bias),
            Linear("v_proj", hidden, kv_out, layers, qkv_bias),
        ]
    lins.append(Linear("o_proj", heads * head_dim, hidden, layers, o_bias))
    return lins, heads, kv_heads, head_dim


def swiglu(
    hidden: int,
    inter: int,
    count: int,
    group: str = "mlp",
    *,
    bias: bool = False,
    fused: bool = False,
    moe: tuple[int, int] = (1, 1),
) -> list[Linear]:
    """Gated MLP (gate/up/down, or fused gate_up) on `count` layers; `moe` = (experts in the
    bank, experts active per token), (1, 1) for a dense MLP."""
    experts, active = moe
    if count == 0:
        return []
    if fused:
        return [
            Linear("gate_up_proj", hidden, 2 * inter, count, bias, group, experts, active),
            Linear("down_proj", inter, hidden, count, bias, group, experts, active),
        ]
    return [
        Linear("gate_proj", hidden, inter, count, bias, group, experts, active),
        Linear("up_proj", hidden, inter, count, bias, group, experts, active),
        Linear("down_proj", inter, hidden, count, bias, group, experts, active),
    ]


def embeddings(hidden: int, vocab: int, tied: bool) -> tuple[list[ParamGroup], list[Linear]]:
    groups = [ParamGroup("embed_tokens", vocab * hidden)]
    head = [] if tied else [Linear("lm_head", hidden, vocab, 1, group="head")]
    return groups, head


def moe_layers(c: ConfigReader, layers: int, experts: int) -> list[bool]:
    """Which layers are sparse: Qwen-MoE rule `layer not in mlp_only_layers and
    (layer + 1) % decoder_sparse_step == 0` (modeling_qwen3_moe.Qwen3MoeDecoderLayer)."""
    step = c.integer("decoder_sparse_step", 1)
    dense_only = set(c.int_list("mlp_only_layers"))
    return [experts > 0 and i not in dense_only and (i + 1) % step == 0 for i in range(layers)]


def layer_types(c: ConfigReader, layers: int, default: str = LAYER_FULL) -> list[str]:
    types = c.str_list("layer_types")
    if types is None:
        return [default] * layers
    if len(types) != layers:
        raise EstimatorInputError(
            c.field("layer_types"), f"has {len(types)} entries for {layers} layers"
        )
    known = {LAYER_FULL, LAYER_SLIDING, LAYER_LINEAR, LAYER_CHUNKED}
    for i, t in enumerate(types):
        if t not in known:
            raise EstimatorInputError(f"{c.field('layer_types')}[{i}]", f"unknown layer type {t!r}")
    return types


def experts_key(c: ConfigReader, family: str) -> str:
    """Mixtral names it `num_local_experts`; Qwen-MoE configs say `num_experts` (transformers
    v5 serialises it as `num_local_experts`): accept either."""
    preferred = "num_local_experts" if family == "mixtral" else "num_experts"
    other = "num_experts" if family == "mixtral" else "num_local_experts"
    return preferred if c.has(preferred) or not c.has(other) else other


def patterned_layer_types(
    c: ConfigReader, layers: int, every: int, first: str, last: str
) -> list[str]:
    """`layer_types` when the config lists them, else the config class's default pattern:
    layer i is `last` when (i + 1) % every == 0, else `first` (Olmo3Config: every 4th layer
    full, the others sliding; GptOssConfig: alternating sliding / full)."""
    if c.str_list("layer_types") is not None:
        return layer_types(c, layers)
    return [last if (i + 1) % every == 0 else first for i in range(layers)]


def top_k(c: ConfigReader, experts: int) -> int:
    k = c.integer("num_experts_per_tok")
    if k > experts:
        raise EstimatorInputError(c.field("num_experts_per_tok"), f"{k} > {experts} experts")
    return k


def mlp_kinds(sparse: list[bool]) -> tuple[str, ...]:
    return tuple(MLP_MOE if s else MLP_DENSE for s in sparse)


# `vocab_size` defaults of config classes whose published config.json files omit it
# (Gemma3TextConfig: 262_208; the Gemma 3 checkpoints' text_config has no vocab_size)
VOCAB_DEFAULTS = {"gemma3_text": 262_208}


def base_fields(c: ConfigReader, family: str, hidden: int, layers: int) -> dict[str, Any]:
    """ModelSpec fields every decoder builder fills the same way."""
    vocab = c.integer("vocab_size", VOCAB_DEFAULTS[family]) if family in VOCAB_DEFAULTS else None
    return {
        "name": c.text("_name_or_path") or family,
        "model_type": family,
        "hidden": hidden,
        "layers": layers,
        "vocab": vocab or c.integer("vocab_size"),
        "max_positions": _max_positions(c),
    }


def _max_positions(c: ConfigReader) -> int | None:
    """`max_position_embeddings` if the config gives a positive integer (only the torchtune
    stack's RoPE cache reads it), else None."""
    value = c.data.get("max_position_embeddings")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def rope_width(c: ConfigReader, head_dim: int, default_factor: float = 1.0) -> int:
    """Width of the cos / sin tables of transformers' default rotary embedding:
    `int(head_dim * partial_rotary_factor)` (transformers 5.24.0 modeling_rope_utils.py:179-181;
    models/llama/modeling_llama.py:111-116 `emb = torch.cat((freqs, freqs), dim=-1)`), the
    factor read from the config or its `rope_parameters` / `rope_scaling`, else the family's
    default (GLM-4 0.5, Qwen3-Next / Qwen3.5 0.25: their configuration files' setdefault)."""
    factor: Any = c.data.get("partial_rotary_factor")
    field = c.field("partial_rotary_factor")
    for key in ("rope_parameters", "rope_scaling"):
        nested = c.data.get(key)
        if factor is None and isinstance(nested, dict):
            factor, field = (
                nested.get("partial_rotary_factor"),
                f"{c.field(key)}.partial_rotary_factor",
            )
    if factor is None:
        factor = default_factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise EstimatorInputError(field, f"expected a number in (0, 1], got {factor!r:.60}")
    return int(head_dim * factor)


def norms(hidden: int, layers: int, per_layer: int, extra: int = 0) -> ParamGroup:
    """RMSNorm weights: `per_layer` of width hidden in each layer, the final norm, plus `extra`
    (q/k norms and the like)."""
    return ParamGroup("norms", layers * per_layer * hidden + hidden + extra)


def assemble(
    fields: dict[str, Any],
    attn: tuple[int, int, int],
    types: list[str],
    sparse: list[bool],
    linears: list[Linear],
    others: list[ParamGroup],
    **extra: Any,
) -> ModelSpec:
    """The ModelSpec of a decoder: `fields` from `base_fields`, attention geometry (heads,
    key/value heads, head_dim), layer and MLP kinds, inventory, and any further fields."""
    heads, kv_heads, head_dim = attn
    return ModelSpec(
        **fields,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        layer_types=tuple(types),
        mlp_types=mlp_kinds(sparse),
        linears=tuple(linears),
        others=tuple(others),
        **extra,
    )


def routed_moe(hidden: int, n_sparse: int, moe: MoEGeometry) -> list[Linear]:
    """Qwen-style sparse block in `n_sparse` layers: the router `gate` (a bare weight parameter in
    transformers v5's TopKRouter classes, not an nn.Linear), the expert banks, and, when
    `shared_intermediate` > 0, the shared expert with its sigmoid `shared_expert_gate`
    (Qwen2MoeSparseMoeBlock, Qwen3NextSparseMoeBlock, Qwen3_5MoeSparseMoeBlock)."""
    n_exp, k, e_inter, shared = (
        moe.num_experts,
        moe.experts_per_token,
        moe.expert_intermediate,
        moe.shared_intermediate,
    )
    lins = [Linear("gate", hidden, n_exp, n_sparse, group="router", nn_linear=False)]
    lins += swiglu(hidden, e_inter, n_sparse, "experts", moe=(n_exp, k))
    if shared:
        lins += swiglu(hidden, shared, n_sparse, "shared_expert")
        lins += [Linear("shared_expert_gate", hidden, 1, n_sparse, group="router")]
    return lins
