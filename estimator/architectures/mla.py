"""DeepSeek-V3: Multi-head Latent Attention, and MoE layers with shared experts after the first
`first_k_dense_replace` dense layers (transformers v5 `modeling_deepseek_v3.py`). GLM-4.7-Flash
(`glm4_moe_lite`, transformers 5.25.0 modeling_glm4_moe_lite.py) builds the same layers (its
modeling file is DeepSeek-V3's with `mlp_layer_types` choosing the dense layers).

Per layer (DeepseekV3Attention): q_a_proj (hidden -> q_lora_rank, `attention_bias`), q_a_layernorm,
q_b_proj (q_lora_rank -> heads * (nope + rope)) — or a plain q_proj when `q_lora_rank` is null —,
kv_a_proj_with_mqa (hidden -> kv_lora_rank + rope, `attention_bias`), kv_a_layernorm
(kv_lora_rank), kv_b_proj (kv_lora_rank -> heads * (nope + v)), o_proj (heads * v -> hidden,
`attention_bias`). DeepseekV3MoE: experts (fused gate_up / down banks of moe_intermediate_size),
a DeepseekV3TopkRouter whose `weight` is a parameter and whose `e_score_correction_bias` is a
buffer (not a parameter: reported in `extras`), and shared_experts, one MLP of
moe_intermediate_size * n_shared_experts. Dense layers: MLP of intermediate_size.
"""

from __future__ import annotations

from estimator.architectures.parts import assemble, base_fields, embeddings, norms, swiglu, top_k
from estimator.config_fields import ConfigReader
from estimator.errors import EstimatorInputError
from estimator.spec import (
    LAYER_FULL,
    Linear,
    MLAGeometry,
    ModelSpec,
    MoEGeometry,
    ParamGroup,
)


def mla_geometry(c: ConfigReader) -> MLAGeometry:
    q_rank = c.integer("q_lora_rank", 0, minimum=0) if c.has("q_lora_rank") else 0
    return MLAGeometry(
        q_lora_rank=q_rank,
        kv_lora_rank=c.integer("kv_lora_rank"),
        qk_nope_head_dim=c.integer("qk_nope_head_dim"),
        qk_rope_head_dim=c.integer("qk_rope_head_dim"),
        v_head_dim=c.integer("v_head_dim"),
    )


def mla_linears(
    c: ConfigReader, geo: MLAGeometry, hidden: int, heads: int, layers: int
) -> list[Linear]:
    bias = c.flag("attention_bias", False)
    qk = geo.qk_head_dim
    if geo.q_lora_rank:
        lins = [
            Linear("q_a_proj", hidden, geo.q_lora_rank, layers, bias),
            Linear("q_b_proj", geo.q_lora_rank, heads * qk, layers),
        ]
    else:
        lins = [Linear("q_proj", hidden, heads * qk, layers)]
    return lins + [
        Linear("kv_a_proj_with_mqa", hidden, geo.kv_lora_rank + geo.qk_rope_head_dim, layers, bias),
        Linear(
            "kv_b_proj", geo.kv_lora_rank, heads * (geo.qk_nope_head_dim + geo.v_head_dim), layers
        ),
        Linear("o_proj", heads * geo.v_head_dim, hidden, layers, bias),
    ]


def _experts_count(c: ConfigReader) -> int:
    """DeepSeek's config names it `n_routed_experts` (DeepseekV3Config maps it to
    `num_local_experts`)."""
    key = (
        "n_routed_experts"
        if c.has("n_routed_experts") or not c.has("num_local_experts")
        else ("num_local_experts")
    )
    return c.integer(key)


# the config classes' defaults where a config.json leaves the key out (a hand-written or trimmed
# file; save_pretrained writes model-specific keys): transformers 5.25.0
# configuration_deepseek_v3.py:90, :102,
# configuration_glm4_moe.py:105, :110, configuration_glm4_moe_lite.py (n_shared_experts 1)
SHARED_DEFAULT = 1
FIRST_DENSE_DEFAULTS = {"deepseek_v3": 3, "glm4_moe": 1}


def sigmoid_moe(
    c: ConfigReader, hidden: int, layers: int, family: str
) -> tuple[list[Linear], list[bool], MoEGeometry]:
    """DeepSeek-V3's MoE block, which GLM-4.5 (`glm4_moe`) and GLM-4.7-Flash
    (`glm4_moe_lite`) repeat line for line (transformers 5.25.0 modeling_glm4_moe.py:269-392,
    Glm4MoeTopkRouter / Glm4MoeExperts / Glm4MoeMoE): dense MLPs of `intermediate_size` in the
    layers `_sparse_layers` says, the router's bare `weight`, the fused expert banks and the
    shared experts (one MLP of moe_intermediate_size * n_shared_experts) in the others."""
    inter = c.integer("intermediate_size")
    n_exp = _experts_count(c)
    k = top_k(c, n_exp)
    e_inter = c.integer("moe_intermediate_size")
    shared = e_inter * c.integer("n_shared_experts", SHARED_DEFAULT, minimum=0)
    sparse = _sparse_layers(c, layers, family)
    n_sparse = sum(sparse)
    lins = [Linear("gate", hidden, n_exp, n_sparse, group="router", nn_linear=False)]
    lins += swiglu(hidden, e_inter, n_sparse, "experts", moe=(n_exp, k))
    if shared:
        lins += swiglu(hidden, shared, n_sparse, "shared_expert")
    lins += swiglu(hidden, inter, layers - n_sparse)
    return lins, sparse, MoEGeometry(n_exp, k, e_inter, shared, router="grouped_sigmoid")


