"""The recommendation view: fitting options first, cheapest first; otherwise the longest that
fits and what the data loses there."""

from __future__ import annotations

from pathlib import Path

from estimator.document import recommend_document
from estimator.request import RecommendRequest
from estimator.solvers import Budget, peak_bytes
from estimator.time.tokens import read_lengths
from tests.estimator.seed_case import SEED_TARGETS

LENGTHS = read_lengths(Path(__file__).parents[1] / "data" / "lengths" / "seed000_lengths.csv")
TARGETS = SEED_TARGETS
PRICES = {"a100-80gb": 2.5, "rtx-pro-6000": 2.75, "h200": 5.0}


def _doc(profile: str) -> dict:
    return recommend_document(
        RecommendRequest.model_validate(
            {
                "model": {"preset": "qwen3.5-27b"},
                "setup": {"method": "lora", "lora_targets": TARGETS, "optimizer": "adamw-8bit"},
                "gpus": list(PRICES),
                "dataset_lengths": LENGTHS,
                "prices": PRICES,
                "profile": profile,
            }
        )
    )


def test_required_length_is_the_longest_sample() -> None:
    assert _doc("default")["required_seq_len"] == max(LENGTHS)


def test_fitting_options_come_first_and_cheapest_first() -> None:
    rows = _doc("seed-000")["rows"]
    statuses = [r["status"] for r in rows]
    assert statuses == sorted(statuses, key=["fits", "shorter", "no"].index)
    fitting = [r["cost"]["usd"] for r in rows if r["status"] == "fits"]
    assert fitting == sorted(fitting)


def test_shorter_rows_fit_at_their_length_and_report_dropped_samples() -> None:
    from estimator.architectures import spec_from_config
    from estimator.presets import preset_config
    from estimator.profile import load_profile
    from estimator.setup import TrainingSetup
    from gpu_catalog import get_gpu

    spec = spec_from_config(preset_config("qwen3.5-27b"))
    for row in _doc("default")["rows"]:
        if row["status"] != "shorter":
            continue
        setup = TrainingSetup(
            method="lora",
            lora_targets=TARGETS,
            optimizer="adamw-8bit",
            checkpointing=row["checkpointing"],
            loss=row["loss"],
        )
        budget = Budget(get_gpu(row["gpu"]).capacity_bytes)
        assert (
            peak_bytes(spec, setup, row["seq_len"], 1, load_profile("default"))
            <= budget.usable_bytes
        )
        assert row["dataset"]["dropped"] == sum(1 for n in LENGTHS if n > row["seq_len"])
