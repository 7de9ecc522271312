"""Unsloth's fused loss sizes its chunks by the card (estimator/memory/model.py `on_card`):
min(4 GiB, half the memory free at its first call) of fp32 logits per chunk (unsloth_zoo
ce232d6c fused_losses/cross_entropy_loss.py:139-149). The estimate, the solvers and the sweeps
take each card's figure, and agree with one another on it."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.architectures import spec_from_config
from estimator.document import estimate
from estimator.dtypes import FP32
from estimator.memory import memory_breakdown
from estimator.memory.model import (
    _fixed,
    card_loss_target,
    loss_depends_on_card,
    memory_on_card,
)
from estimator.memory.workspaces import workspace_bytes
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.request import EstimateRequest
from estimator.setup import TrainingSetup
from estimator.solvers import Budget, max_seq
from estimator.sweep import sweep, sweep_full

GIB = 2**30
LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
DEFAULT = load_profile("default")
UNSLOTH = {
    "method": "qlora",
    "lora_rank": 32,
    "lora_targets": ["all-linear"],
    "stack": "unsloth",
    "checkpointing": "offload",
}
SMALL = 10 * GIB  # leaves less than 8 GiB free after the 8B model's NF4 weights


def _setup(**changes: object) -> TrainingSetup:
    return TrainingSetup.model_validate({**UNSLOTH, **changes})


def _free_before_any_batch(setup: TrainingSetup, card: float) -> float:
    """The card less what exists before the first batch, from the breakdown's own figures:
    the weights, the adapters' fp32 weights, the CUDA context, cuBLAS's workspaces."""
    mem = memory_breakdown(LLAMA8B, setup, [256], 1, DEFAULT)
    assert mem.states is not None
    weights = float(mem.components["weights"][0])
    context = float(mem.components["overhead"][0])
    adapters = mem.states.weights + mem.states.masters
    return card - weights - adapters - context - workspace_bytes(DEFAULT)


def test_only_unsloths_own_loss_depends_on_the_card() -> None:
    assert loss_depends_on_card(_setup())
    assert not loss_depends_on_card(_setup(loss="full"))
    assert not loss_depends_on_card(_setup(stack="hf", loss="unsloth"))
    assert not loss_depends_on_card(TrainingSetup.model_validate({"method": "qlora"}))


def test_the_target_is_half_the_memory_free_before_any_batch() -> None:
    setup = _setup()
    free = _free_before_any_batch(setup, SMALL)
    assert 0 < free < 8 * GIB
    target = card_loss_target(LLAMA8B, setup, DEFAULT, 1, SMALL)
    assert target == pytest.approx(free / 2, rel=1e-12)


def test_a_card_with_8_gib_free_or_more_keeps_the_4_gib_cap() -> None:
    setup = _setup()
    for card in (24 * GIB, 80 * GIB):
        assert _free_before_any_batch(setup, card) >= 8 * GIB
        assert card_loss_target(LLAMA8B, setup, DEFAULT, 1, card) is None
        on_card = memory_on_card(LLAMA8B, setup, [65536], 1, DEFAULT, None, card)
        free = memory_breakdown(LLAMA8B, setup, [65536], 1, DEFAULT)
        assert float(on_card.peak[0]) == float(free.peak[0])


def test_a_smaller_target_shrinks_the_loss_by_the_chunk_it_no_longer_holds() -> None:
    setup, seq = _setup(), 32768  # long enough that both chunks are capped by their target
    target = card_loss_target(LLAMA8B, setup, DEFAULT, 1, SMALL)
    assert target is not None
    f = _fixed(LLAMA8B, setup, DEFAULT, 1, False)
    vocab, hidden = LLAMA8B.vocab, LLAMA8B.hidden
    assert vocab and hidden
    positions_saved = (4 * GIB - target) / (vocab * FP32)
    per_position = vocab * f.logit_dtype + 3 * FP32 + hidden * f.stream
    free = memory_breakdown(LLAMA8B, setup, [seq], 1, DEFAULT)
    on_card = memory_on_card(LLAMA8B, setup, [seq], 1, DEFAULT, None, SMALL)
    saved = float(free.components["logits"][0]) - float(on_card.components["logits"][0])
    assert saved == pytest.approx(positions_saved * per_position, rel=1e-9)
    assert float(on_card.peak[0]) <= float(free.peak[0])


def test_a_card_the_weights_fill_keeps_the_figure_without_a_card() -> None:
    setup = _setup()
    card = 4 * GIB  # less than the NF4 weights: Unsloth raises, the run cannot start
    assert _free_before_any_batch(setup, card) < 0
    assert card_loss_target(LLAMA8B, setup, DEFAULT, 1, card) is None


def test_peaks_grow_with_the_card_and_verdicts_never_get_worse() -> None:
    setup, seqs = _setup(), [2048, 8192, 20000]
    caps = [c * GIB for c in (8, 9, 10, 11, 12, 14, 16, 24)]
    result = sweep(LLAMA8B, setup, seqs, [1], caps, DEFAULT)
    peaks = result.peak_on_card[:, 0, :]
    assert (np.diff(peaks, axis=1) >= 0).all()
    assert (np.diff(result.verdict[:, 0, :], axis=1) <= 0).all()
    assert (peaks <= result.peak[:, 0, None]).all()
    assert (peaks[:, 0] < result.peak[:, 0]).all()  # the small cards do change
    assert result.memory_evaluations > result.peak.size  # one more per distinct target


def test_estimate_max_seq_and_the_sweeps_agree_on_a_small_card() -> None:
    setup = _setup()
    answer = max_seq(LLAMA8B, setup, Budget(12 * GIB), DEFAULT)
    longest = answer["seq_len"]
    assert longest is not None
    seqs = [longest, longest + 256]
    doc = estimate(
        EstimateRequest.model_validate(
            {
                "model": {"preset": "llama-3.1-8b"},
                "setup": UNSLOTH,
                "seq_lens": seqs,
                "gpus": ["12gib", "h100-80gb"],
            }
        )
    )
    fits = [row["fit"]["12gib"] for row in doc["rows"]]
    assert [f["verdict"] == "fits" for f in fits] == [True, False]
    # the same bytes: the document rounds up, the solver's answer down
    assert fits[0]["peak_bytes"] - answer["peak_bytes"] in (0, 1)
    assert fits[1]["peak_bytes"] - answer["next_peak_bytes"] in (0, 1)
    assert fits[0]["peak_bytes"] < doc["rows"][0]["peak_bytes"]  # the card's own figure
    assert "components" in fits[0] and "components" not in doc["rows"][0]["fit"]["h100-80gb"]
    assert sum(fits[0]["components"].values()) != sum(doc["rows"][0]["components"].values())
    full = sweep_full(LLAMA8B, setup, seqs, [1], ["12gib", "h100-80gb"], DEFAULT)
    assert [int(np.ceil(p)) for p in full.peak[:, 0, 0]] == [f["peak_bytes"] for f in fits]
    bare = sweep(LLAMA8B, setup, seqs, [1], [12 * GIB], DEFAULT)
    assert bare.verdict[:, 0, 0].tolist() == full.verdict[:, 0, 0].tolist()


def test_a_memtest_is_compared_with_the_figure_of_the_card_it_ran_on() -> None:
    import copy
    import json
    from pathlib import Path

    from estimator.compare import compare

    path = Path(__file__).parents[1] / "data" / "memtests"
    doc = json.loads((path / "memtest_h200_2026-12-04_hf-llama-qlora.json").read_text())
    doc["setup"].update(UNSLOTH, loss="unsloth", attention="sdpa")
    doc["results"] = [dict(doc["results"][-1], seq_len=32768)]

    def estimated(env: dict[str, object]) -> int:
        run = copy.deepcopy(doc)
        run["environment"].update(env)
        return int(compare(run)["rows"][0]["estimated_components"]["logits"])

    big = estimated({})  # the loss on the H200: 4 GiB chunks, as without a card
    assert estimated({"total_memory_bytes": SMALL}) < big
    assert estimated({"device": "cpu", "total_memory_bytes": SMALL}) == big
