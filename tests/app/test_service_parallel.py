"""`setup.parallel` over REST: a layout estimates per device, a bad one is 422 naming it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient


def body(parallel: str, gpus: list[str], **setup: Any) -> dict[str, Any]:
    return {
        "model": {"preset": "llama-3.1-70b"},
        "setup": {"method": "full", "parallel": parallel, **setup},
        "seq_lens": [4096],
        "gpus": gpus,
    }


def test_estimate_takes_a_layout_and_reports_the_inter_node_share(
    sqlite_client: TestClient,
) -> None:
    response = sqlite_client.post("/v1/estimate", json=body("fsdp,tp=8", ["16xh100"]))
    assert response.status_code == 200, response.text
    row = response.json()["rows"][0]
    fit = row["fit"]["16xh100"]
    assert fit["time"]["sharding"] == "fsdp=2,tp=8"
    assert fit["time"]["comm_inter_node_seconds"] > 0
    one_node = sqlite_client.post("/v1/estimate", json=body("fsdp,tp=8", ["8xh100"])).json()
    assert one_node["rows"][0]["fit"]["8xh100"]["time"]["comm_inter_node_seconds"] == 0


@pytest.mark.parametrize(
    ("parallel", "gpus", "words"),
    [
        ("tp=3", ["3xh100"], "does not divide the 64 attention heads"),
        ("pp=96", ["96xh100"], "stages but"),
        ("fsdp=8,tp=8", ["16xh100"], "multiply to 64"),
        ("fsdp,zero3", ["8xh100"], "choose one of"),
        ("wat=2", ["8xh100"], "unknown item"),
    ],
)
def test_bad_layouts_are_422_naming_setup_parallel(
    sqlite_client: TestClient, parallel: str, gpus: list[str], words: str
) -> None:
    response = sqlite_client.post("/v1/estimate", json=body(parallel, gpus))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert "parallel" in [str(p) for p in detail["loc"]] or "setup.parallel" in detail["msg"]
    assert words in detail["msg"]


def test_check_takes_the_layout_too(sqlite_client: TestClient) -> None:
    check = {
        "model": {"preset": "llama-3.1-70b"},
        "setup": {"method": "full", "parallel": "fsdp", "num_gpus": 16},
        "seq_lens": [4096],
        "gpu": "h100",
    }
    response = sqlite_client.post("/v1/check", json=check)
    assert response.status_code == 200, response.text
    assert response.json()["verdict"] != "fits"  # the FSDP2 case: over 73.3 GiB usable


@pytest.mark.parametrize(
    ("parallel", "gpus", "extra", "field"),
    [
        ("fsdp", ["8xh100"], {"pp_schedule": "gpipe"}, "pp_schedule"),
        ("fsdp,pp=2", ["8xh100"], {"pp_virtual": 2}, "pp_virtual"),
        ("fsdp,pp=2", ["8xh100"], {"pp_schedule": "zero-bubble-x"}, "pp_schedule"),
        (
            "pp=8",
            ["8xh100"],
            {"pp_schedule": "interleaved-1f1b", "pp_virtual": 20},
            "pp_virtual",
        ),
    ],
)
def test_bad_pipeline_schedules_are_422_naming_the_field(
    sqlite_client: TestClient, parallel: str, gpus: list[str], extra: dict[str, Any], field: str
) -> None:
    response = sqlite_client.post("/v1/estimate", json=body(parallel, gpus, **extra))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert field in " ".join([*(str(p) for p in detail["loc"]), detail["msg"]])


def test_estimate_takes_a_pipeline_schedule(sqlite_client: TestClient) -> None:
    times = {}
    for schedule in ("1f1b", "interleaved-1f1b"):
        setup = {"pp_schedule": schedule, "grad_accum": 8}
        response = sqlite_client.post("/v1/estimate", json=body("fsdp,pp=4", ["8xh100"], **setup))
        assert response.status_code == 200, response.text
        times[schedule] = response.json()["rows"][0]["fit"]["8xh100"]["time"]["step_seconds"]
    assert times["interleaved-1f1b"] < times["1f1b"]  # bubble (p-1)/(v m) vs (p-1)/m
