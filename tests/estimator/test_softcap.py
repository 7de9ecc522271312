"""Gemma 2's tanh softcapping of the attention scores and the final logits (transformers
5.25.0 models/gemma2/modeling_gemma2.py:195-198, :520-523): read from the config with the
config class's defaults, and the tensors tanh saves counted where transformers' forward runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

CONFIG = json.loads(
    (Path(__file__).parents[2] / "bench" / "configs" / "small-gemma2.json").read_text()
)
DEFAULT = load_profile("default")


def _spec(**changes: object):
    return spec_from_config({**CONFIG, **changes})


def test_gemma2_softcaps_by_default_and_a_null_turns_it_off() -> None:
    bare = {k: v for k, v in CONFIG.items() if "softcapping" not in k}
    on = spec_from_config(bare)  # Gemma2Config's defaults: 50.0 and 30.0
    assert (on.attn_softcap, on.logit_softcap) == (True, True)
    off = _spec(attn_logit_softcapping=None, final_logit_softcapping=None)
    assert (off.attn_softcap, off.logit_softcap) == (False, False)


def test_gemma3_does_not_softcap_unless_the_config_says_so() -> None:
    gemma3 = {**CONFIG, "model_type": "gemma3_text"}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        gemma3.pop(key)
    spec = spec_from_config(gemma3)
    assert (spec.attn_softcap, spec.logit_softcap) == (False, False)
    assert spec_from_config({**gemma3, "final_logit_softcapping": 30.0}).logit_softcap


@pytest.mark.parametrize("key", ["attn_logit_softcapping", "final_logit_softcapping"])
@pytest.mark.parametrize("value", ["30", -1.0, True])
def test_a_bad_softcapping_value_names_the_field(key: str, value: object) -> None:
    with pytest.raises(EstimatorInputError) as err:
        _spec(**{key: value})
    assert err.value.field == f"config.{key}"


def _logits(spec, loss: str, stack: str = "hf", seq: int = 1024) -> float:
    setup = TrainingSetup(method="lora", loss=loss, stack=stack)
    mem = memory_breakdown(spec, setup, [seq], 1, DEFAULT)
    return float(mem.components["logits"][0])


def test_the_full_loss_holds_the_softcaps_tanh_output_in_bf16() -> None:
    on, off = _spec(), _spec(final_logit_softcapping=None)
    seq = 1024
    # one bf16 logits-sized tensor more through the loss's forward and backward
    assert _logits(on, "full") - _logits(off, "full") == seq * CONFIG["vocab_size"] * 2
    # TRL 1.16's fused LM head softcaps inside its tile kernel (trl/kernels/chunked_logprob.py
    # `_transform`): nothing more is kept
    assert _logits(on, "chunked") == _logits(off, "chunked")
    # the fused losses make their own logits from the hidden states
    assert _logits(on, "liger") == _logits(off, "liger")
    # torchtune's modules are not transformers' forward
    assert _logits(on, "chunked", "torchtune") == _logits(off, "chunked", "torchtune")


def test_eager_attention_keeps_the_tanh_output_of_every_layer() -> None:
    on, off = _spec(), _spec(attn_logit_softcapping=None)
    seq = 1024
    setup = TrainingSetup(method="lora", checkpointing="none", loss="full")
    both = [memory_breakdown(s, setup, [seq], 1, DEFAULT) for s in (on, off)]
    added = float(both[0].components["checkpoints"][0] - both[1].components["checkpoints"][0])
    # tanh's bf16 output, (batch, heads, seq, seq), saved in each of the layers
    assert added == CONFIG["num_hidden_layers"] * CONFIG["num_attention_heads"] * seq * seq * 2


def test_the_model_notes_say_what_softcapping_adds() -> None:
    notes = " ".join(_spec().notes)
    assert "attn_logit_softcapping" in notes and "final_logit_softcapping" in notes
    assert not _spec(attn_logit_softcapping=None, final_logit_softcapping=None).notes
