"""Quotes over REST: create (estimate stored), approve/reject with the approver token only,
audit trail; on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import SEED_TARGETS, approver_headers, upload_headers

pytestmark = pytest.mark.usefixtures("fake_library")


def seed_request(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"preset": "qwen3.5-27b"},
        "setup": {
            "method": "lora",
            "lora_rank": 16,
            "lora_targets": SEED_TARGETS,
            "optimizer": "adamw-8bit",
            "checkpointing": "offload",
            "loss": "chunked",
        },
        "seq_lens": [16000, 48000],
        "gpus": ["a100-80gb", "h200"],
        "profile": "seed-000",
    }
    body.update(changes)
    return body


def create(client: TestClient, **changes: Any) -> dict[str, Any]:
    body = {"request": seed_request(), "title": "48k on A100", "created_by": "alice"}
    body.update(changes)
    response = client.post("/v1/quotes", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def test_create_stores_request_and_estimate_and_is_pending(client: TestClient) -> None:
    quote = create(client)
    assert quote["status"] == "pending"
    assert quote["url"] == f"/quotes/{quote['id']}"
    assert quote["request"]["setup"]["optimizer"] == "adamw-8bit"
    assert [r["seq_len"] for r in quote["estimate"]["rows"]] == [16000, 48000]
    again = client.get(f"/v1/quotes/{quote['id']}").json()
    assert again["estimate"] == quote["estimate"]
    assert [(a["from_status"], a["to_status"], a["actor"]) for a in again["audit"]] == [
        (None, "pending", "alice")
    ]


def test_approve_needs_the_approver_token(client: TestClient) -> None:
    quote_id = create(client)["id"]
    url = f"/v1/quotes/{quote_id}/approve"
    assert client.post(url).status_code == 401
    assert client.post(url, headers={"Authorization": "Bearer wrong-token"}).status_code == 403
    upload_only = {"Authorization": upload_headers()["Authorization"]}
    assert client.post(url, headers=upload_only).status_code == 403
    assert client.get(f"/v1/quotes/{quote_id}").json()["status"] == "pending"

    response = client.post(url, json={"comment": "go"}, headers=approver_headers())
    assert response.status_code == 200, response.text
    decided = response.json()
    assert (decided["status"], decided["approver"], decided["comment"]) == (
        "approved",
        "kral",
        "go",
    )
    assert decided["decided_at"] is not None
    assert [(a["to_status"], a["actor"], a["comment"]) for a in decided["audit"]] == [
        ("pending", "alice", None),
        ("approved", "kral", "go"),
    ]


def test_reject_then_approve_is_409(client: TestClient) -> None:
    quote_id = create(client)["id"]
    rejected = client.post(
        f"/v1/quotes/{quote_id}/reject", json={"comment": "too dear"}, headers=approver_headers()
    )
    assert rejected.json()["status"] == "rejected"
    again = client.post(f"/v1/quotes/{quote_id}/approve", headers=approver_headers())
    assert again.status_code == 409
    assert len(client.get(f"/v1/quotes/{quote_id}").json()["audit"]) == 2


def test_draft_must_be_submitted_before_approval(client: TestClient) -> None:
    quote_id = create(client, submit=False)["id"]
    assert (
        client.post(f"/v1/quotes/{quote_id}/approve", headers=approver_headers()).status_code == 409
    )
    submitted = client.post(f"/v1/quotes/{quote_id}/submit")
    assert submitted.json()["status"] == "pending"
    approved = client.post(f"/v1/quotes/{quote_id}/approve", headers=approver_headers())
    assert approved.json()["status"] == "approved"


def test_list_and_filter_quotes(client: TestClient) -> None:
    first = create(client)["id"]
    create(client, title="second")
    client.post(f"/v1/quotes/{first}/approve", headers=approver_headers())
    assert len(client.get("/v1/quotes").json()) == 2
    approved = client.get("/v1/quotes", params={"status": "approved"}).json()
    assert [q["id"] for q in approved] == [first]


def test_unknown_quote_is_404_and_bad_bodies_are_422(sqlite_client: TestClient) -> None:
    assert sqlite_client.get("/v1/quotes/nope").status_code == 404
    assert (
        sqlite_client.post("/v1/quotes/nope/approve", headers=approver_headers()).status_code == 404
    )
    assert sqlite_client.post("/v1/quotes", json={"title": "x"}).status_code == 422
    bad = {"request": seed_request(seq_lens=[0]), "created_by": "a"}
    assert sqlite_client.post("/v1/quotes", json=bad).status_code == 422
    extra = {"request": seed_request(), "created_by": "a", "surprise": 1}
    assert sqlite_client.post("/v1/quotes", json=extra).status_code == 422
    assert sqlite_client.post("/v1/quotes", content=b"{not json").status_code == 422
