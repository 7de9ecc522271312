"""Memtest upload, dedupe, listing and validation through the REST API (both backends)."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor

from fastapi.testclient import TestClient
from service_support import memtest_bytes, upload_headers


def test_upload_returns_201_with_id_and_stores_the_file_verbatim(client: TestClient) -> None:
    raw = memtest_bytes()
    response = client.post("/v1/memtests", content=raw, headers=upload_headers())
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["duplicate"] is False
    assert body["sha256"] == hashlib.sha256(raw).hexdigest()
    assert body["id"] == body["sha256"][:16]
    assert client.get(f"/v1/memtests/{body['id']}/raw").content == raw
    detail = client.get(f"/v1/memtests/{body['id']}").json()
    assert detail["uploaded_by"] == "ci"
    assert detail["gpu_name"] == "NVIDIA H200"
    assert detail["document"]["results"][0]["peak_allocated_bytes"] == 62_000_000_000


def test_same_file_twice_is_one_row_with_the_same_id(client: TestClient) -> None:
    raw = memtest_bytes()
    first = client.post("/v1/memtests", content=raw, headers=upload_headers())
    second = client.post("/v1/memtests", content=raw, headers=upload_headers())
    assert first.status_code == 201
    assert second.status_code == 200
    assert second.json()["duplicate"] is True
    assert second.json()["id"] == first.json()["id"]
    assert client.get("/v1/memtests").json()["total"] == 1


def test_concurrent_uploads_of_one_file_give_one_row(client: TestClient) -> None:
    raw = memtest_bytes(created_at="2026-10-08T10:00:00Z")

    def upload(_: int) -> tuple[int, str]:
        r = client.post("/v1/memtests", content=raw, headers=upload_headers())
        return r.status_code, r.json()["id"]

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(upload, range(12)))
    assert {i for _, i in results} == {results[0][1]}
    assert sorted(s for s, _ in results).count(201) == 1
    assert client.get("/v1/memtests").json()["total"] == 1


def test_a_reformatted_file_is_a_different_upload(client: TestClient) -> None:
    compact = json.dumps(json.loads(memtest_bytes())).encode()
    a = client.post("/v1/memtests", content=memtest_bytes(), headers=upload_headers()).json()
    b = client.post("/v1/memtests", content=compact, headers=upload_headers()).json()
    assert a["id"] != b["id"]


def test_multipart_upload_is_accepted(client: TestClient) -> None:
    raw = memtest_bytes()
    response = client.post(
        "/v1/memtests",
        files={"file": ("memtest_h200.json", raw, "application/json")},
        headers={"Authorization": upload_headers()["Authorization"]},
    )
    assert response.status_code == 201, response.text
    assert response.json()["sha256"] == hashlib.sha256(raw).hexdigest()


def test_multipart_with_more_parts_than_the_upload_reads_is_422_naming_the_body(
    client: TestClient,
) -> None:
    raw = memtest_bytes()
    auth = {"Authorization": upload_headers()["Authorization"]}
    file = {"file": ("memtest_h200.json", raw, "application/json")}
    few = client.post("/v1/memtests", files=file, data={"note": ["a"] * 10}, headers=auth)
    assert few.status_code == 201, few.text  # other fields up to the limit: ignored
    many = client.post("/v1/memtests", files=file, data={"note": ["a"] * 11}, headers=auth)
    assert many.status_code == 422, many.text
    detail = many.json()["detail"][0]
    assert detail["loc"] == ["body"] and "Too many fields" in detail["msg"]
    two = [("file", ("a.json", raw, "application/json")), ("file", ("b.json", raw, "x/y"))]
    files = client.post("/v1/memtests", files=two, headers=auth)
    assert files.status_code == 422, files.text
    assert "Too many files" in files.json()["detail"][0]["msg"]


def test_list_filters_by_indexed_fields(client: TestClient) -> None:
    env = json.loads(memtest_bytes())["environment"]
    client.post("/v1/memtests", content=memtest_bytes(), headers=upload_headers())
    other = dict(env, gpu_name="NVIDIA A100-SXM4-80GB")
    client.post("/v1/memtests", content=memtest_bytes(environment=other), headers=upload_headers())
    assert client.get("/v1/memtests").json()["total"] == 2
    only = client.get("/v1/memtests", params={"gpu": "NVIDIA H200"}).json()
    assert only["total"] == 1
    assert only["items"][0]["gpu_name"] == "NVIDIA H200"
    assert client.get("/v1/memtests", params={"model": "nope"}).json()["total"] == 0
    assert client.get("/v1/memtests", params={"uploaded_by": "ci"}).json()["total"] == 2


def test_unknown_memtest_is_404(client: TestClient) -> None:
    assert client.get("/v1/memtests/0123456789abcdef").status_code == 404
    assert client.get("/v1/memtests/0123456789abcdef/comparison").status_code == 404


def test_bad_schema_is_422_naming_the_field(sqlite_client: TestClient) -> None:
    doc = json.loads(memtest_bytes())
    doc["results"][1]["peak_allocated_bytes"] = "a lot"
    response = sqlite_client.post(
        "/v1/memtests", content=json.dumps(doc).encode(), headers=upload_headers()
    )
    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["body", "results", 1, "peak_allocated_bytes"]
    assert "integer" in detail["msg"]


def test_wrong_schema_id_duplicate_keys_nan_and_garbage_are_422(
    sqlite_client: TestClient,
) -> None:
    bodies = [
        memtest_bytes(schema="trainfit.memtest/99"),
        b'{"schema": "trainfit.memtest/1", "schema": "x"}',
        memtest_bytes().replace(b"420.5", b"NaN"),
        b"not json at all",
        b"[1, 2, 3]",
        b"",
        b"\xff\xfe{}",
        b'{"a": "\\u0000"}',
    ]
    for body in bodies:
        response = sqlite_client.post("/v1/memtests", content=body, headers=upload_headers())
        assert response.status_code == 422, (body[:40], response.text)
        assert response.json()["detail"][0]["loc"][0] == "body"
