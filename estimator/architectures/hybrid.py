"""Qwen3.5 / Qwen3.5-MoE / Qwen3-Next text decoders: Gated DeltaNet `linear_attention` layers
interleaved with gated full-attention layers (q_proj doubled for the output gate, q_norm/k_norm),
dense or MoE MLPs with a gated shared expert (transformers v5 `modeling_qwen3_next.py`,
`modeling_qwen3_5.py`, `modeling_qwen3_5_moe.py`)."""

from __future__ import annotations

from estimator.architectures.parts import (
    assemble,
    attention_linears,
    base_fields,
    embeddings,
    experts_key,
    layer_types,
    moe_layers,
    rope_width,
    routed_moe,
    swiglu,
    top_k,
)
from estimator.config_fields import ConfigReader
from estimator.spec import (
    LAYER_FULL,
    LAYER_LINEAR,
    Linear,
    LinearAttentionGeometry,
    ModelSpec,
    MoEGeometry,
    ParamGroup,
)


def _hybrid_layer_types(c: ConfigReader, layers: int) -> list[str]:
    """`layer_types`, else every `full_attention_interval`-th layer is full attention
    (Qwen3NextConfig / Qwen3_5TextConfig defaults)."""
    if c.str_list("layer_types") is not None:
        return layer_types(c, layers)
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


def _moe_block(
    c: ConfigReader, family: str, hidden: int, layers: int
) -> tuple[list[Linear], list[bool], MoEGeometry | None]:
    """Router `gate`, expert banks, and the shared expert with its sigmoid gate
    (Qwen3NextSparseMoeBlock / Qwen3_5MoeSparseMoeBlock)."""
    key = experts_key(c, family)
    if not (c.has(key) and c.integer(key, 0, minimum=0) > 0):
        return [], [False] * layers, None
    n_exp = c.integer(key)
    k = top_k(c, n_exp)
    e_inter = c.integer("moe_intermediate_size")
    shared = c.integer("shared_expert_intermediate_size", 0, minimum=0)
    sparse = moe_layers(c, layers, n_exp)
    moe = MoEGeometry(n_exp, k, e_inter, shared)
    return routed_moe(hidden, sum(sparse), moe), sparse, moe


def hybrid(c: ConfigReader, family: str) -> ModelSpec:
    hidden = c.integer("hidden_size")
    layers = c.integer("num_hidden_layers")
    tied = c.flag("tie_word_embeddings", False)
    types = _hybrid_layer_types(c, layers)
    n_full = types.count(LAYER_FULL)
    n_lin = types.count(LAYER_LINEAR)
    gated = c.flag("attn_output_gate", True)
    bias = c.flag("attention_bias", False)
    attn, heads, kv_heads, head_dim = attention_linears(
        c, hidden, n_full, qkv_bias=bias, o_bias=bias, gated=gated
    )
    lin_attn, conv_etc, geo = _gated_deltanet(c, hidden, n_lin, fused=family == "qwen3_next")
    lins = [lin for lin in attn if lin.count] + [lin for lin in lin_attn if lin.count]
    moe_lins, sparse, moe = _moe_block(c, family, hidden, layers)
    n_dense = layers - sum(sparse)
    needs_inter = n_dense or not moe or c.has("intermediate_size")  # Qwen3.5-MoE has none
    inter = c.integer("intermediate_size") if needs_inter or not moe else moe.expert_intermediate
    lins += moe_lins + swiglu(hidden, inter, n_dense)

    fields = base_fields(c, family, hidden, layers)
    groups, head = embeddings(hidden, fields["vocab"], tied)
    groups += [
        ParamGroup("norms", layers * 2 * hidden + hidden + n_full * 2 * head_dim),
        ParamGroup("linear_attn.conv1d+dt+A+norm", conv_etc),
    ]
    extras: list[ParamGroup] = []
    mtp_layers = (
        c.integer("mtp_num_hidden_layers", 0, minimum=0) if c.has("mtp_num_hidden_layers") else 0
    )
    if mtp_layers:
        # one full-attention decoder layer (MoE block when the model is MoE), fc (2h -> h),
        # pre_fc_norm_embedding, pre_fc_norm_hidden and the final norm
        attn_one = sum(lin.params_each for lin in attn)
        mlp_one = sum(lin.params_each for lin in moe_lins) if moe else 3 * hidden * inter
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
    return assemble(
        fields,
        (heads, kv_heads, head_dim),
        types,
        sparse,
        lins + head,
        groups,
        intermediate=inter,
        extras=tuple(extras),
        tied_embeddings=tied,
        attn_output_gate=gated,
        qk_norm=True,
        linear_attention=geo,
        moe=moe,
        peft_fused_experts=family == "qwen3_next",  # in peft's conversion table; Qwen3.5-MoE not
        # transformers 5.24.0 configuration_qwen3_5.py:110 / qwen3_next :124 (factor 0.25);
        # modeling_qwen3_5.py:172-194: mrope sections recomposed to one table of that width
        rope_width=rope_width(c, head_dim, 0.25),
    )
