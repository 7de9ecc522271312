"""The hf stack's chunked loss against TRL's own SFTTrainer step (fake trace), per component.

The probe runs TRL 1.16's `SFTTrainer` with its fused LM head (probe/trl_stack.py, with CUDA's
paths off CUDA); the estimator models that kernel from its source (estimator/memory/logits.py
`trl_logprob_bytes`). Before, the hf stack modelled TRL v1.9.0's chunked_nll (256-token chunks
of fp32 logits and an fp32 copy of the head): on these steps +60.2 % (LoRA), +9.2 % (AMP full
fine-tuning), -1.7 % (batch 2), -43.3 % at 5000 tokens (one 4096-position tile outweighs
v1.9's chunks), +41.7 % on QLoRA (fp32 adapters too). The model has a 32768-token
vocabulary, so TRL's tile (32768 columns whatever the vocabulary) is the trace's one vocab-wide
tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("trl")

from estimator.document import compare_memtest  # noqa: E402
from probe import run_probe  # noqa: E402
from probe.options import ProbeInputError  # noqa: E402

CONFIG = json.loads(
    (Path(__file__).resolve().parents[2] / "bench" / "configs" / "small-llama.json").read_text()
)
VOCAB = 32768
BASE = {"stack": "hf", "method": "lora", "lora_rank": 8, "checkpointing": "gpu", "loss": "chunked"}


def _row(change: dict, seq: int) -> tuple[dict, dict]:
    doc = run_probe({**CONFIG, "vocab_size": VOCAB}, {**BASE, **change}, [seq], 2, "fake")
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    assert any("SFTTrainer" in line for line in doc["environment"]["ran"])
    return res, compare_memtest(doc, "default")["rows"][0]


@pytest.mark.parametrize(
    "change, seq",
    [({}, 1024), ({"method": "full"}, 1024), ({"batch": 2}, 1024), ({}, 5000)],
    ids=["lora", "full-amp", "lora-batch-2", "lora-two-token-tiles"],
)
def test_peak_and_the_tile_match_the_sft_trainer_step(change: dict, seq: int) -> None:
    res, row = _row(change, seq)
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    # TRL's tile: min(positions, 4096) x 32768 in bf16 (autocast), the loss's vocab-wide bytes
    positions = (change.get("batch", 1)) * (seq - 1)
    tile = min(positions, 4096) * VOCAB * 2
    assert res["component_maxima"]["logits"] == tile
    assert row["estimated_loss_logits"] == tile
    if change.get("method") == "full":
        return  # the loss moment's fp32 head-tile casts set the activations' maximum there
    # and the layers' share, as for transformers' own Trainer (test_activation_accuracy.py)
    comps = row["estimated_components"]
    measured = res["component_maxima"]["activations"]
    estimated = comps["checkpoints"] + comps["recompute_peak"]
    assert abs(estimated - measured) / measured <= 0.03, (estimated, measured)


def test_qlora_under_sft_trainer_trains_bf16_adapters_as_estimated() -> None:
    """SFTTrainer casts a quantized model's adapters to bf16 (trl 1.16.0 sft_trainer.py:908-911;
    the hf stack's `quantized_adapter_dtype`): fp32 adapters over-counted their gradients and
    AdamW states twice. bitsandbytes quantizes real weights: on the CPU."""
    pytest.importorskip("bitsandbytes")
    config = {**CONFIG, "vocab_size": VOCAB}
    doc = run_probe(config, {**BASE, "method": "qlora"}, [1024], 2, "cpu")
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    assert doc["setup"]["adapter_dtype"] == "bf16"
    row = compare_memtest(doc, "default")["rows"][0]
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    # gradients and fused AdamW's two moments of the bf16 adapters: 6 bytes per parameter
    trainable = doc["model"]["params_trainable"]
    assert 6 * trainable <= res["component_maxima"]["trainable_states"] < 7 * trainable


def test_every_length_trains_as_a_fresh_run_would() -> None:
    """The probe builds a trainer per length on one model; accelerate marks a model prepared
    and did not wrap the second trainer's fused forward in autocast (fp32 tile, -35 % in the
    accuracy grid's full fine-tuning rows at the second length). probe/trl_stack.py
    `_restore_forward` hands each trainer the model as a one-trainer run has it."""
    setup = {**BASE, "method": "full"}
    two = run_probe(CONFIG, setup, [256, 1024], 2, "fake")["results"][1]
    one = run_probe(CONFIG, setup, [1024], 2, "fake")["results"][0]
    assert two["peak_allocated_bytes"] == one["peak_allocated_bytes"]


def test_the_probe_says_what_it_substituted_for_cuda() -> None:
    doc = run_probe({**CONFIG, "vocab_size": 4096}, BASE, [256], 1, "fake")
    substituted = " ".join(doc["environment"]["substituted"])
    assert "Triton tile kernels" in substituted and "hidden_states[mask]" in substituted
    assert "causal-mask skip" in substituted


def test_a_loss_chunk_trl_cannot_take_is_refused_naming_the_field() -> None:
    with pytest.raises(ProbeInputError) as err:
        run_probe(CONFIG, {**BASE, "loss_chunk": 256}, [256], 1, "fake")
    assert err.value.field == "setup.loss_chunk"
