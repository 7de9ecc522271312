"""config.json -> ModelSpec for the supported `model_type`s.

Shapes follow the transformers modeling files (v5.x) of each architecture: `modeling_llama.py`
(LlamaAttention, LlamaMLP), `modeling_qwen3.py` (q_norm/k_norm), `modeling_qwen3_moe.py`,
`modeling_mixtral.py`, `modeling_gemma2.py` / `modeling_gemma3.py` (four norms per layer),
`modeling_phi3.py` (fused qkv_proj, gate_up_proj), `modeling_gpt2.py` (Conv1D c_attn/c_fc),
`modeling_qwen3_next.py` and `modeling_qwen3_5.py` (Gated DeltaNet + gated full attention).
Counts are checked against transformers itself in tests/estimator/test_architectures.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from estimator.config_fields import ConfigReader
from estimator.errors import EstimatorInputError
from estimator.spec import (
    LAYER_FULL,
    LAYER_LINEAR,
    LAYER_SLIDING,
    MLP_DENSE,
    MLP_MOE,
    Linear,
    LinearAttentionGeometry,
    ModelSpec,
    MoEGeometry,
    ParamGroup,
)


def _attention(
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


def _swiglu(
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


def _embeddings(hidden: int, vocab: int, tied: bool) -> tuple[list[ParamGroup], list[Linear]]:
    groups = [ParamGroup("embed_tokens", vocab * hidden)]
    head = [] if tied else [Linear("lm_head", hidden, vocab, 1, group="head")]
    return groups, head


def _moe_layers(c: ConfigReader, layers: int, experts: int) -> list[bool]:
    """Which layers are sparse: Qwen-MoE rule `layer not in mlp_only_layers and
    (layer + 1) % decoder_sparse_step == 0` (modeling_qwen3_moe.Qwen3MoeDecoderLayer)."""
    step = c.integer("decoder_sparse_step", 1)
    dense_only = set(c.int_list("mlp_only_layers"))
    return [experts > 0 and i not in dense_only and (i + 1) % step == 0 for i in range(layers)]


def _layer_types(c: ConfigReader, layers: int, default: str = LAYER_FULL) -> list[str]:
    types = c.str_list("layer_types")
    if types is None:
        return [default] * layers
    if len(types) != layers:
        raise EstimatorInputError(
            c.field("layer_types"), f"has {len(types)} entries for {layers} layers"
        )
    known = {LAYER_FULL, LAYER_SLIDING, LAYER_LINEAR}
    for i, t in enumerate(types):
        if t not in known:
            raise EstimatorInputError(f"{c.field('layer_types')}[{i}]", f"unknown layer type {t!r}")
    return types


def _experts_key(c: ConfigReader, family: str) -> str:
    """Mixtral names it `num_local_experts`; Qwen-MoE configs say `num_experts` (transformers
    v5 serialises it as `num_local_experts`): accept either."""
    preferred = "num_local_experts" if family == "mixtral" else "num_experts"
    other = "num_experts" if family == "mixtral" else "num_local_experts"
    return preferred if c.has(preferred) or not c.has(other) else other


def _decoder(c: ConfigReader, family: str) -> ModelSpec:
    """Llama-style decoders: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gemma2,
    gemma3_text, phi3."""
    hidden = c.integer("hidden_size")
    layers = c.integer("num_hidden_layers")
    vocab = c.integer("vocab_size")
    tied = c.flag("tie_word_embeddings", family in ("gemma2", "gemma3_text"))
    attn_bias = c.flag("attention_bias", False)
    qkv_bias = True if family == "qwen2" else attn_bias
    o_bias = False if family in ("qwen2", "phi3") else attn_bias
    lins, heads, kv_heads, head_dim = _attention(
        c, hidden, layers, qkv_bias=qkv_bias, o_bias=o_bias, fused=family == "phi3"
    )
    inter = c.integer("intermediate_size")
    mlp_bias = c.flag("mlp_bias", False)

    moe: MoEGeometry | None = None
    sparse = [False] * layers
    if family in ("qwen3_moe", "mixtral"):
        n_exp = c.integer(_experts_key(c, family))
        top_k = c.integer("num_experts_per_tok")
        if top_k > n_exp:
            raise EstimatorInputError(c.field("num_experts_per_tok"), f"{top_k} > {n_exp} experts")
        e_inter = inter if family == "mixtral" else c.integer("moe_intermediate_size")
        sparse = [True] * layers if family == "mixtral" else _moe_layers(c, layers, n_exp)
        n_sparse = sum(sparse)
        moe = MoEGeometry(n_exp, top_k, e_inter)
        lins += [Linear("gate", hidden, n_exp, n_sparse, group="router")]
        lins += _swiglu(hidden, e_inter, n_sparse, "experts", moe=(n_exp, top_k))
    lins += _swiglu(hidden, inter, layers - sum(sparse), bias=mlp_bias, fused=family == "phi3")

    norms_per_layer = 4 if family in ("gemma2", "gemma3_text") else 2
    norm_params = layers * norms_per_layer * hidden + hidden
    qk_norm = family in ("qwen3", "qwen3_moe", "gemma3_text")
    if qk_norm:
        norm_params += layers * 2 * head_dim
    groups, head = _embeddings(hidden, vocab, tied)
    groups.append(ParamGroup("norms", norm_params))
    sliding = c.integer("sliding_window", 0, minimum=0) if c.has("sliding_window") else None
    default_type = LAYER_FULL
    types = _layer_types(c, layers, default_type)
    if family == "gemma2" and c.str_list("layer_types") is None:
        types = [LAYER_SLIDING if i % 2 == 0 else LAYER_FULL for i in range(layers)]
    return ModelSpec(
        name=c.text("_name_or_path") or family,
        model_type=family,
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        intermediate=inter,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        layer_types=tuple(types),
        mlp_types=tuple(MLP_MOE if s else MLP_DENSE for s in sparse),
        linears=tuple(lins + head),
        others=tuple(groups),
        tied_embeddings=tied,
        qk_norm=qk_norm,
        sliding_window=sliding or None,
        moe=moe,
    )


def _gpt2(c: ConfigReader, family: str) -> ModelSpec:
    """GPT-2: learned positions, LayerNorm with bias, Conv1D projections with bias, 4h MLP."""
    hidden = c.integer("n_embd")
    layers = c.integer("n_layer")
    heads = c.integer("n_head")
    vocab = c.integer("vocab_size")
    positions = c.integer("n_positions")
    inter = c.integer("n_inner", 4 * hidden)
    tied = c.flag("tie_word_embeddings", True)
    lins = [
        Linear("c_attn", hidden, 3 * hidden, layers, True),
        Linear("attn.c_proj", hidden, hidden, layers, True),
        Linear("c_fc", hidden, inter, layers, True, "mlp"),
        Linear("mlp.c_proj", inter, hidden, layers, True, "mlp"),
    ]
    groups, head = _embeddings(hidden, vocab, tied)
    groups += [
        ParamGroup("wpe", positions * hidden),
        ParamGroup("norms", layers * 2 * 2 * hidden + 2 * hidden, "LayerNorm weight + bias"),
    ]
    return ModelSpec(
        name=c.text("_name_or_path") or "gpt2",
        model_type=family,
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        intermediate=inter,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        layer_types=tuple([LAYER_FULL] * layers),
        mlp_types=tuple([MLP_DENSE] * layers),
        linears=tuple(lins + head),
        others=tuple(groups),
        tied_embeddings=tied,
    )


def _hybrid_layer_types(c: ConfigReader, layers: int) -> list[str]:
    """`layer_types`, else every `full_attention_interval`-th layer is full attention
    (Qwen3NextConfig / Qwen3_5TextConfig defaults)."""
    if c.str_list("layer_types") is not None:
        return _layer_types(c, layers)
    interval = c.integer("full_attention_interval", 4)
    return [LAYER_FULL if (i + 1) % interval == 0 else LAYER_LINEAR for i in range(layers)]


def _gated_deltanet(
    c: ConfigReader, hidden: int, count: int, fused: bool
) -> tuple[list[Linear], int, LinearAttentionGeometry]:
    """Gated DeltaNet projections. Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;
    Qwen3-Next: fused in_proj_qkvz and in_proj_ba. Both: depthwise conv1d over q,k,v
    (no bias), dt_bias and A_log per value head, a gated RMSNorm of value_head_dim, out_proj."""
    geo = LinearAttentionGeometry(
        num_key_heads=c.integer("linear_num_key_heads"),
        num_value_heads=c.integer("linear_num_value_heads"),
        key_head_dim=c.integer("linear_key_head_dim"),
        value_head_dim=c.integer("linear_value_head_dim"),
        conv_kernel=c.integer("linear_conv_kernel_dim", 4),
    )
    grp = "linear_attention"
    nv = geo.num_value_heads
    if fused:
        lins = [
            Linear("in_proj_qkvz", hidden, 2 * geo.key_dim + 2 * geo.value_dim, count, group=grp),
            Linear("in_proj_ba", hidden, 2 * nv, count, group=grp),
        ]
    else:
        lins = [
            Linear("in_proj_qkv", hidden, geo.conv_dim, count, group=grp),
            Linear("in_proj_z", hidden, geo.value_dim, count, group=grp),
            Linear("in_proj_b", hidden, nv, count, group=grp),
            Linear("in_proj_a", hidden, nv, count, group=grp),
        ]
    lins.append(Linear("out_proj", geo.value_dim, hidden, count, group=grp))
    other = count * (geo.conv_dim * geo.conv_kernel + 2 * nv + geo.value_head_dim)
    return lins, other, geo


def _qwen3_vision_tower(v: ConfigReader) -> int:
    """Qwen3-VL / Qwen3.5 vision tower (modeling_qwen3_5.Qwen3_5VisionModel): 3-D patch conv with
    bias, learned positions, `depth` ViT blocks (LayerNorm w+b, fused qkv with bias, proj, GELU
    MLP with biases), and a patch merger (LayerNorm, two Linear with bias) per deepstack index
    + 1."""
    vh = v.integer("hidden_size")
    vi = v.integer("intermediate_size")
    depth = v.integer("depth")
    patch = v.integer("patch_size")
    temporal = v.integer("temporal_patch_size", 2)
    channels = v.integer("in_channels", 3)
    positions = v.integer("num_position_embeddings")
    out_h = v.integer("out_hidden_size")
    merge = v.integer("spatial_merge_size", 2)
    patch_embed = channels * temporal * patch * patch * vh + vh
    block = 4 * vh + (vh * 3 * vh + 3 * vh) + (vh * vh + vh) + (vh * vi + vi) + (vi * vh + vh)
    merged = vh * merge * merge
    merger_main = 2 * vh + (merged * merged + merged) + (merged * out_h + out_h)
    merger_deep = 2 * merged + (merged * merged + merged) + (merged * out_h + out_h)
    deepstack = len(v.int_list("deepstack_visual_indexes"))
    return patch_embed + positions * vh + depth * block + merger_main + deepstack * merger_deep


def _hybrid(c: ConfigReader, family: str, root: ConfigReader) -> ModelSpec:
    """Qwen3.5 / Qwen3-Next: Gated DeltaNet `linear_attention` layers interleaved with gated
    full-attention layers (q_proj doubled for the output gate, q_norm/k_norm)."""
    hidden = c.integer("hidden_size")
    layers = c.integer("num_hidden_layers")
    vocab = c.integer("vocab_size")
    tied = c.flag("tie_word_embeddings", root.flag("tie_word_embeddings", False))
    types = _hybrid_layer_types(c, layers)
    n_full = types.count(LAYER_FULL)
    n_lin = types.count(LAYER_LINEAR)
    gated = c.flag("attn_output_gate", True)
    attn, heads, kv_heads, head_dim = _attention(
        c,
        hidden,
        n_full,
        qkv_bias=c.flag("attention_bias", False),
        o_bias=c.flag("attention_bias", False),
        gated=gated,
    )
    lin_attn, conv_etc, geo = _gated_deltanet(c, hidden, n_lin, fused=family == "qwen3_next")
    inter = c.integer("intermediate_size")
    lins = [lin for lin in attn if lin.count] + [lin for lin in lin_attn if lin.count]

    moe = None
    sparse = [False] * layers
    experts_key = _experts_key(c, family)
    if c.has(experts_key) and c.integer(experts_key, 0, minimum=0) > 0:
        n_exp = c.integer(experts_key)
        top_k = c.integer("num_experts_per_tok")
        e_inter = c.integer("moe_intermediate_size")
        shared = c.integer("shared_expert_intermediate_size", 0, minimum=0)
        sparse = _moe_layers(c, layers, n_exp)
        n_sparse = sum(sparse)
        moe = MoEGeometry(n_exp, top_k, e_inter, shared)
        lins += [Linear("gate", hidden, n_exp, n_sparse, group="router")]
        lins += _swiglu(hidden, e_inter, n_sparse, "experts", moe=(n_exp, top_k))
        if shared:
            lins += _swiglu(hidden, shared, n_sparse, "shared_expert")
            lins += [Linear("shared_expert_gate", hidden, 1, n_sparse, group="router")]
    lins += _swiglu(hidden, inter, layers - sum(sparse))

    norm_params = layers * 2 * hidden + hidden + n_full * 2 * head_dim
    groups, head = _embeddings(hidden, vocab, tied)
    groups += [
        ParamGroup("norms", norm_params),
        ParamGroup("linear_attn.conv1d+dt+A+norm", conv_etc),
    ]

    extras: list[ParamGroup] = []
    vision = root.nested("vision_config") if root is not c else None
    if vision is not None:
        extras.append(
            ParamGroup(
                "vision_tower",
                _qwen3_vision_tower(vision),
                "not trained by a text-only run; loaded by the ForConditionalGeneration class",
            )
        )
    mtp_layers = (
        c.integer("mtp_num_hidden_layers", 0, minimum=0) if c.has("mtp_num_hidden_layers") else 0
    )
    if mtp_layers:
        attn_one = sum(lin.params_each for lin in attn)
        mlp_one = 3 * hidden * inter
        layer_one = attn_one + mlp_one + 2 * hidden + 2 * head_dim
        mtp = mtp_layers * layer_one + 2 * hidden * hidden + 3 * hidden
        extras.append(
            ParamGroup(
                "mtp_head",
                mtp,
                "multi-token-prediction head in the checkpoint; "
                "transformers does not instantiate it",
            )
        )
    return ModelSpec(
        name=root.text("_name_or_path") or family,
        model_type=family,
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        intermediate=inter,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        layer_types=tuple(types),
        mlp_types=tuple(MLP_MOE if s else MLP_DENSE for s in sparse),
        linears=tuple(lins + head),
        others=tuple(groups),
        extras=tuple(extras),
        tied_embeddings=tied,
        attn_output_gate=gated,
        qk_norm=True,
        linear_attention=geo,
        moe=moe,
    )


Builder = Callable[[ConfigReader, str], ModelSpec]
_DECODERS: dict[str, Builder] = {
    name: _decoder
    for name in (
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "mixtral",
        "gemma2",
        "gemma3_text",
        "phi3",
    )
}
_DECODERS["gpt2"] = _gpt2
HYBRID_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_next")
SUPPORTED_MODEL_TYPES = tuple(sorted([*_DECODERS, *HYBRID_TYPES, "gemma3"]))


def _reject_non_finite(value: Any, path: str, depth: int = 0) -> None:
    """NaN or Infinity anywhere in a config is an error naming the field (even in fields the
    estimator does not read: the file is broken)."""
    if depth > 64:
        raise EstimatorInputError(path, "nested too deeply")
    if isinstance(value, float) and not math.isfinite(value):
        raise EstimatorInputError(path, f"{value} is not a finite number")
    if isinstance(value, dict):
        for key, child in value.items():
            _reject_non_finite(child, f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            _reject_non_finite(child, f"{path}[{i}]", depth + 1)


def spec_from_config(config: Any, name: str | None = None) -> ModelSpec:
    """Build the parameter inventory from a Hugging Face config.json object."""
    root = ConfigReader(config)
    _reject_non_finite(config, "config")
    model_type = root.text("model_type")
    if model_type is None:
        raise EstimatorInputError("config.model_type", "required field is missing")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise EstimatorInputError(
            "config.model_type",
            f"unknown model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}",
        )
    if model_type in ("qwen3_5", "gemma3"):
        text = root.nested("text_config")
        if text is None:
            raise EstimatorInputError("config.text_config", f"{model_type} needs a text_config")
        family = "qwen3_5" if model_type == "qwen3_5" else "gemma3_text"
    else:
        text, family = root, model_type
    if family == "qwen3_5_text":
        family = "qwen3_5"
    if family in HYBRID_TYPES:
        spec = _hybrid(text, family, root)
    else:
        spec = _DECODERS[family](text, family)
    return _renamed(spec, name or root.text("_name_or_path") or text.text("_name_or_path"))


def _renamed(spec: ModelSpec, name: str | None) -> ModelSpec:
    from dataclasses import replace

    return replace(spec, name=name) if name else spec
