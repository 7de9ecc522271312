"""MoE decoders with their own layer layout: gpt-oss and the Llama 4 text model
(transformers v5 `modeling_gpt_oss.py`, `modeling_llama4.py`).

gpt-oss (GptOssDecoderLayer): q/k/v/o with bias (`attention_bias`, default true), `sinks` (one
learned logit per head; `GptOssPreTrainedModel._supports_sdpa = False`, so without a flash
kernel that takes sinks transformers runs eager attention), layers alternating sliding-window
(`sliding_window`, 128) and full attention (GptOssConfig default `layer_types`), GptOssTopKRouter
(weight and bias), GptOssExperts: fused gate_up_proj and down_proj banks with biases, of
`intermediate_size`, in every layer. The published checkpoint stores the banks' weights in MXFP4
(`quantization_config.quant_method == "mxfp4"`); recorded as `Linear.stored_dtype`.

Llama 4 text (Llama4TextDecoderLayer): bias-free attention, L2 q/k norm without weights, MoE in
the layers of `moe_layers` (default every `interleave_moe_layer_step`-th): Llama4Router (an
nn.Linear), experts of `intermediate_size` and one shared expert of the same size; dense layers
use `intermediate_size_mlp`. Layers with RoPE use chunked attention (`attention_chunk_size`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from estimator.architectures.parts import (
    assemble,
    attention_linears,
    base_fields,
    embeddings,
    layer_types,
    norms,
    patterned_layer_types,
    swiglu,
    top_k,
)
from estimator.config_fields import ConfigReader
from estimator.errors import EstimatorInputError
from estimator.spec import (
    LAYER_CHUNKED,
    LAYER_FULL,
    LAYER_SLIDING,
    MXFP4_BYTES_PER_PARAM,
    Linear,
    ModelSpec,
    MoEGeometry,
    ParamGroup,
)


def _stored_dtype(c: ConfigReader) -> str | None:
    quant = c.nested("quantization_config")
    if quant is None:
        return None
    return "mxfp4" if quant.text("quant_method") == "mxfp4" else None


@dataclass
class _Decoder:
    """What the gpt-oss and Llama 4 text readers share: the attention projections and shape
    (heads, kv heads, head dim), the expert count, top-k and width (`intermediate_size`), the
    base fields and the (possibly tied) embeddings."""

    hidden: int
    layers: int
    lins: list[Linear]
    shape: tuple[int, int, int]
    n_exp: int
    k: int
    inter: int
    fields: dict[str, Any]
    tied: bool
    groups: list[ParamGroup]
    head: list[Linear]


def _decoder(c: ConfigReader, family: str, attention_bias: bool) -> _Decoder:
    hidden = c.integer("hidden_size")
    layers = c.integer("num_hidden_layers")
    bias = c.flag("attention_bias", attention_bias)
    lins, heads, kv_heads, head_dim = attention_linears(
        c, hidden, layers, qkv_bias=bias, o_bias=bias
    )
    n_exp = c.integer("num_local_experts")
    k = top_k(c, n_exp)
    inter = c.integer("intermediate_size")
    fields = base_fields(c, family, hidden, layers)
    tied = c.flag("tie_word_embeddings", False)
    groups, head = embeddings(hidden, fields["vocab"], tied)
    shape = (heads, kv_heads, head_dim)
    return _Decoder(hidden, layers, lins, shape, n_exp, k, inter, fields, tied, groups, head)


def gpt_oss(c: ConfigReader, family: str) -> ModelSpec:
    d = _decoder(c, family, attention_bias=True)
    hidden, layers, n_exp, inter = d.hidden, d.layers, d.n_exp, d.inter
    stored = _stored_dtype(c)
    experts = swiglu(hidden, inter, layers, "experts", bias=True, moe=(n_exp, d.k))
    lins = d.lins + [Linear("router", hidden, n_exp, layers, True, "router", nn_linear=False)]
    lins += [replace(lin, stored_dtype=stored) for lin in experts]
    groups = d.groups + [
        norms(hidden, layers, 2),
        ParamGroup("attention_sinks", layers * d.shape[0]),
    ]
    types = patterned_layer_types(c, layers, 2, LAYER_SLIDING, LAYER_FULL)
    return assemble(
        d.fields,
        d.shape,
        types,
        [True] * layers,
        lins + d.head,
        groups,
        intermediate=inter,
        tied_embeddings=d.tied,
        sliding_window=c.integer("sliding_window", 128),
        moe=MoEGeometry(n_exp, d.k, inter, activation="clamped_swiglu"),
        attention_sinks=True,
        requires_eager=True,
        # half-width tables: `emb = freqs` (transformers 5.24.0 modeling_gpt_oss.py:184-190)
        rope_width=d.shape[2] // 2,
        notes=_gpt_oss_notes(stored),
    )


def _gpt_oss_notes(stored: str | None) -> tuple[str, ...]:
    notes = [
        "attention sinks: transformers has no SDPA path for gpt-oss (_supports_sdpa = False), "
        "so `sdpa` runs eager attention; `flash` needs a kernel that takes sinks"
    ]
    if stored == "mxfp4":
        notes.append(
            f"expert banks stored in MXFP4 ({MXFP4_BYTES_PER_PARAM} bytes/param); transformers' "
            "MXFP4 quantizer is not trainable, so training loads them dequantized to bf16"
        )
    return tuple(notes)


def _llama4_types(c: ConfigReader, layers: int) -> list[str]:
    """Llama4TextConfig: `layer_types`, else chunked attention on the RoPE layers
    (`no_rope_layers[i]` true; default all but every `no_rope_layer_interval`-th) when
    `attention_chunk_size` is set."""
    if c.str_list("layer_types") is not None:
        return layer_types(c, layers)
    rope = c.int_list("no_rope_layers")
    if not rope:
        interval = c.integer("no_rope_layer_interval", 4)
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(rope) != layers:
        raise EstimatorInputError(
            c.field("no_rope_layers"), f"has {len(rope)} entries for {layers}"
        )
    chunked = c.has("attention_chunk_size")
    return [LAYER_CHUNKED if r and chunked else LAYER_FULL for r in rope]


def _llama4_sparse(c: ConfigReader, layers: int) -> list[bool]:
    listed = c.data.get("moe_layers")
    if listed is not None:
        chosen = set(c.int_list("moe_layers"))
    else:
        step = c.integer("interleave_moe_layer_step", 1)
        chosen = set(range(step - 1, layers, step))
    return [i in chosen for i in range(layers)]


def llama4_text(c: ConfigReader, family: str) -> ModelSpec:
    d = _decoder(c, family, attention_bias=False)
    hidden, layers, n_exp, inter = d.hidden, d.layers, d.n_exp, d.inter
    inter_mlp = c.integer("intermediate_size_mlp")
    sparse = _llama4_sparse(c, layers)
    n_sparse = sum(sparse)
    lins = d.lins + [Linear("router", hidden, n_exp, n_sparse, group="router")]
    lins += swiglu(hidden, inter, n_sparse, "experts", moe=(n_exp, d.k))
    lins += swiglu(hidden, inter, n_sparse, "shared_expert")
    lins += swiglu(hidden, inter_mlp, layers - n_sparse)
    groups = d.groups + [norms(hidden, layers, 2)]
    types = _llama4_types(c, layers)
    chunk = c.integer("attention_chunk_size") if LAYER_CHUNKED in types else None
    return assemble(
        d.fields,
        d.shape,
        types,
        sparse,
        lins + d.head,
        groups,
        intermediate=inter_mlp,
        tied_embeddings=d.tied,
        moe=MoEGeometry(n_exp, d.k, inter, inter, dense_compute=True),
        notes=(
            "transformers' Llama4TextMoe computes every expert for every token: activations "
            "count all experts; FLOPs count the routed top-k (an efficient MoE kernel)",
        ),
        attention_chunk=chunk,
    )
