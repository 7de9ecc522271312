"""Named models: published config.json files shipped with the package (from shared/reference)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from estimator.errors import EstimatorInputError

# the package's data folder (a path, not importlib.resources: its import is ~5 ms of a CLI run)
PRESETS_DIR = Path(__file__).with_name("presets")

PRESET_SOURCES = {
    "qwen3.5-27b": "config.json of a Qwen3.5-27B-architecture checkpoint (model_type qwen3_5)",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B config.json",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B config.json",
    "qwen3-8b": "Qwen/Qwen3-8B config.json",
    "qwen3-32b": "Qwen/Qwen3-32B config.json",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B config.json",
    "mistral-7b": "mistralai/Mistral-7B-v0.1 config.json",
    "gpt2": "openai-community/gpt2 config.json",
    "tinyllama-1.1b": "TinyLlama/TinyLlama-1.1B-Chat-v1.0 config.json",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3 config.json (FP8 checkpoint; 671B + 14B MTP)",
    "gpt-oss-20b": "openai/gpt-oss-20b config.json (MXFP4 expert banks)",
    "olmo2-7b": "allenai/OLMo-2-1124-7B config.json",
    "qwen2.5-vl-7b": "Qwen/Qwen2.5-VL-7B-Instruct config.json (vision tower in extras)",
    "gemma-3-27b": "google/gemma-3-27b-it config.json (vision tower in extras)",
    "llama-4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct config.json (vision in extras)",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B config.json",
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B config.json",
    "qwen2.5-3b": "Qwen/Qwen2.5-3B config.json",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B config.json",
    "qwen2.5-14b": "Qwen/Qwen2.5-14B config.json",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B config.json",
    "qwen3-4b": "Qwen/Qwen3-4B config.json",
    "qwen3-14b": "Qwen/Qwen3-14B config.json",
    "glm-4.5-air": (
        "zai-org/GLM-4.5-Air config.json, its fields as transformers 4.54.1 printed them "
        "(106,852,245,504 parameters = transformers 5.25.0; the MTP layer it skips not counted)"
    ),
}


# Presets not copied from shared/reference: where their config.json was read (public
# transcriptions of the Hub files; each preset's parameter count equals the Hub's safetensors
# total, tests/estimator/test_presets_transcribed.py)
PRESET_TRANSCRIBED = {
    "llama-3.2-1b": "github:kevinstephano/thunder_model_blocks hf_llama/llama_config.py "
    "(LLAMA_3_2_1B_CFG, the Instruct repo's config; the same architecture fields)",
    **dict.fromkeys(
        (
            "llama-3.2-3b",
            "qwen2.5-3b",
            "qwen2.5-7b",
            "qwen2.5-14b",
            "qwen2.5-32b",
            "qwen3-4b",
            "qwen3-14b",
        ),
        "github:citsjtu2020/LLM-Prof@8434c8d1 sglang/Model_Config.md (its Qwen3-8B, Qwen3-32B, "
        "Qwen3-30B-A3B and Llama-3.1-8B entries equal the presets from shared/reference)",
    ),
}


# other repos whose config.json has the preset's architecture fields, seen in the transcription
# read: the 1B preset was read from the Instruct repo's config (PRESET_TRANSCRIBED)
PRESET_ALSO_FOR = {"meta-llama/Llama-3.2-1B-Instruct": "llama-3.2-1b"}


def preset_ids() -> list[str]:
    return sorted(PRESET_SOURCES)


@cache
def _load(preset: str) -> str:
    return (PRESETS_DIR / f"{preset}.json").read_text()


def preset_config(preset: str) -> dict[str, Any]:
    key = preset.strip().lower()
    if key not in PRESET_SOURCES:
        raise EstimatorInputError(
            "model.preset", f"unknown preset {preset!r}; known: {', '.join(preset_ids())}"
        )
    config: dict[str, Any] = json.loads(_load(key))
    return config
