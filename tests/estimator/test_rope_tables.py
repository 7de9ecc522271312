"""Rotary cos/sin tables made once per forward by transformers' RotaryEmbedding
(estimator/memory/activations.py `rope_table_bytes`, ModelSpec.rope_width)."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.memory.activations import rope_table_bytes
from estimator.presets import preset_config
from estimator.setup import TrainingSetup


@pytest.mark.parametrize(
    "preset, width",
    [
        ("llama-3.1-8b", 128),  # head_dim
        ("qwen3.5-27b", 64),  # head_dim 256 x partial_rotary_factor 0.25
        ("deepseek-v3", 64),  # qk_rope_head_dim
        ("gpt-oss-20b", 32),  # half-width tables (emb = freqs)
        ("gemma-3-27b", 256),  # one pair per layer type, sliding and full
        ("gpt2", 0),  # learned positions
    ],
)
def test_rope_width_follows_each_models_rotary_embedding(preset: str, width: int) -> None:
    assert spec_from_config(preset_config(preset)).rope_width == width


def test_a_bad_partial_rotary_factor_names_the_field() -> None:
    config = {**preset_config("llama-3.1-8b"), "partial_rotary_factor": 1.5}
    with pytest.raises(EstimatorInputError, match="partial_rotary_factor"):
        spec_from_config(config)


def test_tables_are_two_seq_by_width_in_the_hidden_states_dtype() -> None:
    spec = spec_from_config(preset_config("llama-3.1-8b"))
    lora = TrainingSetup(method="lora")
    assert rope_table_bytes(spec, lora, 4096) == 2 * 4096 * 128 * 2
    amp = TrainingSetup(method="full", precision="mixed")  # fp32 embeddings under AMP
    assert rope_table_bytes(spec, amp, 4096) == 2 * 4096 * 128 * 4
    # torchtune slices its RoPE cache (a view); the probe stack predates the term
    for stack in ("torchtune", "probe"):
        assert rope_table_bytes(spec, lora.model_copy(update={"stack": stack}), 4096) == 0
