"""The service with Hub ids (`"model": {"hub": "ORG/NAME"}`), served by the local Hub on
127.0.0.1 (tests/estimator/hub_server.py): it caches what it fetched, and a gated, absent or
offline-and-uncached id is a 422 that says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import estimator.hub
from tests.estimator.hub_server import TOKEN, HubHandler

pytest.importorskip("huggingface_hub")

BODY = {"gpu": "h100-80gb", "seq_lens": [1024], "setup": {"method": "lora"}}


def _config_gets() -> list[str]:
    return [r for r in HubHandler.requests if r.endswith("/config.json")]


def test_the_service_fetches_a_hub_config_once_and_answers_from_its_cache(
    sqlite_client: TestClient, hub_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = sqlite_client.post("/v1/check", json={**BODY, "model": {"hub": "acme/tiny-llama"}})
    assert first.status_code == 200, first.text
    asked = len(_config_gets())
    assert asked >= 1  # HEAD and/or GET of acme/tiny-llama's config.json
    again = sqlite_client.post("/v1/check", json={**BODY, "model": {"hub": "acme/tiny-llama"}})
    assert again.json()["peak_bytes"] == first.json()["peak_bytes"]
    assert len(_config_gets()) == asked  # answered from the service's cache
    assert (hub_env / "models--acme--tiny-llama").is_dir()  # and kept in the Hub cache on disk
    # a branch is asked for again once the cache entry is older than CONFIG_TTL_S
    now = estimator.hub.time.monotonic()
    monkeypatch.setattr(
        estimator.hub.time, "monotonic", lambda: now + estimator.hub.CONFIG_TTL_S + 1
    )
    third = sqlite_client.post("/v1/check", json={**BODY, "model": {"hub": "acme/tiny-llama"}})
    assert third.status_code == 200 and len(_config_gets()) > asked


def test_gated_absent_and_offline_ids_are_422s_that_say_what_to_do(
    sqlite_client: TestClient, hub_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated = sqlite_client.post("/v1/check", json={**BODY, "model": {"hub": "acme/gated-llama"}})
    assert gated.status_code == 422
    assert gated.json()["detail"][0]["loc"] == ["body", "model", "hub"]
    assert "HF_TOKEN" in gated.text
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    opened = sqlite_client.post("/v1/check", json={**BODY, "model": {"hub": "acme/gated-llama"}})
    assert opened.status_code == 200, opened.text
    absent = sqlite_client.post("/v1/check", json={**BODY, "model": {"hub": "acme/nothing"}})
    assert absent.status_code == 422 and "no such model repo" in absent.text
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = sqlite_client.post("/v1/check", json={**BODY, "model": {"hub": "acme/other"}})
    assert offline.status_code == 422
    assert "HF_HUB_OFFLINE is set" in offline.text and "model.config" in offline.text
