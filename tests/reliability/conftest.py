"""Fixtures for the reliability tests. The service test helpers (`service_support`) live in
tests/app; this folder reuses them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for extra in (HERE, HERE.parent / "app", HERE.parent.parent):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from service_support import postgres_unreachable  # noqa: E402


@pytest.fixture(scope="session")
def pg_skip_reason() -> str | None:
    return postgres_unreachable()


@pytest.fixture
def pg_database(pg_skip_reason: str | None) -> Iterator[str]:
    """A uniquely named PostgreSQL schema for one test, dropped afterwards."""
    if pg_skip_reason:
        pytest.skip(pg_skip_reason)
    from bench.durability import pg_schema

    with pg_schema() as url:
        yield url
