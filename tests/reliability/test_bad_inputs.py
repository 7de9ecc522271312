"""The bad-input corpus (`corpus.py`): every hostile or malformed request is a 4xx naming the
offending field, never a 500, and the service answers /healthz normally afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from corpus import KNOWN_GAPS, Case, all_cases
from fastapi.testclient import TestClient
from service_support import UPLOAD_TOKEN, make_settings

from app.factory import create_app

CASES = all_cases()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("corpus") / "trainfit.db"
    app = create_app(make_settings(f"sqlite:///{db}"))
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def _loc(response_json: object) -> list[object] | None:
    detail = response_json.get("detail") if isinstance(response_json, dict) else None
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        return list(detail[0].get("loc", []))
    return None


def _params() -> list[object]:
    out = []
    for case in CASES:
        marks = []
        if case.name in KNOWN_GAPS:
            marks.append(pytest.mark.xfail(reason=KNOWN_GAPS[case.name], strict=False))
        out.append(pytest.param(case, id=f"{case.path}:{case.name}", marks=marks))
    return out


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 90


@pytest.mark.parametrize("case", _params())
def test_bad_input_is_a_named_4xx(client: TestClient, case: Case) -> None:
    headers = {"content-type": case.content_type}
    if case.auth == "upload":
        headers["authorization"] = f"Bearer {UPLOAD_TOKEN}"
    response = client.post(case.path, content=case.body, headers=headers)
    assert response.status_code < 500, response.text[:500]
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert response.status_code == case.status, response.text[:500]
    if case.loc is not None:
        loc = _loc(response.json())
        assert loc is not None, response.text[:500]
        assert tuple(loc[: len(case.loc)]) == case.loc, loc
        assert response.json()["detail"][0]["msg"]
