"""Malformed configs of the new families: exit code 2 naming the field, never a traceback."""

from __future__ import annotations

import json
from typing import Any

import pytest

from estimator.presets import preset_config
from trainfit.cli import main

DEEPSEEK = preset_config("deepseek-v3")
GPT_OSS = preset_config("gpt-oss-20b")
QWEN_VL = preset_config("qwen2.5-vl-7b")
LLAMA4 = {
    "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text",
        "hidden_size": 64,
        "intermediate_size": 32,
        "intermediate_size_mlp": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 300,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "attention_chunk_size": 32,
    },
}
MISTRAL3 = {
    "model_type": "mistral3",
    "text_config": {
        "model_type": "mistral",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
    },
    "vision_config": {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "patch_size": 14,
    },
}
GEMMA3 = {
    "model_type": "gemma3",
    "text_config": {**MISTRAL3["text_config"], "model_type": "gemma3_text", "head_dim": 16},
    "vision_config": {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "image_size": 64,
        "patch_size": 16,
    },
}


def _with(base: dict, path: str, value: Any) -> dict:
    """A deep copy of `base` with the dotted `path` set (`...` removes it)."""
    out = json.loads(json.dumps(base))
    node = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key]
    if value is ...:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return out


CASES = [
    ("mla rank as text", _with(DEEPSEEK, "kv_lora_rank", "512"), "config.kv_lora_rank"),
    ("mla missing v dim", _with(DEEPSEEK, "v_head_dim", ...), "config.v_head_dim"),
    (
        "top-k above experts",
        _with(DEEPSEEK, "num_experts_per_tok", 300),
        "config.num_experts_per_tok",
    ),
    ("no routed experts", _with(DEEPSEEK, "n_routed_experts", ...), "config.n_routed_experts"),
    (
        "negative dense",
        _with(DEEPSEEK, "first_k_dense_replace", -1),
        "config.first_k_dense_replace",
    ),
    ("unknown layer type", _with(GPT_OSS, "layer_types", ["chunky"] * 24), "config.layer_types[0]"),
    (
        "quantization not object",
        _with(GPT_OSS, "quantization_config", "mxfp4"),
        "config.quantization_config",
    ),
    ("zero sliding window", _with(GPT_OSS, "sliding_window", 0), "config.sliding_window"),
    (
        "llama4 rope list length",
        _with(LLAMA4, "text_config.no_rope_layers", [1, 0]),
        "config.text_config.no_rope_layers",
    ),
    (
        "llama4 moe layers",
        _with(LLAMA4, "text_config.moe_layers", ["a"]),
        "config.text_config.moe_layers",
    ),
    (
        "llama4 zero chunk",
        _with(LLAMA4, "text_config.attention_chunk_size", 0),
        "config.text_config.attention_chunk_size",
    ),
    (
        "vision depth as text",
        _with(QWEN_VL, "vision_config.depth", "32"),
        "config.vision_config.depth",
    ),
    ("vision config a list", _with(QWEN_VL, "vision_config", [1]), "config.vision_config"),
    ("flat config without hidden", _with(QWEN_VL, "hidden_size", ...), "config.text_config"),
    (
        "mistral3 text model",
        _with(MISTRAL3, "text_config.model_type", "gpt2"),
        "config.text_config.model_type",
    ),
    (
        "pixtral missing hidden",
        _with(MISTRAL3, "vision_config.hidden_size", ...),
        "config.vision_config.hidden_size",
    ),
    (
        "siglip image below patch",
        _with(GEMMA3, "vision_config.image_size", 8),
        "config.vision_config.image_size",
    ),
    ("text_config not object", _with(GEMMA3, "text_config", 3), "config.text_config"),
]


@pytest.mark.parametrize("name,config,field", CASES, ids=[c[0] for c in CASES])
def test_bad_new_family_config_exits_2_naming_the_field(tmp_path, capsys, name, config, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["estimate", "--model", str(path), "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainfit: error: ") and field in err
    assert "Traceback" not in err


def test_unknown_model_type_lists_the_new_families(tmp_path, capsys) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DEEPSEEK, "model_type": "deepseek_v4_unknown"}))
    assert main(["estimate", "--model", str(path), "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    for family in ("deepseek_v3", "gpt_oss", "llama4", "qwen2_5_vl", "olmo3", "glm4", "smollm3"):
        assert family in err


@pytest.mark.parametrize(
    "preset",
    ["deepseek-v3", "gpt-oss-20b", "olmo2-7b", "qwen2.5-vl-7b", "gemma-3-27b", "llama-4-scout"],
)
def test_new_presets_estimate_end_to_end(capsys, preset: str) -> None:
    # Llama 4: all-linear adapts its router, which peft cannot run (estimator.lora.TUPLE_LINEARS)
    targets = ["--lora-targets", "q_proj,k_proj,v_proj,o_proj"] if "llama-4" in preset else []
    code = main(
        ["estimate", "--model", preset, "--gpu", "h200", "--method", "lora", "--format", "json"]
        + targets
    )
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert doc["model"]["params_total"] == doc["model"]["params_total"] > 0
