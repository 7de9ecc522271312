"""Issue 16, item 1: 56 simultaneous `GET /v1/quotes/{id}` froze the service (40 x 500 after
30 s: worker threads waited for pool connections held by requests that needed a worker thread
to finish). Now sessions hold a database slot (no more than pool connections) and are closed
before the response; a saturated service answers 503 + Retry-After; /healthz is in-process."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from live import live_server
from service_support import make_settings, requester_headers

from app.db.slots import DatabaseBusy, DbSlots
from app.factory import create_app

REQUEST = {"model": {"preset": "qwen3.5-27b"}, "seq_lens": [4096], "gpus": ["h200"]}
BURST = 56  # the figure: 40 worker threads + 15 pooled connections + 1


async def _burst(url: str, path: str, n: int) -> Counter[int | str]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=20, limits=limits) as http:

        async def one() -> int | str:
            try:
                return (await http.get(path)).status_code
            except httpx.HTTPError as exc:  # the old code: a ReadTimeout (500s came at 30 s)
                return type(exc).__name__

        return Counter(await asyncio.gather(*(one() for _ in range(n))))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'burst.db'}"
    else:
        yield request.getfixturevalue("pg_database")


def test_56_simultaneous_reads_all_answer(database: str) -> None:
    with live_server(make_settings(database)) as url:
        created = httpx.post(
            f"{url}/v1/quotes", json={"request": REQUEST}, headers=requester_headers(), timeout=60
        )
        assert created.status_code == 201, created.text
        path = f"/v1/quotes/{created.json()['id']}"
        for _ in range(2):  # twice: the first burst must leave nothing held
            started = time.monotonic()
            statuses = asyncio.run(_burst(url, path, BURST))
            elapsed = time.monotonic() - started
            assert statuses == Counter({200: BURST}), (statuses, f"{elapsed:.1f} s")
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200


def test_saturated_database_slots_answer_503_with_retry_after(tmp_path: Path) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", db_slot_wait_s=0.05)
    with TestClient(create_app(settings)) as client:
        slots: DbSlots = client.app.state.db_slots  # type: ignore[attr-defined]
        assert slots.capacity == settings.db_pool_size + settings.db_max_overflow
        for _ in range(slots.capacity):  # every slot taken (by requests that never finish)
            client.portal.call(slots._sem().acquire)  # type: ignore[union-attr]
        busy = client.get("/v1/quotes/some-id")
        assert busy.status_code == 503, busy.text
        assert busy.headers["retry-after"] == "1"
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200  # liveness needs no database
        client.portal.call(slots._sem().release)  # type: ignore[union-attr]
        assert client.get("/v1/quotes/some-id").status_code == 404


def test_slots_wait_then_refuse() -> None:
    async def scenario() -> tuple[int, bool]:
        slots = DbSlots(1, wait_s=0.05)
        async with slots.hold():
            held = slots.in_use
            try:
                async with slots.hold():
                    refused = False
            except DatabaseBusy as exc:
                refused = exc.status_code == 503 and exc.headers == {"Retry-After": "1"}
        return held, refused and slots.in_use == 0

    assert asyncio.run(scenario()) == (1, True)


def test_healthz_is_in_process_and_readyz_checks_the_database() -> None:
    # a PostgreSQL URL nobody listens on: the process is alive, the database is not ready
    settings = make_settings(
        "postgresql+psycopg://postgres@127.0.0.1:9/none?connect_timeout=1", run_migrations=False
    )
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
        assert "database unavailable" in ready.json()["detail"]
        assert client.get("/v1/quotes/x").status_code == 503  # not a 500
