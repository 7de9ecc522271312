"""The service refuses a setup a bitsandbytes-quantized checkpoint cannot train (422 naming the
field; tests/estimator/test_stored_quantization.py has the rule)."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi.testclient import TestClient

from tests.estimator.test_stored_quantization import _stored


def test_the_service_answers_422_naming_the_field(sqlite_client: TestClient) -> None:
    model = {"config": _stored(load_in_4bit=True)}
    res = sqlite_client.post("/v1/estimate", json={"model": model, "gpus": ["h200"]})
    assert res.status_code == 422
    assert res.json()["detail"][0]["loc"] == ["body", "setup", "method"]
    res = sqlite_client.post(
        "/v1/max-seq", json={"model": model, "gpu": "h200", "setup": {"method": "lora"}}
    )
    assert res.status_code == 422
    assert res.json()["detail"][0]["loc"] == ["body", "setup", "base"]
    res = sqlite_client.post(
        "/v1/estimate", json={"model": model, "gpus": ["h200"], "setup": {"method": "qlora"}}
    )
    assert res.status_code == 200


def test_the_web_form_points_at_its_method_field(sqlite_client: TestClient) -> None:
    def form(method: str) -> dict[str, Any]:
        return {
            "model_source": "config",
            "config_text": json.dumps(_stored(load_in_4bit=True)),
            "method": method,
            "lora_rank": "16",
            "lora_targets": "all-linear",
            "optimizer": "adamw",
            "precision": "mixed",
            "checkpointing": "gpu",
            "loss": "chunked",
            "batch": "1",
            "seq_lens": "2048",
            "gpus": ["h200"],
            "usable_fraction": "0.92",
        }

    for method, why in (("full", "only with adapters"), ("lora", "base bf16")):
        page = sqlite_client.post("/estimate", data=form(method))
        assert page.status_code == 422
        assert re.search(r'<a href="#method">method</a>: [^<]*' + why, page.text), method
    assert sqlite_client.post("/estimate", data=form("qlora")).status_code == 200
