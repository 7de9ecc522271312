"""GLM-4.5 / GLM-4.6 / GLM-4.5-Air (`glm4_moe`): Llama's grouped-query attention with q/k/v
bias, an optional per-head q/k norm and partial rotary embeddings, and DeepSeek-V3's MoE block
(`mla.sigmoid_moe`).

transformers 5.25.0 models/glm4_moe/modeling_glm4_moe.py:
- Glm4MoeAttention (:174-251): q/k/v_proj with `attention_bias`, o_proj without bias (:188-197);
  q_norm and k_norm over `head_dim` when `use_qk_norm` (:198-201); RoPE on the first
  `partial_rotary_factor` of each head (:75-77; configuration_glm4_moe.py:119 defaults the
  factor to 0.5);
- Glm4MoeDecoderLayer (:395-442): input_layernorm and post_attention_layernorm; a dense
  Glm4MoeMLP below `first_k_dense_replace`, Glm4MoeMoE from there on (:402-405);
- the checkpoint's multi-token-prediction layers (`num_nextn_predict_layers`, stored as
  model.layers.46 / .92) are skipped on load (:461 `_keys_to_ignore_on_load_unexpected`) and
  so are not counted: transformers trains without them.
"""

from __future__ import annotations

from estimator.architectures.mla import correction_bias, sigmoid_moe
from estimator.architectures.parts import (
    assemble,
    attention_linears,
    base_fields,
    embeddings,
    norms,
    rope_width,
)
from estimator.config_fields import ConfigReader
from estimator.spec import LAYER_FULL, ModelSpec

# configuration_glm4_moe.py:119 `kwargs.setdefault("partial_rotary_factor", 0.5)`
DEFAULT_ROTARY_FACTOR = 0.5
MTP_NOTE = (
    "the checkpoint's {n} multi-token-prediction layer(s) are not loaded by transformers "
    "(Glm4MoePreTrainedModel._keys_to_ignore_on_load_unexpected) and are not counted"
)


def glm4_moe(c: ConfigReader, family: str) -> ModelSpec:
    hidden = c.integer("hidden_size")
    layers = c.integer("num_hidden_layers")
    lins, heads, kv_heads, head_dim = attention_linears(
        c, hidden, layers, qkv_bias=c.flag("attention_bias", False), o_bias=False
    )
    moe_lins, sparse, moe = sigmoid_moe(c, hidden, layers, family)
    qk = layers * 2 * head_dim if c.flag("use_qk_norm", False) else 0
    fields = base_fields(c, family, hidden, layers)
    tied = c.flag("tie_word_embeddings", False)
    groups, head = embeddings(hidden, fields["vocab"], tied)
    groups.append(norms(hidden, layers, 2, qk))
    mtp = c.integer("num_nextn_predict_layers", 0, minimum=0)
    return assemble(
        fields,
        (heads, kv_heads, head_dim),
        [LAYER_FULL] * layers,
        sparse,
        lins + moe_lins + head,
        groups,
        intermediate=c.integer("intermediate_size"),
        extras=(correction_bias(sum(sparse), moe.num_experts),),
        tied_embeddings=tied,
        qk_norm=bool(qk),
        moe=moe,
        # transformers conversion_mapping.py: glm4_moe -> the qwen2_moe pattern
        peft_fused_experts=True,
        rope_width=rope_width(c, head_dim, DEFAULT_ROTARY_FACTOR),
        notes=(MTP_NOTE.format(n=mtp),) if mtp else (),
    )
