"""LoRA trainable counts against peft itself (models on the meta device)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.lora import lora_params
from estimator.setup import TrainingSetup
from tests.estimator.seed_case import SEED_TARGETS
from tests.estimator.test_architectures import TINY

CONFIGS = Path(__file__).parents[1] / "data" / "reference_configs"


def test_seed_model_r16_trainables_match_peft_count() -> None:
    spec = spec_from_config(json.loads((CONFIGS / "qwen3.5-27b.json").read_text()))
    setup = TrainingSetup(method="lora", lora_rank=16, lora_targets=SEED_TARGETS)
    assert lora_params(spec, setup) == 108_789_760


def peft_model(model_type: str, rank: int, **lora: Any) -> Any:
    """peft's own LoRA model of the tiny `model_type` (meta device), LoraConfig(r=rank, **lora)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    config = transformers.CONFIG_MAPPING[model_type](**TINY[model_type])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
        return peft.get_peft_model(model, peft.LoraConfig(r=rank, **lora))


def _peft_trainable(model_type: str, targets: list[str] | str, rank: int) -> int:
    wrapped = peft_model(model_type, rank, target_modules=targets)
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    "model_type",
    ["llama", "qwen3", "phi3", "gemma2", "mistral", "qwen2", "qwen3_moe", "mixtral", "qwen3_next"],
)
def test_all_linear_matches_peft(model_type: str) -> None:
    import transformers

    spec = spec_from_config(transformers.CONFIG_MAPPING[model_type](**TINY[model_type]).to_dict())
    setup = TrainingSetup(method="lora", lora_rank=4, lora_targets=["all-linear"])
    assert lora_params(spec, setup) == _peft_trainable(model_type, "all-linear", 4)


def test_named_targets_match_peft() -> None:
    import transformers

    spec = spec_from_config(transformers.CONFIG_MAPPING["llama"](**TINY["llama"]).to_dict())
    setup = TrainingSetup(
        method="lora", lora_rank=8, lora_targets=["q_proj", "v_proj", "down_proj"]
    )
    assert lora_params(spec, setup) == _peft_trainable(
        "llama", ["q_proj", "v_proj", "down_proj"], 8
    )


def test_unknown_target_is_an_error_naming_the_field() -> None:
    spec = spec_from_config(json.loads((CONFIGS / "meta-llama_Llama-3.1-8B.json").read_text()))
    with pytest.raises(EstimatorInputError) as err:
        lora_params(spec, TrainingSetup(method="lora", lora_targets=["in_proj_qkv"]))
    assert err.value.field == "setup.lora_targets"


def test_rank_above_every_target_size_is_rejected() -> None:
    spec = spec_from_config(json.loads((CONFIGS / "openai-community_gpt2.json").read_text()))
    with pytest.raises(EstimatorInputError) as err:
        lora_params(spec, TrainingSetup(method="lora", lora_rank=5000, lora_targets=["c_attn"]))
    assert err.value.field == "setup.lora_rank"
