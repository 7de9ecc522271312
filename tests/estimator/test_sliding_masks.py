"""The attention masks a sliding window makes transformers and torch's SDPA build."""

from __future__ import annotations

import json
from pathlib import Path

from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

DEFAULT = load_profile("default")


def test_sdpa_keeps_an_additive_copy_of_the_sliding_mask_per_layer() -> None:
    """A sliding window no longer than the sequence: transformers' boolean (1, 1, s, s) mask
    (masking_utils.py:286, `>=`) and, per layer that gets it, SDPA's copy in the query's dtype
    (attention.cpp `convert_boolean_attn_mask`), saved by the efficient kernel."""
    config = json.loads(
        (Path(__file__).parents[2] / "bench" / "configs" / "small-gemma3.json").read_text()
    )
    window = config["sliding_window"]
    sliding, wide = spec_from_config(config), spec_from_config({**config, "sliding_window": 10**6})
    sliding_layers = sliding.count_layers("sliding_attention")
    assert sliding_layers == config["num_hidden_layers"]
    for checkpointing, copies in (("none", sliding_layers), ("gpu", 1)):
        setup = TrainingSetup(method="lora", checkpointing=checkpointing)
        for seq, expected in ((window - 1, 0), (window, 1), (4 * window, 1)):
            a, b = (memory_breakdown(s, setup, [seq], 1, DEFAULT) for s in (sliding, wide))
            added = sum(
                float(a.components[k][0] - b.components[k][0])
                for k in ("checkpoints", "recompute_peak")
            )
            # the boolean mask (1 B) and the bf16 copies (2 B), each seq x seq
            assert added == expected * seq * seq * (1 + 2 * copies), (checkpointing, seq)
