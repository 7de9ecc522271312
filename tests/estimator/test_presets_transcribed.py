"""Presets transcribed from public copies of the Hub's config.json files (estimator/presets.py
`PRESET_TRANSCRIBED`): each must build the model the Hub publishes. The parameter counts are
the Hub's `model.safetensors.index.json` `total_size` of each repo's bf16 weights, halved
(2 bytes per parameter); transformers on the meta device must agree with the estimator too.
A transcription error in any field that shapes a weight fails here."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.hub import preset_or_hub
from estimator.presets import PRESET_SOURCES, PRESET_TRANSCRIBED, preset_config

HUB_PARAMETERS = {
    "llama-3.2-1b": 1_235_814_400,  # total_size 2,471,628,800
    "llama-3.2-3b": 3_212_749_824,  # total_size 6,425,499,648
    "qwen2.5-3b": 3_085_938_688,  # total_size 6,171,877,376
    "qwen2.5-7b": 7_615_616_512,  # total_size 15,231,233,024
    "qwen2.5-14b": 14_770_033_664,  # total_size 29,540,067,328
    "qwen2.5-32b": 32_763_876_352,  # total_size 65,527,752,704
    "qwen3-4b": 4_022_468_096,  # total_size 8,044,936,192
    "qwen3-14b": 14_768_307_200,  # total_size 29,536,614,400
}


def test_every_transcribed_preset_has_a_published_count() -> None:
    assert set(PRESET_TRANSCRIBED) == set(HUB_PARAMETERS) <= set(PRESET_SOURCES)


@pytest.mark.parametrize("preset", sorted(HUB_PARAMETERS))
def test_transcribed_preset_is_the_published_model(preset: str) -> None:
    spec = spec_from_config(preset_config(preset))
    assert spec.params_total == HUB_PARAMETERS[preset]


@pytest.mark.parametrize("preset", sorted(HUB_PARAMETERS))
def test_transformers_builds_the_same_model(preset: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = preset_config(preset)
    config = transformers.CONFIG_MAPPING[raw["model_type"]].from_dict(raw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert spec_from_config(raw).params_total == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("preset", sorted(HUB_PARAMETERS))
def test_the_hub_id_resolves_to_the_preset_without_the_network(preset: str) -> None:
    """A training config naming the repo (axolotl `base_model: Qwen/Qwen2.5-7B`) is priced
    from the shipped file, with no download."""
    repo = PRESET_SOURCES[preset].split(" ")[0]
    assert preset_or_hub(repo) == {"preset": preset}


def test_the_preset_list_says_where_a_transcribed_preset_was_read() -> None:
    """`trainfit presets` and `GET /v1/models` (estimator.document.list_presets) carry the
    transcription's provenance; presets copied from shared/reference have none."""
    from estimator.document import list_presets

    listed = {p["id"]: p for p in list_presets()}
    assert listed["qwen2.5-7b"]["transcribed_from"] == PRESET_TRANSCRIBED["qwen2.5-7b"]
    assert "citsjtu2020/LLM-Prof" in listed["qwen2.5-7b"]["transcribed_from"]
    assert listed["llama-3.1-8b"]["transcribed_from"] is None


def test_the_instruct_repo_the_1b_preset_was_read_from_resolves_to_it() -> None:
    """The 1B transcription is of meta-llama/Llama-3.2-1B-Instruct's config.json (the same
    architecture fields as the base repo's): a config naming either is priced offline."""
    assert preset_or_hub("meta-llama/Llama-3.2-1B-Instruct") == {"preset": "llama-3.2-1b"}
    assert preset_or_hub("meta-llama/Llama-3.2-3B-Instruct") == {
        "hub": "meta-llama/Llama-3.2-3B-Instruct"
    }
