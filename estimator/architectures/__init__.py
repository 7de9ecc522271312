"""config.json -> ModelSpec for the supported `model_type`s.

Shapes follow the transformers modeling files (v5.x) of each architecture: `modeling_llama.py`
(LlamaAttention, LlamaMLP), `modeling_qwen3.py` (q_norm/k_norm), `modeling_qwen3_moe.py`,
`modeling_qwen2_moe.py` (shared expert + sigmoid gate), `modeling_mixtral.py`,
`modeling_gemma.py` (Gemma 1: Llama's shapes, GeGLU, tied embeddings),
`modeling_gemma2.py` / `modeling_gemma3.py` (four norms per layer, softcapping),
`modeling_glm4.py` (four norms, fused gate_up_proj, q/k/v bias), `modeling_olmo2.py` /
`modeling_olmo3.py` (no input norm, post-attention and post-feedforward norms, q_norm/k_norm over
all heads), `modeling_granite.py`, `modeling_qwen2_vl.py` (Qwen2-VL: Qwen2's decoder, flat or
nested config),
`modeling_smollm3.py`, `modeling_ministral.py` (Mistral's layers, sliding per `layer_types`),
`modeling_phi3.py` (fused qkv_proj, gate_up_proj), `modeling_gpt2.py`
(Conv1D c_attn/c_fc); Qwen3.5 / Qwen3-Next in `hybrid`, DeepSeek-V3 in `mla`, GLM-4.5 in
`glm_moe`,
gpt-oss and Llama 4 in `moe`, vision towers in `vision`; shared builders in `parts`, attention
geometry for the FLOP count in `attention`.
Counts are checked against transformers itself in tests/estimator/test_architectures.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from estimator.architectures.glm_moe import glm4_moe
from estimator.architectures.hybrid import hybrid
from estimator.architectures.mla import deepseek_v3
from estimator.architectures.moe import gpt_oss, llama4_text
from estimator.architectures.parts import (
    assemble,
    attention_linears,
    base_fields,
    embeddings,
    experts_key,
    layer_types,
    moe_layers,
    norms,
    patterned_layer_types,
    rope_width,
    routed_moe,
    swiglu,
    top_k,
)
from estimator.architectures.vision import vision_tower
from estimator.config_fields import ConfigReader
from estimator.errors import EstimatorInputError
from estimator.spec import (
    LAYER_FULL,
    LAYER_SLIDING,
    MLP_DENSE,
    Linear,
    ModelSpec,
    MoEGeometry,
    ParamGroup,
)

FOUR_NORMS = ("gemma2", "gemma3_text", "glm4")  # pre/post attention and pre/post MLP
POST_NORMS = ("olmo2", "olmo3")  # post-attention and post-feedforward only, q/k norm full width
QK_NORM = ("qwen3", "qwen3_moe", "gemma3_text", "qwen3_vl_text")  # per-head q_norm/k_norm
# q/k/v with bias, o_proj without
QKV_BIAS = ("qwen2", "qwen2_moe", "qwen2_5_vl_text", "qwen2_vl_text")
# peft 0.22 adapts these types' fused experts under all-linear (transformers conversion_mapping.py;
# qwen2_moe since peft 0.22.0, utils/transformers_weight_conversion.py:44-46)
PEFT_FUSED_EXPERTS = ("mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "deepseek_v3")
TIED_DEFAULT = ("gemma", "gemma2", "gemma3_text", "smollm3")
# rotary tables per forward not read for these (multimodal RoPE sections): rope_width 0
ROPE_NOT_READ = ("qwen2_5_vl_text", "qwen2_vl_text", "qwen3_vl_text")


def _rope_width(c: ConfigReader, family: str, head_dim: int) -> int:
    """Gemma 3 builds a cos/sin pair per layer type, sliding and full (transformers 5.24.0
    models/gemma3/modeling_gemma3.py:532-534); GLM-4's default factor is 0.5
    (configuration_glm4.py:76)."""
    if family in ROPE_NOT_READ:
        return 0
    width = rope_width(c, head_dim, 0.5 if family == "glm4" else 1.0)
    return 2 * width if family == "gemma3_text" else width


# config classes with tanh softcapping and their defaults (attention scores, final logits):
# transformers 5.25.0 models/gemma2/configuration_gemma2.py:89-90 (30.0 final, 50.0 attention),
# models/gemma3/configuration_gemma3.py (None, None)
SOFTCAP_DEFAULTS = {"gemma2": (True, True), "gemma3_text": (False, False)}


def _softcap(c: ConfigReader, key: str, default: bool) -> bool:
    """Whether config `key` (a softcapping value) is on: a positive number, or absent where the
    config class's default is one; an explicit null turns it off."""
    if key not in c.data:
        return default
    value = c.data[key]
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise EstimatorInputError(
            c.field(key), f"expected a positive number or null, got {value!r:.60}"
        )
    return True


