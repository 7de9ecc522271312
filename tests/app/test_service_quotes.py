"""Quotes over REST: create (estimate stored), approve/reject with the approver token only,
audit trail; on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import (
    OTHER_REQUESTER_TOKEN,
    SEED_TARGETS,
    approver_headers,
    requester_headers,
    upload_headers,
)

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


def create(
    client: TestClient, headers: dict[str, str] | None = None, **changes: Any
) -> dict[str, Any]:
    body = {"request": seed_request(), "title": "48k on A100"}
    body.update(changes)
    response = client.post("/v1/quotes", json=body, headers=headers or requester_headers())
    assert response.status_code == 201, response.text
    return response.json()


def approve(
    client: TestClient, quote: dict[str, Any], **body: Any
) -> Any:  # httpx response of the testclient
    payload = {"content_hash": quote["content_hash"], **body}
    return client.post(
        f"/v1/quotes/{quote['id']}/approve", json=payload, headers=approver_headers()
    )


def trail(client: TestClient, quote_id: str) -> list[tuple[Any, ...]]:
    audit = client.get(f"/v1/quotes/{quote_id}").json()["audit"]
    return [(a["from_status"], a["to_status"], a["actor"], a["outcome"]) for a in audit]


def test_create_stores_request_and_estimate_and_is_pending(client: TestClient) -> None:
    quote = create(client)
    assert quote["status"] == "pending"
    assert quote["url"] == f"/quotes/{quote['id']}"
    assert quote["request"]["setup"]["optimizer"] == "adamw-8bit"
    assert [r["seq_len"] for r in quote["estimate"]["rows"]] == [16000, 48000]
    again = client.get(f"/v1/quotes/{quote['id']}").json()
    assert again["estimate"] == quote["estimate"]
    assert trail(client, quote["id"]) == [(None, "pending", "alice", "ok")]


def test_approve_needs_the_approver_token(client: TestClient) -> None:
    quote = create(client)
    quote_id = quote["id"]
    url = f"/v1/quotes/{quote_id}/approve"
    assert client.post(url).status_code == 401
    assert client.post(url, headers={"Authorization": "Bearer wrong-token"}).status_code == 403
    upload_only = {"Authorization": upload_headers()["Authorization"]}
    assert client.post(url, headers=upload_only).status_code == 403
    assert client.post(url, headers=requester_headers()).status_code == 403
    assert client.get(f"/v1/quotes/{quote_id}").json()["status"] == "pending"

    response = approve(client, quote, comment="go")
    assert response.status_code == 200, response.text
    decided = response.json()
    assert (decided["status"], decided["approver"], decided["comment"]) == (
        "approved",
        "kral",
        "go",
    )
    assert decided["decided_at"] is not None
    # every refused attempt with a token is in the trail, with who tried (no token: 401 only)
    assert trail(client, quote_id) == [
        (None, "pending", "alice", "ok"),
        ("pending", "approved", "invalid-token", "denied"),
        ("pending", "approved", "invalid-token", "denied"),
        ("pending", "approved", "alice", "denied"),
        ("pending", "approved", "kral", "ok"),
    ]


def test_reject_then_approve_is_409(client: TestClient) -> None:
    quote = create(client)
    quote_id = quote["id"]
    rejected = client.post(
        f"/v1/quotes/{quote_id}/reject", json={"comment": "too dear"}, headers=approver_headers()
    )
    assert rejected.json()["status"] == "rejected"
    again = approve(client, quote)
    assert again.status_code == 409
    assert [t[3] for t in trail(client, quote_id)] == ["ok", "ok", "denied"]


def test_draft_must_be_submitted_before_approval(client: TestClient) -> None:
    quote = create(client, submit=False)
    quote_id = quote["id"]
    assert approve(client, quote).status_code == 409
    assert client.post(f"/v1/quotes/{quote_id}/submit").status_code == 401
    submitted = client.post(f"/v1/quotes/{quote_id}/submit", headers=requester_headers())
    assert submitted.json()["status"] == "pending"
    approved = approve(client, quote)
    assert approved.json()["status"] == "approved"
    assert trail(client, quote_id)[2] == ("draft", "pending", "alice", "ok")


def test_list_and_filter_quotes(client: TestClient) -> None:
    first = create(client)
    create(client, title="second")
    approve(client, first)
    assert len(client.get("/v1/quotes", headers=approver_headers()).json()) == 2
    approved = client.get(
        "/v1/quotes", params={"status": "approved"}, headers=approver_headers()
    ).json()
    assert [q["id"] for q in approved] == [first["id"]]


# --- identity: requester tokens, created_by from the token, list by role -----------------------


def test_create_and_list_need_a_requester_or_approver_token(client: TestClient) -> None:
    body = {"request": seed_request()}
    assert client.post("/v1/quotes", json=body).status_code == 401
    assert client.post("/v1/quotes", json=body, headers=upload_headers()).status_code == 403
    assert client.get("/v1/quotes").status_code == 401
    assert client.get("/v1/quotes", headers=upload_headers()).status_code == 403
    by_approver = create(client, headers=approver_headers())
    assert by_approver["created_by"] == "kral"


def test_created_by_comes_from_the_token_and_a_body_value_is_refused(
    client: TestClient,
) -> None:
    spoof = {"request": seed_request(), "created_by": "kral"}
    refused = client.post("/v1/quotes", json=spoof, headers=requester_headers())
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "created_by"]
    quote = create(client, headers=requester_headers(OTHER_REQUESTER_TOKEN))
    assert quote["created_by"] == "bob"
    assert trail(client, quote["id"])[0][2] == "bob"


def test_requesters_see_only_their_own_quotes_approvers_all(client: TestClient) -> None:
    alice = create(client)["id"]
    bob = create(client, headers=requester_headers(OTHER_REQUESTER_TOKEN))["id"]
    assert [q["id"] for q in client.get("/v1/quotes", headers=requester_headers()).json()] == [
        alice
    ]
    bobs = client.get("/v1/quotes", headers=requester_headers(OTHER_REQUESTER_TOKEN)).json()
    assert [q["id"] for q in bobs] == [bob]
    everyone = client.get("/v1/quotes", headers=approver_headers()).json()
    assert {q["id"] for q in everyone} == {alice, bob}


def test_a_requester_cannot_submit_another_requesters_draft(client: TestClient) -> None:
    draft = create(client, submit=False)["id"]
    url = f"/v1/quotes/{draft}/submit"
    assert client.post(url, headers=requester_headers(OTHER_REQUESTER_TOKEN)).status_code == 403
    assert client.get(f"/v1/quotes/{draft}").json()["status"] == "draft"
    assert trail(client, draft)[-1] == ("draft", "pending", "bob", "denied")
    assert client.post(url, headers=approver_headers()).json()["status"] == "pending"
    assert trail(client, draft)[-1] == ("draft", "pending", "kral", "ok")


# --- approval bound to content ------------------------------------------------------------------


def test_quote_shows_its_content_hash_and_etag(client: TestClient) -> None:
    quote = create(client)
    assert len(quote["content_hash"]) == 64 and quote["version"] == 1
    assert quote["stale"] is None
    got = client.get(f"/v1/quotes/{quote['id']}")
    assert got.headers["etag"] == f'"{quote["content_hash"]}"'
    other = create(client, request=seed_request(seq_lens=[16000]))
    assert other["content_hash"] != quote["content_hash"]


def test_approve_without_the_hash_is_428_and_with_a_wrong_one_409(client: TestClient) -> None:
    quote = create(client)
    url = f"/v1/quotes/{quote['id']}/approve"
    assert client.post(url, headers=approver_headers()).status_code == 428
    wrong = client.post(url, json={"content_hash": "0" * 64}, headers=approver_headers())
    assert wrong.status_code == 409
    assert "changed since you saw it" in wrong.json()["detail"]
    by_etag = client.post(
        url, headers={**approver_headers(), "If-Match": f'"{quote["content_hash"]}"'}
    )
    assert by_etag.status_code == 200, by_etag.text


def _tamper(client: TestClient, quote_id: str, **values: Any) -> None:
    from sqlalchemy import update

    from app.db.models import Quote

    with client.app.state.session_factory() as session:  # type: ignore[attr-defined]
        session.execute(update(Quote).where(Quote.id == quote_id).values(**values))
        session.commit()


def test_a_request_changed_underneath_is_not_approved(client: TestClient) -> None:
    """The issue's case: the stored request's seq 48000 became 1000 after pricing."""
    import json as _json

    quote = create(client)
    changed = dict(quote["request"], seq_lens=[16000, 1000])
    _tamper(client, quote["id"], request_json=_json.dumps(changed, sort_keys=True))
    response = approve(client, quote)
    assert response.status_code == 409
    assert "changed after pricing" in response.json()["detail"]
    assert client.get(f"/v1/quotes/{quote['id']}").json()["status"] == "pending"


def test_a_catalog_change_needs_a_reprice_then_approves(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.services import content

    quote = create(client)
    monkeypatch.setattr(content, "catalog_version", lambda: "f" * 64)
    stale = client.get(f"/v1/quotes/{quote['id']}").json()
    assert "catalog changed" in stale["stale"]
    assert approve(client, quote).status_code == 409
    url = f"/v1/quotes/{quote['id']}/reprice"
    assert client.post(url).status_code == 401
    assert client.post(url, headers=requester_headers(OTHER_REQUESTER_TOKEN)).status_code == 403
    repriced = client.post(url, headers=requester_headers())
    assert repriced.status_code == 200, repriced.text
    fresh = repriced.json()
    assert fresh["version"] == 2 and fresh["catalog_version"] == "f" * 64
    assert fresh["content_hash"] != quote["content_hash"] and fresh["stale"] is None
    assert approve(client, quote).status_code == 409  # the hash the approver saw is old
    assert approve(client, fresh).status_code == 200
    outcomes = [t[3] for t in trail(client, quote["id"])]
    assert outcomes == ["ok", "denied", "repriced", "denied", "ok"]


def test_a_decided_quote_cannot_be_repriced(client: TestClient) -> None:
    quote = create(client)
    assert approve(client, quote).status_code == 200
    url = f"/v1/quotes/{quote['id']}/reprice"
    assert client.post(url, headers=approver_headers()).status_code == 409


# --- Idempotency-Key ------------------------------------------------------------------------------


def test_idempotency_key_replays_and_refuses_another_body(client: TestClient) -> None:
    headers = {**requester_headers(), "Idempotency-Key": "retry-7f3a"}
    body = {"request": seed_request(), "title": "once"}
    first = client.post("/v1/quotes", json=body, headers=headers)
    again = client.post("/v1/quotes", json=body, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert len(client.get("/v1/quotes", headers=approver_headers()).json()) == 1
    other = client.post("/v1/quotes", json={**body, "title": "twice"}, headers=headers)
    assert other.status_code == 422
    assert "Idempotency-Key" in other.json()["detail"]
    # keys are per caller: bob's same key is a new quote
    bob = {**requester_headers(OTHER_REQUESTER_TOKEN), "Idempotency-Key": "retry-7f3a"}
    assert client.post("/v1/quotes", json=body, headers=bob).json()["id"] != first.json()["id"]
    bad_key = {**requester_headers(), "Idempotency-Key": "x" * 201}
    assert client.post("/v1/quotes", json=body, headers=bad_key).status_code == 422


def test_unknown_quote_is_404_and_bad_bodies_are_422(sqlite_client: TestClient) -> None:
    assert sqlite_client.get("/v1/quotes/nope").status_code == 404
    assert (
        sqlite_client.post("/v1/quotes/nope/approve", headers=approver_headers()).status_code == 404
    )
    h = requester_headers()
    assert sqlite_client.post("/v1/quotes", json={"title": "x"}, headers=h).status_code == 422
    bad = {"request": seed_request(seq_lens=[0])}
    assert sqlite_client.post("/v1/quotes", json=bad, headers=h).status_code == 422
    extra = {"request": seed_request(), "surprise": 1}
    assert sqlite_client.post("/v1/quotes", json=extra, headers=h).status_code == 422
    assert sqlite_client.post("/v1/quotes", content=b"{not json", headers=h).status_code == 422


def test_concurrent_retries_with_one_idempotency_key_make_one_quote(client: TestClient) -> None:
    from concurrent.futures import ThreadPoolExecutor

    headers = {**requester_headers(), "Idempotency-Key": "burst-1"}
    body = {"request": seed_request(), "title": "burst"}
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(
            pool.map(lambda _: client.post("/v1/quotes", json=body, headers=headers), range(6))
        )
    assert [a.status_code for a in answers] == [201] * 6, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert len(client.get("/v1/quotes", headers=approver_headers()).json()) == 1
