"""Fixtures for the service tests: a database on SQLite and on PostgreSQL (a fresh schema per
test, so parallel runs never collide) and an app with known tokens."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import (
    PG_ADMIN_URL,
    install_fake_library,
    make_settings,
    postgres_unreachable,
    start_live_server,
)

from app.factory import create_app


@pytest.fixture(scope="session")
def postgres_skip_reason() -> str | None:
    return postgres_unreachable()


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
)
def database_url(
    request: pytest.FixtureRequest, tmp_path: Any, postgres_skip_reason: str | None
) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'trainfit.db'}"
        return
    if postgres_skip_reason:
        pytest.skip(postgres_skip_reason)
    import psycopg

    schema = f"tf_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield (
            f"postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"
        )
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'trainfit.db'}"


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    """An app on each backend (storage tests)."""
    with TestClient(create_app(make_settings(database_url))) as test_client:
        yield test_client


@pytest.fixture
def sqlite_client(sqlite_url: str) -> Iterator[TestClient]:
    """An app on SQLite only (tests whose subject is not storage)."""
    with TestClient(create_app(make_settings(sqlite_url))) as test_client:
        yield test_client


@pytest.fixture
def fake_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace the estimator calls with the documented shapes (see service_support)."""
    install_fake_library(monkeypatch)


@pytest.fixture
def live_server(sqlite_url: str) -> Iterator[str]:
    """The app under uvicorn on a free loopback port (in a thread); yields its base URL."""
    server, thread, url = start_live_server(make_settings(sqlite_url))
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
