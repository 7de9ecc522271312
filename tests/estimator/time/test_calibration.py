"""Calibration: a measured step time -> efficiency -> every other option re-priced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.profile import load_profile
from estimator.scenario import Scenario
from estimator.setup import TrainingSetup
from estimator.time.calibration import (
    calibrate,
    calibrate_from_memtest,
    efficiency_from_throughput,
    gpu_from_name,
    recalibrated_rows,
)
from estimator.time.plan import row_time_and_cost
from tests.estimator.seed_case import SEED_TARGETS

CONFIGS = Path(__file__).parents[2] / "data" / "configs"
TARGETS = SEED_TARGETS
DEFAULT = load_profile("default")
SEED = load_profile("seed-000")


def _seed000(method: str = "lora"):
    spec = spec_from_config(json.loads((CONFIGS / "qwen3.5-27b.json").read_text()))
    setup = TrainingSetup(
        method=method,
        lora_rank=16,
        lora_targets=TARGETS,
        optimizer="adamw-8bit",
        checkpointing="offload",
        loss="chunked",
    )
    return spec, setup, spec.layers * 6750 * spec.hidden * 2


def test_efficiency_reproducing_seed_000s_221_tokens_per_second_on_an_a100() -> None:
    spec, setup, host = _seed000("qlora")
    eff = efficiency_from_throughput(
        Scenario(spec, setup, DEFAULT, 6750, 1, option="a100-80gb"), 221.0, host_bytes=host
    )
    assert SEED.number("time", "efficiency.qlora") == pytest.approx(eff, rel=0.005)
    row = row_time_and_cost(
        Scenario(spec, setup, SEED, 6750, 1, option="a100-80gb"),
        tokens=None,
        host_bytes=host,
        fits=True,
    )
    assert row["time"]["tokens_per_second"] == pytest.approx(221.0, rel=0.005)


def test_seed_000_profile_encodes_its_bf16_and_h200_assumptions() -> None:
    spec, setup, host = _seed000("lora")
    a100 = efficiency_from_throughput(
        Scenario(spec, setup, DEFAULT, 6750, 1, option="a100-80gb"),
        6.4e6 / (5.9 * 3600),
        host_bytes=host,
    )
    h200 = efficiency_from_throughput(
        Scenario(spec, setup, DEFAULT, 6750, 1, option="h200"),
        6.4e6 / (2.7 * 3600),
        host_bytes=host,
    )
    assert SEED.number("time", "efficiency.lora") == pytest.approx(a100, rel=0.005)
    scale = SEED.get("time", "efficiency_scale_by_gpu")["h200"]
    assert scale == pytest.approx(h200 / a100, rel=0.005)
    speedup = h200 * 989 / (a100 * 312)
    assert 2.0 <= speedup <= 2.5  # "H200 about 2 to 2.5 times an A100"


def test_calibrating_from_a_step_time_round_trips() -> None:
    spec, setup, host = _seed000()
    row = row_time_and_cost(
        Scenario(spec, setup, DEFAULT, 6750, 1, option="h200"),
        tokens=None,
        host_bytes=host,
        fits=True,
    )
    cal = calibrate(
        Scenario(spec, setup, DEFAULT, 6750, 1, option="h200"),
        step_seconds=row["time"]["step_seconds"],
        host_bytes=host,
    )
    assert cal.efficiency == pytest.approx(DEFAULT.number("time", "efficiency.lora"))


def test_one_measurement_reprices_every_option_marking_measured_and_extrapolated() -> None:
    spec, setup, host = _seed000("qlora")
    measured = Scenario(spec, setup, DEFAULT, 6750, 1, option="a100-80gb")
    cal = calibrate(measured, tokens_per_second=221.0, host_bytes=host)
    priced = measured.at(prices={"a100-80gb": 2.5, "h200": 5.0}, calibration=cal)
    rows = recalibrated_rows(
        priced,
        ["a100-80gb", "h200"],
        [6750, 32000],
        tokens=6.4e6,
        host_bytes_by_seq={6750: host},
    )
    basis = {(r["gpu"], r["seq_len"]): r["basis"] for r in rows}
    assert basis == {
        ("a100-80gb", 6750): "measured",
        ("a100-80gb", 32000): "extrapolated",
        ("h200", 6750): "extrapolated",
        ("h200", 32000): "extrapolated",
    }
    measured = next(r for r in rows if r["basis"] == "measured")
    assert measured["time"]["tokens_per_second"] == pytest.approx(221.0)
    assert measured["time"]["efficiency_source"].startswith("calibrated")
    h200 = next(r for r in rows if r["gpu"] == "h200" and r["seq_len"] == 6750)
    # same efficiency, 989/312 the peak: about 3.2x faster when compute-bound
    assert h200["time"]["tokens_per_second"] / 221.0 == pytest.approx(989 / 312, rel=0.02)


def test_a_measurement_faster_than_the_peak_is_rejected() -> None:
    spec, setup, host = _seed000()
    with pytest.raises(EstimatorInputError) as err:
        calibrate(
            Scenario(spec, setup, DEFAULT, 6750, 1, option="a100-80gb"), tokens_per_second=1e7
        )
    assert err.value.field == "calibrate.step_seconds"


def _memtest(step_seconds: list[float], gpu_name: str = "NVIDIA H200") -> dict:
    return {
        "schema": "trainfit.memtest/1",
        "environment": {"device": "cuda", "gpu_name": gpu_name, "gpu_count": 1},
        "model": {"config": json.loads((CONFIGS / "tiny-llama.json").read_text())},
        "setup": {"method": "full", "checkpointing": "none", "batch": 1},
        "results": [
            {
                "seq_len": 2048,
                "batch": 1,
                "status": "ok",
                "step_seconds": step_seconds,
                "tokens_per_second": 2048 / step_seconds[-1],
            },
            {"seq_len": 4096, "batch": 1, "status": "oom", "step_seconds": []},
        ],
    }


def test_calibrate_from_a_memtest_uses_the_median_after_warm_up() -> None:
    spec = spec_from_config(json.loads((CONFIGS / "Llama-3.1-8B.json").read_text()))
    doc = _memtest([9.0, 0.40, 0.42, 0.41])
    cals = calibrate_from_memtest(doc, DEFAULT, spec=spec)
    assert len(cals) == 1 and cals[0].gpu_id == "h200"
    assert cals[0].step_seconds == pytest.approx(0.41)
    measured = Scenario(spec, TrainingSetup(checkpointing="none"), DEFAULT, 2048, 1, option="h200")
    direct = calibrate(measured, step_seconds=0.41)
    assert cals[0].efficiency == pytest.approx(direct.efficiency)


def test_memtest_from_a_cpu_run_cannot_calibrate() -> None:
    doc = _memtest([1.0])
    doc["environment"]["device"] = "cpu"
    with pytest.raises(EstimatorInputError) as err:
        calibrate_from_memtest(doc, DEFAULT)
    assert err.value.field == "memtest.environment.device"


@pytest.mark.parametrize(
    ("name", "gpu_id"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),
    ],
)
def test_driver_gpu_names_map_to_catalog_ids(name: str, gpu_id: str) -> None:
    assert gpu_from_name(name) == gpu_id
