"""Cost: prices from the catalog or overrides, ranking, and seed 000's run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.profile import load_profile
from estimator.scenario import Scenario
from estimator.setup import TrainingSetup
from estimator.time.calibration import parse_calibrate_option
from estimator.time.cost import parse_price_option, rank_options
from estimator.time.plan import format_time_cost_table, row_time_and_cost, training_summary
from estimator.time.tokens import resolve_stages
from tests.estimator.seed_case import SEED_TARGETS

CONFIGS = Path(__file__).parents[2] / "data" / "configs"
SEED_PRICES = {"a100-80gb": 2.50, "rtx-pro-6000": 2.75, "h200": 5.0}  # seed 000's USD/hour
TARGETS = SEED_TARGETS


def _seed000():
    spec = spec_from_config(json.loads((CONFIGS / "qwen3.5-27b.json").read_text()))
    setup = TrainingSetup(
        method="lora",
        lora_rank=16,
        lora_targets=TARGETS,
        optimizer="adamw-8bit",
        checkpointing="offload",
        loss="chunked",
    )
    return spec, setup


def _rows(spec, setup, seq, tokens, profile, options, prices, fits=None):
    host = spec.layers * seq * spec.hidden * 2  # offloaded layer inputs, bf16
    return {
        g: row_time_and_cost(
            Scenario(spec, setup, profile, seq, 1, option=g, prices=prices),
            tokens=tokens,
            host_bytes=host,
            fits=(fits or {}).get(g, True),
        )
        for g in options
    }


def test_seed_000_run_priced_end_to_end_matches_the_seed() -> None:
    spec, setup = _seed000()
    stages = resolve_stages(
        [{"name": "stage 1", "tokens": 2.53e6}, {"name": "stage 2", "tokens": 1.28e6, "epochs": 3}],
        6750,
    )
    tokens = stages["tokens"]
    rows = _rows(
        spec, setup, 6750, tokens, load_profile("seed-000"), ["a100-80gb", "h200"], SEED_PRICES
    )
    summary = training_summary(
        Scenario(spec, setup, load_profile("seed-000"), 6750, 1), rows, tokens, stages=stages
    )
    a100, h200 = summary["options"]["a100-80gb"], summary["options"]["h200"]
    # seed 000: "A100 about 5.9 h (about 15 USD), H200 about 2.7 h (about 14 USD)"
    assert a100["wall_hours"] == pytest.approx(5.9, abs=0.1)
    assert a100["cost_usd"] == pytest.approx(15, abs=0.5)
    assert h200["wall_hours"] == pytest.approx(2.7, abs=0.1)
    assert h200["cost_usd"] == pytest.approx(14, abs=0.6)
    assert summary["by_cost"] == ["h200", "a100-80gb"]
    assert summary["by_time"] == ["h200", "a100-80gb"]
    table = format_time_cost_table(summary, "markdown")
    assert "| h200 | fits |" in table and "6.37 M tokens" in table


def test_ranking_leaves_out_options_that_do_not_fit() -> None:
    options = {
        "a": {"fits": True, "cost_usd": 30.0, "wall_hours": 1.0},
        "b": {"fits": True, "cost_usd": 10.0, "wall_hours": 5.0},
        "c": {"fits": False, "cost_usd": 1.0, "wall_hours": 0.1, "verdict": "tight"},
        "d": {"fits": True, "cost_usd": None, "wall_hours": 2.0},
    }
    ranked = rank_options(options)
    assert ranked["by_cost"] == ["b", "a", "d"]
    assert ranked["by_time"] == ["a", "d", "b"]
    assert ranked["not_fitting"] == [{"gpu": "c", "verdict": "tight"}]


def test_a_gpu_without_price_has_null_cost_and_says_how_to_give_one() -> None:
    spec, setup = _seed000()
    row = _rows(spec, setup, 6750, 1e6, load_profile("default"), ["rtx-pro-6000"], {})
    cost = row["rtx-pro-6000"]["cost"]
    assert cost["usd"] is None
    assert cost["reason"] == "no price; pass --price rtx-pro-6000=USD"
    priced = _rows(
        spec, setup, 6750, 1e6, load_profile("default"), ["rtx-pro-6000"], {"pro6000": 2.75}
    )["rtx-pro-6000"]["cost"]
    assert priced["usd"] == pytest.approx(
        2.75
        * _rows(spec, setup, 6750, 1e6, load_profile("default"), ["rtx-pro-6000"], {})[
            "rtx-pro-6000"
        ]["time"]["gpu_hours"]
    )


def test_catalog_price_is_used_and_named_when_not_overridden() -> None:
    spec, setup = _seed000()
    cost = _rows(spec, setup, 6750, 1e6, load_profile("default"), ["h200"], {})["h200"]["cost"]
    assert cost["price_source"].startswith("catalog:")
    assert cost["usd"] == pytest.approx(
        cost["usd_per_gpu_hour"]
        * _rows(spec, setup, 6750, 1e6, load_profile("default"), ["h200"], {})["h200"]["time"][
            "gpu_hours"
        ]
    )


def test_two_h200s_with_device_map_cost_twice_the_gpu_hours() -> None:
    spec, setup = _seed000()
    rows = _rows(
        spec,
        setup,
        48000,
        6.4e6,
        load_profile("default"),
        ["h200", "2xh200"],
        SEED_PRICES,
        fits={"h200": False},
    )
    summary = training_summary(
        Scenario(spec, setup, load_profile("default"), 48000, 1), rows, 6.4e6
    )
    one, two = rows["h200"]["time"], rows["2xh200"]["time"]
    assert two["gpu_hours"] == pytest.approx(2 * two["wall_hours"])
    assert two["wall_hours"] >= one["wall_hours"]
    assert summary["by_cost"] == ["2xh200"]
    assert summary["not_fitting"] == [{"gpu": "h200", "verdict": "no"}]
    assert "does not fit: h200" in format_time_cost_table(summary)


def test_cli_price_and_calibrate_options_parse() -> None:
    assert parse_price_option(["h200=5.0", "a100=2.5,rtx-pro-6000=2.75"]) == SEED_PRICES
    with pytest.raises(EstimatorInputError):
        parse_price_option(["h200"])
    assert parse_calibrate_option("gpu=a100-80gb,seq=6750,tps=221") == {
        "gpu": "a100-80gb",
        "seq_len": 6750,
        "batch": 1,
        "tokens_per_second": 221.0,
    }
    assert parse_calibrate_option("memtest_h200.json") == {"memtest": "memtest_h200.json"}
    with pytest.raises(EstimatorInputError):
        parse_calibrate_option("gpu=h200,seq=abc,step=3")