def _softcaps(c: ConfigReader, family: str) -> dict[str, Any]:
    """The spec's softcapping fields and a model note saying what they add."""
    if family not in SOFTCAP_DEFAULTS:
        return {}
    attn_default, final_default = SOFTCAP_DEFAULTS[family]
    attn = _softcap(c, "attn_logit_softcapping", attn_default)
    final = _softcap(c, "final_logit_softcapping", final_default)
    said = []
    if attn:
        said.append(
            "attn_logit_softcapping: eager attention keeps tanh's output of the scores in "
            "every layer, and transformers has no SDPA path for it"
            if family == "gemma2"
            else "attn_logit_softcapping: eager attention keeps tanh's output of the scores"
        )
    if final:
        said.append(
            "final_logit_softcapping: the full loss holds tanh's output of every logit, TRL's "
            "chunked loss of each chunk's"
        )
    return {"attn_softcap": attn, "logit_softcap": final, "notes": tuple(said)}


def _attention_bias(c: ConfigReader, family: str) -> tuple[bool, bool]:
    """(q/k/v bias, o_proj bias). Qwen2 family: always / never (Qwen2-MoE: `qkv_bias`); GLM-4:
    `attention_bias` (default true) on q/k/v only; Phi-3: o_proj never; others: `attention_bias`
    on all four."""
    if family in QKV_BIAS:
        return c.flag("qkv_bias", True) if family == "qwen2_moe" else True, False
    if family == "glm4":
        return c.flag("attention_bias", True), False
    bias = c.flag("attention_bias", False)
    return bias, False if family == "phi3" else bias


def _sparse_mlp(
    c: ConfigReader, family: str, hidden: int, layers: int, inter: int
) -> tuple[list[Linear], list[bool], MoEGeometry | None]:
    """Router, expert banks and (Qwen2-MoE) the shared expert with its sigmoid gate."""
    if family not in ("qwen3_moe", "mixtral", "qwen2_moe"):
        return [], [False] * layers, None
    n_exp = c.integer(experts_key(c, family))
    k = top_k(c, n_exp)
    e_inter = inter if family == "mixtral" else c.integer("moe_intermediate_size")
    sparse = [True] * layers if family == "mixtral" else moe_layers(c, layers, n_exp)
    n_sparse = sum(sparse)
    shared = 0
    if family == "qwen2_moe":
        shared = c.integer("shared_expert_intermediate_size", 0, minimum=0)
    # Qwen3-MoE's and Mixtral's routers are adapted through peft's conversion table
    # (see ModelSpec.peft_fused_experts)
    moe = MoEGeometry(n_exp, k, e_inter, shared)
    return routed_moe(hidden, n_sparse, moe), sparse, moe


# MinistralConfig's `sliding_window` default (transformers 5.25.0
# models/ministral/configuration_ministral.py:82); its `layer_types` default is every layer
# sliding when a window is set, else every layer full (:91-94)
MINISTRAL_WINDOW = 4096


def _sliding_window(c: ConfigReader, family: str) -> int | None:
    if family == "ministral" and "sliding_window" not in c.data:  # absent, not null
        return MINISTRAL_WINDOW
    return (c.integer("sliding_window", 0, minimum=0) if c.has("sliding_window") else 0) or None


def _decoder_types(c: ConfigReader, family: str, layers: int) -> list[str]:
    if family == "ministral" and c.str_list("layer_types") is None:
        kind = LAYER_SLIDING if _sliding_window(c, family) else LAYER_FULL
        return [kind] * layers
    if family == "gemma2" and c.str_list("layer_types") is None:
        return [LAYER_SLIDING if i % 2 == 0 else LAYER_FULL for i in range(layers)]
    if family == "olmo3":
        return patterned_layer_types(c, layers, 4, LAYER_SLIDING, LAYER_FULL)
    if family == "gemma3_text":  # Gemma3TextConfig: `sliding_window_pattern` (6), last one full
        every = c.integer("sliding_window_pattern", 6)
        return patterned_layer_types(c, layers, every, LAYER_SLIDING, LAYER_FULL)
    return layer_types(c, layers)


