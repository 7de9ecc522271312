"""`POST /v1/estimate` hands `estimate` the request as the strict schema validated it
(app/api/routes/estimates.py CachedDocumentRoute; FastAPI no longer parses and validates the
same bytes again, issue 17): that request is the one FastAPI's lax validation built, and what
the strict checks refuse, or what is not JSON, is answered as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from app.services import estimates
from bench import doc_corpus
from estimator.request import EstimateRequest

STRICT = TypeAdapter(EstimateRequest)


def test_the_strict_request_is_the_lax_one_for_every_corpus_body() -> None:
    bodies = [body for _, body, _ in doc_corpus._cases()]
    assert len(bodies) > 500
    for body in bodies:
        raw = json.dumps(body).encode()
        strict = STRICT.validate_json(raw, strict=True)
        lax = EstimateRequest.model_validate(json.loads(raw))
        assert repr(strict) == repr(lax), body  # repr: 2 and 2.0 differ


BODY = {
    "model": {"preset": "llama-3.1-8b"},
    "setup": {"method": "lora", "batch": 2},
    "seq_lens": [2048, 4096],
    "gpus": ["h100-80gb"],
    "tokens": 2000000000,  # an int where a float goes
    "epochs": 2,
    "prices": {"h100-80gb": 3},
}


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    real = estimates.estimate

    def spying(req: Any) -> dict[str, Any]:
        calls.append(req)
        return real(req)

    monkeypatch.setattr(estimates, "estimate", spying)
    return calls


def test_the_route_estimates_the_request_fastapi_would_have_built(
    sqlite_client: TestClient, seen: list[Any]
) -> None:
    response = sqlite_client.post("/v1/estimate", json=BODY)
    assert response.status_code == 200, response.text
    assert len(seen) == 1 and isinstance(seen[0], EstimateRequest)
    assert repr(seen[0]) == repr(EstimateRequest.model_validate(BODY))


@pytest.mark.parametrize(
    ("raw", "content_type", "kind"),
    [
        (b'{"model": ', "application/json", "json_invalid"),
        (json.dumps({**BODY, "seq_lens": ["2048"]}).encode(), "application/json", "int_type"),
        (
            json.dumps(BODY)[:-1].encode() + b', "gpus": ["h200"]}',
            "application/json",
            "duplicate_key",
        ),
        (json.dumps(BODY).encode(), "text/plain", None),
    ],
)
def test_what_the_strict_path_refuses_is_answered_as_before(
    sqlite_client: TestClient, seen: list[Any], raw: bytes, content_type: str, kind: str | None
) -> None:
    response = sqlite_client.post(
        "/v1/estimate", content=raw, headers={"content-type": content_type}
    )
    assert response.status_code == 422
    if kind is not None:
        assert kind in {item["type"] for item in response.json()["detail"]}
    assert seen == []