def _sparse_layers(c: ConfigReader, layers: int, family: str) -> list[bool]:
    """Which layers hold the MoE block. GLM-4.7-Flash's config class reads `mlp_layer_types`
    ("dense" / "sparse" per layer), by default one dense layer then sparse ones
    (configuration_glm4_moe_lite.py:114-117; modeling_glm4_moe_lite.py:491); the others the
    first `first_k_dense_replace` layers dense (modeling_deepseek_v3.py,
    modeling_glm4_moe.py:402)."""
    if family != "glm4_moe_lite":
        default = FIRST_DENSE_DEFAULTS.get(family, 0)
        first_dense = min(c.integer("first_k_dense_replace", default, minimum=0), layers)
        return [i >= first_dense for i in range(layers)]
    kinds = c.str_list("mlp_layer_types")
    if kinds is None:
        return [i >= 1 for i in range(layers)]
    if len(kinds) != layers:
        raise EstimatorInputError(
            c.field("mlp_layer_types"), f"has {len(kinds)} entries for {layers} layers"
        )
    for i, kind in enumerate(kinds):
        if kind not in ("dense", "sparse"):
            raise EstimatorInputError(
                f"{c.field('mlp_layer_types')}[{i}]", f"expected dense or sparse, got {kind!r}"
            )
    return [kind == "sparse" for kind in kinds]


def correction_bias(n_sparse: int, n_exp: int) -> ParamGroup:
    return ParamGroup(
        "e_score_correction_bias",
        n_sparse * n_exp,
        "router bias buffer (fp32, in the checkpoint, not a parameter, not trained)",
    )


def deepseek_v3(c: ConfigReader, family: str) -> ModelSpec:
    hidden = c.integer("hidden_size")
    layers = c.integer("num_hidden_layers")
    heads = c.integer("num_attention_heads")
    geo = mla_geometry(c)
    lins = mla_linears(c, geo, hidden, heads, layers)
    inter = c.integer("intermediate_size")
    moe_lins, sparse, moe = sigmoid_moe(c, hidden, layers, family)
    lins += moe_lins
    fields = base_fields(c, family, hidden, layers)
    tied = c.flag("tie_word_embeddings", False)
    groups, head = embeddings(hidden, fields["vocab"], tied)
    groups.append(norms(hidden, layers, 2, layers * (geo.q_lora_rank + geo.kv_lora_rank)))
    extras = [correction_bias(sum(sparse), moe.num_experts)]
    mtp = c.integer("num_nextn_predict_layers", 0, minimum=0)
    notes: tuple[str, ...] = ()
    if mtp and family == "deepseek_v3":
        extras.append(_mtp_group(lins, head, groups, hidden, geo, moe.num_experts, mtp))
    elif mtp:  # GLM-4.7-Flash: its MTP layer's checkpoint layout is not read here
        notes = (
            f"the checkpoint's {mtp} multi-token-prediction layer(s) are not built by "
            "transformers and are not counted",
        )
    return assemble(
        fields,
        (heads, heads, geo.qk_head_dim),
        [LAYER_FULL] * layers,
        sparse,
        lins + head,
        groups,
        intermediate=inter,
        extras=tuple(extras),
        tied_embeddings=tied,
        moe=moe,
        mla=geo,
        notes=notes,
        # transformers conversion_mapping.py: deepseek_v3, glm4_moe_lite -> qwen2_moe
        peft_fused_experts=True,
        # the rotary part of the query/key heads (modeling_deepseek_v3.py:86-100)
        rope_width=geo.qk_rope_head_dim,
    )


def _mtp_group(
    lins: list[Linear],
    head: list[Linear],
    groups: list[ParamGroup],
    hidden: int,
    geo: MLAGeometry,
    n_exp: int,
    mtp: int,
) -> ParamGroup:
    """DeepSeek-V3's multi-token-prediction module (checkpoint layer `num_hidden_layers`, not
    instantiated by transformers; DeepSeek-V3 README_WEIGHTS.md): per MTP layer one MoE decoder
    layer, enorm, hnorm, eh_proj (2h -> h), shared_head.norm, and its own copies of
    embed_tokens and shared_head.head."""
    attn = sum(lin.params_each for lin in lins if lin.group == "attention")
    moe = sum(
        lin.params_each for lin in lins if lin.group in ("experts", "shared_expert", "router")
    )
    layer = attn + moe + 2 * hidden + geo.q_lora_rank + geo.kv_lora_rank + n_exp
    embed = sum(g.params for g in groups if g.name == "embed_tokens")
    out = head[0].params if head else embed
    per = layer + 3 * hidden + 2 * hidden * hidden + embed + out
    return ParamGroup(
        "mtp_head", mtp * per, "multi-token-prediction module; transformers does not instantiate it"
    )
