"""Parameter inventories against the reference table and against transformers itself
(models instantiated on the meta device: no memory, no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError

CONFIGS = Path(__file__).parents[1] / "data" / "reference_configs"

# shared/reference/configs/README.md: unique nn.Parameter elements transformers instantiates.
REFERENCE_COUNTS = {
    "meta-llama_Llama-3.1-8B.json": 8_030_261_248,
    "meta-llama_Llama-3.1-70B.json": 70_553_706_496,
    "Qwen_Qwen3-8B.json": 8_190_735_360,
    "Qwen_Qwen3-32B.json": 32_762_123_264,
    "Qwen_Qwen3-30B-A3B.json": 30_532_122_624,
    "mistralai_Mistral-7B-v0.1.json": 7_241_732_096,
    "openai-community_gpt2.json": 124_439_808,
    "TinyLlama_TinyLlama-1.1B-Chat-v1.0.json": 1_100_048_384,
    "qwen3.5-27b.json": 26_895_998_464,
}


@pytest.mark.parametrize("filename,expected", sorted(REFERENCE_COUNTS.items()))
def test_reference_config_counts_match_exactly(filename: str, expected: int) -> None:
    spec = spec_from_config(json.loads((CONFIGS / filename).read_text()))
    assert spec.params_total == expected


def test_moe_active_parameters_match_reference() -> None:
    spec = spec_from_config(json.loads((CONFIGS / "Qwen_Qwen3-30B-A3B.json").read_text()))
    assert spec.params_active == 3_353_032_704


def test_qwen3_5_extras_are_counted_separately() -> None:
    spec = spec_from_config(json.loads((CONFIGS / "qwen3.5-27b.json").read_text()))
    extras = {g.name: g.params for g in spec.extras}
    assert spec.params_total + extras["vision_tower"] == 27_356_728_560
    assert spec.params_total + sum(extras.values()) == 27_781_427_952
    assert spec.count_layers("linear_attention") == 48
    assert spec.count_layers("full_attention") == 16


TINY = {
    "llama": {
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
        "attention_bias": True,
    },
    "mistral": {
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
    },
    "qwen2": {
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
    },
    "qwen3": {
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 300,
    },
    "qwen3_moe": {
        "hidden_size": 64,
        "intermediate_size": 160,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 300,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "mlp_only_layers": [1],
    },
    "mixtral": {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "gemma2": {
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 300,
    },
    "gemma3_text": {
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 300,
    },
    "phi3": {
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
        "pad_token_id": 0,
    },
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 300, "n_positions": 128},
    "qwen3_next": {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 300,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "full_attention_interval": 2,
    },
}


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_inventory_equals_transformers_meta_model(model_type: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.CONFIG_MAPPING[model_type](**TINY[model_type])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in model.parameters())
    spec = spec_from_config(config.to_dict())
    assert spec.params_total == expected


def test_qwen3_5_text_model_equals_transformers() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = json.loads((CONFIGS / "qwen3.5-27b.json").read_text())
    small = json.loads(json.dumps(raw))
    text = small["text_config"]
    text.update(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        head_dim=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        vocab_size=300,
        layer_types=text["layer_types"][:4],
    )
    small["vision_config"].update(
        depth=2,
        hidden_size=32,
        intermediate_size=48,
        num_heads=2,
        out_hidden_size=64,
        num_position_embeddings=16,
    )
    config = transformers.CONFIG_MAPPING["qwen3_5"].from_dict(small)
    with torch.device("meta"):
        causal = transformers.AutoModelForCausalLM.from_config(config)
        full = transformers.Qwen3_5ForConditionalGeneration(config)
    spec = spec_from_config(small)
    extras = {g.name: g.params for g in spec.extras}
    assert spec.params_total == sum(p.numel() for p in causal.parameters())
    assert spec.params_total + extras["vision_tower"] == sum(p.numel() for p in full.parameters())


@pytest.mark.parametrize(
    "mutation,field",
    [
        ({"model_type": "bert"}, "config.model_type"),
        ({"num_hidden_layers": -1}, "config.num_hidden_layers"),
        ({"num_hidden_layers": 10**15}, "config.num_hidden_layers"),
        ({"hidden_size": "4096"}, "config.hidden_size"),
        ({"vocab_size": 1.5}, "config.vocab_size"),
        ({"num_attention_heads": None}, "config.num_attention_heads"),
    ],
)
def test_bad_config_names_the_field(mutation: dict, field: str) -> None:
    config = json.loads((CONFIGS / "meta-llama_Llama-3.1-8B.json").read_text())
    config.update(mutation)
    with pytest.raises(EstimatorInputError) as err:
        spec_from_config(config)
    assert err.value.field == field
