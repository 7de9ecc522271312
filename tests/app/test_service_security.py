"""Tokens (401 without, 403 wrong; hashes only), body size limit (413) and CSRF on forms."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from service_support import (
    APPROVER_TOKEN,
    UPLOAD_TOKEN,
    make_settings,
    memtest_bytes,
    upload_headers,
)

from app.factory import create_app
from app.security import match_token
from app.settings import Settings, hash_token


def test_upload_without_token_is_401(sqlite_client: TestClient) -> None:
    response = sqlite_client.post("/v1/memtests", content=memtest_bytes())
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


def test_upload_with_wrong_or_approver_token_is_403(sqlite_client: TestClient) -> None:
    for token in ("not-the-token", APPROVER_TOKEN):
        response = sqlite_client.post(
            "/v1/memtests",
            content=memtest_bytes(),
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 403


def test_non_bearer_authorization_is_401(sqlite_client: TestClient) -> None:
    response = sqlite_client.post(
        "/v1/memtests", content=memtest_bytes(), headers={"Authorization": f"Basic {UPLOAD_TOKEN}"}
    )
    assert response.status_code == 401


def test_token_is_checked_before_the_body_is_parsed(sqlite_client: TestClient) -> None:
    assert sqlite_client.post("/v1/memtests", content=b"garbage").status_code == 401


def test_settings_keep_only_hashes() -> None:
    settings = Settings(
        database_url="sqlite://",
        upload_tokens=f"ci={UPLOAD_TOKEN}, sha256:{hash_token('other-token-1')}",
    )
    dumped = repr(settings) + settings.model_dump_json()
    assert UPLOAD_TOKEN not in dumped
    assert [t.name for t in settings.upload_tokens] == [
        "ci",
        f"token-{hash_token('other-token-1')[:8]}",
    ]
    assert match_token("other-token-1", settings.upload_tokens) is not None
    assert match_token("other-token-2", settings.upload_tokens) is None
    assert settings.upload_tokens[0].sha256 == hashlib.sha256(UPLOAD_TOKEN.encode()).hexdigest()


def test_tokens_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINFIT_APPROVER_TOKENS", "kral=approve-secret-4567,bob=another-secret")
    monkeypatch.setenv("TRAINFIT_MAX_UPLOAD_BYTES", "4096")
    settings = Settings()
    assert [t.name for t in settings.approver_tokens] == ["kral", "bob"]
    assert settings.max_upload_bytes == 4096


@pytest.mark.parametrize("bad", ["short", "x=sha256:abc", "bad name=long-enough-token"])
def test_bad_token_entries_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        Settings(database_url="sqlite://", upload_tokens=bad)


@pytest.fixture
def small_limit_client(sqlite_url: str) -> Iterator[TestClient]:
    app = create_app(make_settings(sqlite_url, max_upload_bytes=2048))
    with TestClient(app) as client:
        yield client


def test_too_big_by_content_length_is_413(small_limit_client: TestClient) -> None:
    response = small_limit_client.post(
        "/v1/memtests", content=memtest_bytes() + b" " * 4096, headers=upload_headers()
    )
    assert response.status_code == 413


def test_too_big_streamed_without_content_length_is_413(small_limit_client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b" " * 1000

    response = small_limit_client.post("/v1/memtests", content=chunks(), headers=upload_headers())
    assert "content-length" not in {k.lower() for k in response.request.headers}
    assert response.status_code == 413


def test_lying_content_length_is_still_413(sqlite_url: str) -> None:
    """A client that announces a small body and sends a big one (raw ASGI, as a proxy might)."""
    app = create_app(make_settings(sqlite_url, max_upload_bytes=2048))
    transport = httpx.ASGITransport(app=app)

    async def run() -> int:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            request = c.build_request(
                "POST", "/v1/memtests", content=b" " * 5000, headers=upload_headers()
            )
            request.headers["content-length"] = "100"
            return (await c.send(request)).status_code

    import anyio

    from app.db.migrate import upgrade_head

    upgrade_head(app.state.engine)
    assert anyio.run(run) == 413


def test_json_endpoints_also_have_the_limit(small_limit_client: TestClient) -> None:
    response = small_limit_client.post("/v1/estimate", content=b"[" + b"1," * 5000 + b"1]")
    assert response.status_code == 413


def test_state_changing_form_posts_need_the_csrf_token(sqlite_client: TestClient) -> None:
    response = sqlite_client.post(
        "/quotes", data={"request_json": "{}", "title": "x"}, follow_redirects=False
    )
    assert response.status_code == 403
    assert "CSRF" in response.text
    sqlite_client.cookies.set("trainfit_csrf", "forged.value")
    response = sqlite_client.post(
        "/quotes/abc/decision",
        data={"decision": "approve", "token": APPROVER_TOKEN, "csrf_token": "forged.value"},
        follow_redirects=False,
    )
    assert response.status_code == 403
