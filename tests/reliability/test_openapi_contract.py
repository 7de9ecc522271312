"""Issue 16, item 8 (schemathesis findings): the `Allow` header of a 405 lists every method of
the path (it named only the first route's), and constraints the validators enforce are in the
OpenAPI schema, so that what the schema allows the service does not reject for those reasons."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_support import make_settings

from app.factory import create_app
from estimator.request import MAX_SEQ_LEN

REQUEST = {"model": {"preset": "qwen3.5-27b"}, "seq_lens": [4096], "gpus": ["h200"]}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}"))) as c:
        yield c


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("OPTIONS", "/v1/quotes", "GET, HEAD, POST"),
        ("OPTIONS", "/v1/memtests", "GET, HEAD, POST"),
        ("DELETE", "/v1/quotes/abc", "GET, HEAD"),
        ("PUT", "/healthz", "GET, HEAD"),
        ("PATCH", "/v1/estimate", "POST"),
    ],
)
def test_405_allow_lists_every_method_of_the_path(
    client: TestClient, method: str, path: str, allowed: str
) -> None:
    r = client.request(method, path)
    assert r.status_code == 405
    assert r.headers["allow"] == allowed


def test_validator_constraints_are_in_the_schema(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("EstimateRequest", "CheckRequest"):
        items = schemas[name]["properties"]["seq_lens"]["items"]
        assert (items["minimum"], items["maximum"]) == (1, MAX_SEQ_LEN), name
    assert schemas["TrainingSetup"]["properties"]["lora_targets"]["minItems"] == 1


@pytest.mark.parametrize(
    "change",
    [
        {"seq_lens": [0]},
        {"seq_lens": [MAX_SEQ_LEN + 1]},
        {"setup": {"method": "lora", "lora_targets": []}},
    ],
)
def test_what_the_schema_forbids_the_service_rejects(
    client: TestClient, change: dict[str, object]
) -> None:
    assert client.post("/v1/estimate", json={**REQUEST, **change}).status_code == 422
