"""The service refuses a setup a bitsandbytes-quantized checkpoint cannot train (422 naming the
field; tests/estimator/test_stored_quantization.py has the rule)."""

from __future__ import annotations

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
