"""min-gpus and recommend search the layouts: the fewest cards, the cheapest and fastest
layout there, and why the rest fail."""

from __future__ import annotations

import pytest

from estimator.document import min_gpus_document, recommend_document
from estimator.request import RecommendRequest, SolverRequest
from trainfit.cli import main

FULL_8B = {"model": {"preset": "llama-3.1-8b"}, "setup": {"method": "full"}, "gpu": "h100"}


def test_min_gpus_is_the_first_count_where_some_layout_fits() -> None:
    doc = min_gpus_document(SolverRequest.model_validate({**FULL_8B, "seq_len": 4096}))
    assert doc["search"] and doc["gpus"] and doc["gpus"] > 1
    assert any(r["fits"] for r in doc["layouts"])
    fewer = doc["fewer"]
    assert fewer["gpus"] < doc["gpus"]
    assert not any(r["fits"] for r in fewer["layouts"])
    assert all(r["reason"] for r in fewer["layouts"])  # every rejection says why
    cheapest, fastest = doc["cheapest"], doc["fastest"]
    tps = [r["time"]["tokens_per_second"] for r in doc["layouts"] if r["fits"]]
    assert fastest["time"]["tokens_per_second"] == max(tps)
    assert cheapest["fits"]


def test_within_days_asks_for_enough_cards_to_finish_in_time() -> None:
    doc = min_gpus_document(
        SolverRequest.model_validate(
            {**FULL_8B, "seq_len": 4096, "tokens": 2e12, "within_days": 30}
        )
    )
    days = doc["fastest"]["time"]["wall_hours"] / 24
    assert days <= 30
    before = doc["fewer"]["fastest"]["time"]["wall_hours"] / 24
    assert before > 30
    assert doc["cheapest"]["cost"]["usd"] > 0


def test_70b_full_fine_tuning_fits_few_cards_only_by_offloading() -> None:
    doc = min_gpus_document(
        SolverRequest.model_validate(
            {
                "model": {"preset": "llama-3.1-70b"},
                "setup": {"method": "full"},
                "gpu": "h100",
                "seq_len": 4096,
            }
        )
    )
    assert doc["gpus"] < 16
    fitting = [r for r in doc["layouts"] if r["fits"]]
    assert fitting and all(r["offload"] != "none" for r in fitting)
    assert any("GiB per card" in r.get("reason", "") for r in doc["layouts"])


def test_lora_on_eight_cards_is_data_parallel_and_costs_what_one_card_costs() -> None:
    doc = recommend_document(
        RecommendRequest.model_validate(
            {
                "model": {"preset": "llama-3.1-8b"},
                "setup": {"method": "lora"},
                "gpus": ["h100", "8xh100"],
                "seq_len": 4096,
                "tokens": 1e9,
            }
        )
    )
    rows = {r["gpu"]: r for r in doc["rows"]}
    eight, one = rows["8xh100"], rows["h100"]
    assert eight["parallel"] in ("dp", "zero1=8", "zero2=8") or eight["parallel"].startswith("dp")
    assert eight["cost"]["usd"] == pytest.approx(one["cost"]["usd"], rel=0.05)
    assert eight["time"]["wall_hours"] < one["time"]["wall_hours"] / 7


def test_cli_min_gpus_prints_every_layout_with_days_and_dollars(capsys) -> None:
    code = main(
        [
            "min-gpus",
            "--model",
            "llama-3.1-8b",
            "--method",
            "full",
            "--seq",
            "4096",
            "--gpu",
            "h100",
            "--tokens",
            "2e12",
            "--within-days",
            "30",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "cheapest layout:" in out and "fastest layout:" in out
    assert "days" in out and "USD" in out and "fsdp" in out