def _decoder(c: ConfigReader, family: str) -> ModelSpec:
    """Llama-style decoders (see the module docstring for the families)."""
    hidden = c.integer("hidden_size")
    layers = c.integer("num_hidden_layers")
    tied = c.flag("tie_word_embeddings", family in TIED_DEFAULT)
    qkv_bias, o_bias = _attention_bias(c, family)
    lins, heads, kv_heads, head_dim = attention_linears(
        c, hidden, layers, qkv_bias=qkv_bias, o_bias=o_bias, fused=family == "phi3"
    )
    inter = c.integer("intermediate_size")
    moe_lins, sparse, moe = _sparse_mlp(c, family, hidden, layers, inter)
    fused_mlp = family in ("phi3", "glm4")
    lins += moe_lins
    lins += swiglu(
        hidden, inter, layers - sum(sparse), bias=c.flag("mlp_bias", False), fused=fused_mlp
    )

    per_layer = 4 if family in FOUR_NORMS else 2
    qk = layers * 2 * head_dim if family in QK_NORM else 0
    if family in POST_NORMS:
        qk = layers * (heads + kv_heads) * head_dim
    fields = base_fields(c, family, hidden, layers)
    groups, head = embeddings(hidden, fields["vocab"], tied)
    groups.append(norms(hidden, layers, per_layer, qk))
    sliding = _sliding_window(c, family)
    return assemble(
        fields,
        (heads, kv_heads, head_dim),
        _decoder_types(c, family, layers),
        sparse,
        lins + head,
        groups,
        intermediate=inter,
        tied_embeddings=tied,
        qk_norm=bool(qk),
        sliding_window=sliding,
        moe=moe,
        norms_per_layer=per_layer,
        peft_fused_experts=family in PEFT_FUSED_EXPERTS,
        rope_width=_rope_width(c, family, head_dim),
        **_softcaps(c, family),
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
    groups, head = embeddings(hidden, vocab, tied)
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


Builder = Callable[[ConfigReader, str], ModelSpec]
_DECODER_FAMILIES = (
    "llama",
    "gemma",
    "mistral",
    "ministral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "olmo3",
    "granite",
    "glm4",
    "smollm3",
    "qwen2_5_vl_text",
    "qwen2_vl_text",
    "qwen3_vl_text",
)
_BUILDERS: dict[str, Builder] = {name: _decoder for name in _DECODER_FAMILIES}
_BUILDERS.update(
    {
        "gpt2": _gpt2,
        "gpt_oss": gpt_oss,
        "deepseek_v3": deepseek_v3,
        "glm4_moe": glm4_moe,
        "glm4_moe_lite": deepseek_v3,
        "llama4_text": llama4_text,
        "qwen3_5": hybrid,
        "qwen3_5_text": hybrid,
        "qwen3_5_moe": hybrid,
        "qwen3_5_moe_text": hybrid,
        "qwen3_next": hybrid,
    }
)

# Multimodal configs: the text decoder's family (decoder builder) and the composite class's
# `tie_word_embeddings` default (transformers v5 configuration_*.py; the composite's own flag
# decides tying in its ForConditionalGeneration, Qwen2.5-VL also honours text_config's).
COMPOSITES: dict[str, tuple[str, bool]] = {
    "qwen3_5": ("qwen3_5", False),
    "qwen3_5_moe": ("qwen3_5_moe", False),
    "gemma3": ("gemma3_text", True),
    "mistral3": ("mistral", True),
    "llama4": ("llama4_text", False),
    "qwen2_5_vl": ("qwen2_5_vl_text", False),
    "qwen2_vl": ("qwen2_vl_text", False),
    "qwen3_vl": ("qwen3_vl_text", False),
}
# composites whose published config.json keeps the text fields at the top level (Qwen2-VL and
# Qwen2.5-VL; transformers 5.25.0 configuration_qwen2_vl.py:170-177 moves them into text_config)
FLAT_LAYOUT = ("qwen2_vl", "qwen2_5_vl")
# where a composite's decoder layers sit (transformers 5.25.0: Llama4ForConditionalGeneration
# holds a Llama4ForCausalLM as `language_model`, the others a base model as
# `model.language_model`; tests/estimator/test_lora_regex.py builds each on the meta device)
_LAYERS = {
    "qwen3_5": "model.language_model.layers",
    "qwen3_5_moe": "model.language_model.layers",
    "gemma3": "model.language_model.layers",
    "mistral3": "model.language_model.layers",
    "llama4": "language_model.model.layers",
    "qwen2_5_vl": "model.language_model.layers",
    "qwen2_vl": "model.language_model.layers",
    "qwen3_vl": "model.language_model.layers",
}
# text_config model_types accepted inside a composite, mapped to a builder family
_TEXT_FAMILIES = {
    "mistral": "mistral",
    "ministral": "mistral",
    "ministral3": "mistral",
    "llama": "llama",
}
SUPPORTED_MODEL_TYPES = tuple(sorted({*_BUILDERS, *COMPOSITES}))


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


def _composite(root: ConfigReader, model_type: str) -> tuple[ConfigReader, str]:
    """The text config of a multimodal config, with the composite's tying rule applied."""
    text = root.nested("text_config")
    if text is None and model_type in FLAT_LAYOUT and root.has("hidden_size"):
        text = root  # the published flat layout: text fields at the top (Qwen2_5_VLConfig BC)
    if text is None:
        raise EstimatorInputError("config.text_config", f"{model_type} needs a text_config")
    family, tie_default = COMPOSITES[model_type]
    if model_type == "qwen3_5":
        tied = text.flag("tie_word_embeddings", root.flag("tie_word_embeddings", tie_default))
    else:
        tied = root.flag("tie_word_embeddings", tie_default)
        if model_type in FLAT_LAYOUT:  # Qwen2VLConfig.__post_init__ forwards text_config's
            tied = tied or text.flag("tie_word_embeddings", False)
    if model_type == "mistral3":
        inner = text.text("model_type", "mistral") or "mistral"
        if inner not in _TEXT_FAMILIES:
            raise EstimatorInputError(
                text.field("model_type"), f"unsupported text model {inner!r} in mistral3"
            )
        family = _TEXT_FAMILIES[inner]
    return ConfigReader({**text.data, "tie_word_embeddings": tied}, text.path), family


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
    if model_type in COMPOSITES:
        text, family = _composite(root, model_type)
    else:
        text, family = root, model_type  # _TEXT_FAMILIES maps a composite's inner types
    spec = _BUILDERS[family](text, family)
    if model_type in COMPOSITES:
        assert spec.hidden is not None
        extras = tuple(vision_tower(model_type, root, spec.hidden)) + spec.extras
        kind = spec.model_type if model_type in ("gemma3", "qwen3_5") else model_type
        spec = replace(spec, extras=extras, model_type=kind, layers_module=_LAYERS[model_type])
    elif model_type == "gpt2":
        spec = replace(spec, layers_module="transformer.h")
    spec = replace(spec, config_model_type=model_type)
    stored = stored_quantization(root)
    if stored is not None:
        spec = replace(
            spec,
            stored_quantization=stored[0],
            stored_double_quant=stored[1],
            notes=(*spec.notes, stored[2]),
        )
    return _renamed(spec, name or root.text("_name_or_path") or text.text("_name_or_path"))


def stored_quantization(root: ConfigReader) -> tuple[str, bool, str] | None:
    """(base, double quant, a note) of a checkpoint bitsandbytes stored quantized: its
    config.json `quantization_config` as transformers 5.25.0 writes a `BitsAndBytesConfig`
    (utils/quantization_config.py:440-454: `quant_method` "bitsandbytes", `load_in_4bit` /
    `load_in_8bit`, `bnb_4bit_use_double_quant` default False). Such a checkpoint loads as it
    is stored whatever the training asks (quantizers/auto.py:244-247: "The
    `quantization_config` from the model will be used"). Other methods (mxfp4: the MoE readers;
    fp8, GPTQ, AWQ) are not read here."""
    quant = root.nested("quantization_config")
    if quant is None or quant.text("quant_method", "bitsandbytes") != "bitsandbytes":
        return None
    four, eight = quant.flag("load_in_4bit", False), quant.flag("load_in_8bit", False)
    if not four and not eight:
        return None
    if four:
        double = quant.flag("bnb_4bit_use_double_quant", False)
        kind = quant.text("bnb_4bit_quant_type", "fp4")
        note = f"checkpoint stored in 4 bits by bitsandbytes ({kind}{', double quant' * double})"
        return "nf4", double, note  # nf4 and fp4: 4 bits + one absmax per 64 (dtypes.py)
    return "int8", False, "checkpoint stored in 8 bits by bitsandbytes (LLM.int8)"


def _renamed(spec: ModelSpec, name: str | None) -> ModelSpec:
    return replace(spec, name=name) if name else spec
