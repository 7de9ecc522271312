"""`POST /v1/estimate` keeps its answers per body (app/api/routes/estimates.py DocumentCache):
a body sent again gets the same bytes without the estimator running; bad input, other bodies
and other apps are computed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.routes import estimates as route
from app.services import estimates

BODY = {
    "model": {"preset": "llama-3.1-8b"},
    "setup": {"method": "lora"},
    "seq_lens": [4096, 8192],
    "gpus": ["h100-80gb", "2xh200"],
}


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    real = estimates.estimate

    def counting(req: Any) -> dict[str, Any]:
        calls.append(req)
        return real(req)

    monkeypatch.setattr(estimates, "estimate", counting)
    return calls


def test_a_repeated_body_is_answered_from_the_cache(
    sqlite_client: TestClient, counted: list[Any]
) -> None:
    raw = json.dumps(BODY).encode()
    headers = {"content-type": "application/json"}
    first = sqlite_client.post("/v1/estimate", content=raw, headers=headers)
    second = sqlite_client.post("/v1/estimate", content=raw, headers=headers)
    assert first.status_code == second.status_code == 200
    assert second.content == first.content
    assert second.headers["content-type"] == first.headers["content-type"]
    assert len(counted) == 1
    # the same request written otherwise is another body: computed, same document
    spaced = json.dumps(BODY, indent=1).encode()
    third = sqlite_client.post("/v1/estimate", content=spaced, headers=headers)
    assert third.json() == first.json()
    assert len(counted) == 2
    other = sqlite_client.post("/v1/estimate", json={**BODY, "seq_lens": [1024]})
    assert other.status_code == 200 and other.json()["rows"][0]["seq_len"] == 1024
    assert len(counted) == 3


def test_bad_input_is_never_kept(sqlite_client: TestClient, counted: list[Any]) -> None:
    bad = {**BODY, "gpus": ["no-such-gpu"]}
    for _ in range(2):
        r = sqlite_client.post("/v1/estimate", json=bad)
        assert r.status_code == 422
    assert len(counted) == 2
    strict = {**BODY, "seq_lens": ["4096"]}  # a string where a number goes
    for _ in range(2):
        assert sqlite_client.post("/v1/estimate", json=strict).status_code == 422


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = route.DocumentCache()
    monkeypatch.setattr(route, "CACHE_ENTRIES", 3)
    for i in range(5):
        cache.put(b"%d" % i, b"answer")
    assert [cache.get(b"%d" % i) for i in range(5)] == [None, None, b"answer", b"answer", b"answer"]
    cache.put(b"big", b"x" * (route.CACHE_MAX_ANSWER_BYTES + 1))
    assert cache.get(b"big") is None
