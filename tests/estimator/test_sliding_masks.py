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
            # the boolean mask (1 B) and the bf16 copies (2 B), each seq x seq; each masked
            # layer's K and V repeated to the query heads (bf16, per token)
            repeated = copies * seq * _repeat_kv_bytes(config)
            assert added == expected * (seq * seq * (1 + 2 * copies) + repeated), (
                checkpointing,
                seq,
            )


def _repeat_kv_bytes(config: dict[str, int]) -> int:
    """transformers' repeat_kv of K and V for a masked grouped-query SDPA call, bf16, per token
    (sdpa_attention.py `use_gqa_in_sdpa` needs no mask; estimator/memory/model.py
    `_masked_repeat_kv`)."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * 2 * (heads - kv_heads) * head_dim


def test_padded_rows_give_sdpa_a_mask_per_row_and_a_copy_per_layer() -> None:
    """Padding in the attention mask (TRL's collator pads to the batch's longest row, axolotl's
    to a multiple of 64): transformers builds a boolean (b, 1, s, s) mask at every length
    (masking_utils.py:292-293) and every layer's SDPA copies it in the query's dtype."""
    config = json.loads(
        (Path(__file__).parents[2] / "bench" / "configs" / "small-llama.json").read_text()
    )
    spec = spec_from_config(config)
    seq, batch = 512, 3
    for checkpointing, copies in (("none", config["num_hidden_layers"]), ("gpu", 1)):
        full = TrainingSetup(method="lora", checkpointing=checkpointing, batch=batch)
        padded = full.model_copy(update={"padded_batches": True})
        a, b = (memory_breakdown(spec, s, [seq], batch, DEFAULT) for s in (full, padded))
        added = sum(
            float(b.components[k][0] - a.components[k][0])
            for k in ("checkpoints", "recompute_peak")
        )
        repeated = copies * batch * seq * _repeat_kv_bytes(config)
        assert added == batch * seq * seq * (1 + 2 * copies) + repeated, checkpointing
    # flash attention takes padding as sequence lengths (no mask); eager masks are counted alike
    for attention in ("flash", "eager"):
        base = TrainingSetup(method="lora", batch=batch, attention=attention)
        padded = base.model_copy(update={"padded_batches": True})
        a, b = (memory_breakdown(spec, s, [seq], batch, DEFAULT) for s in (base, padded))
        assert float(a.peak[0]) == float(b.peak[0]), attention
