"""Kill test (quick mode of bench/durability.py) and the backup/restore round trip, on SQLite
and on PostgreSQL."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_support import (
    approver_headers,
    make_settings,
    memtest_bytes,
    requester_headers,
    upload_headers,
)

from app.backup import BackupError, backup, restore, snapshot
from app.factory import create_app
from bench import durability
from bench import harness as durability_harness

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_kill_test_loses_nothing(database: str, tmp_path: Path) -> None:
    """Writes through the API only; the app (SQLite: with a WAL checkpointer, mid-checkpoint)
    and, on PostgreSQL, the database itself (`pg_ctl stop -m immediate` on a private cluster)
    are killed in turn; every round is verified. Bounded: 10 s of load, at least two kills
    (the load goes on past 10 s on a slow machine until they are done), ~30 s in all."""
    if database == "postgresql" and durability_harness.postgres_bin() is None:
        pytest.skip("initdb/pg_ctl not installed (/usr/lib/postgresql/*/bin)")
    outcome = durability.run(
        database, clients=12, seconds=10, kill_every=1.5, min_kills=2, log_dir=tmp_path
    )
    assert outcome.kills >= 2, outcome
    if database == "postgresql":
        assert "database" in {r.killed for r in outcome.rounds}, outcome.rounds
    else:
        assert {r.killed for r in outcome.rounds} == {"app+checkpoint"}
    for tally in [*outcome.rounds, outcome.final]:
        assert tally is not None and tally.ok, tally
    final = outcome.final
    assert final is not None
    assert final.uploads_acknowledged > 0 and final.quotes_acknowledged > 0
    assert final.decisions_acknowledged > 0
    assert outcome.server_errors == 0, outcome.statuses
    assert outcome.duplicate_quotes == 0 and outcome.audit_problems == []
    assert outcome.ok


def _populate(url: str) -> None:
    with TestClient(create_app(make_settings(url))) as client:
        for n in range(3):
            body = memtest_bytes(created_at=f"2026-10-0{n + 1}T09:30:00Z")
            assert (
                client.post("/v1/memtests", content=body, headers=upload_headers()).status_code
                == 201
            )
        request = {"model": {"preset": "qwen3.5-27b"}, "seq_lens": [4096], "gpus": ["h200"]}
        quotes = []
        for n in range(3):
            r = client.post(
                "/v1/quotes",
                json={"request": request, "title": f"q{n} <b>é</b>"},
                headers=requester_headers(),
            )
            assert r.status_code == 201, r.text
            quotes.append(r.json())
        approve = {"comment": "ok", "content_hash": quotes[0]["content_hash"]}
        assert (
            client.post(
                f"/v1/quotes/{quotes[0]['id']}/approve", json=approve, headers=approver_headers()
            ).status_code
            == 200
        )
        assert (
            client.post(
                f"/v1/quotes/{quotes[1]['id']}/reject", headers=approver_headers()
            ).status_code
            == 200
        )


def test_backup_restore_round_trip_across_backends(tmp_path: Path, pg_database: str) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'a.db'}"
    _populate(sqlite_url)
    first = backup(sqlite_url, tmp_path / "a.tfbackup")
    assert first.counts == {"memtests": 3, "quotes": 3, "audit_log": 5}
    restore(pg_database, tmp_path / "a.tfbackup")
    assert snapshot(pg_database) == snapshot(sqlite_url)
    second = backup(pg_database, tmp_path / "b.tfbackup")
    back = f"sqlite:///{tmp_path / 'c.db'}"
    restore(back, second.path)
    assert snapshot(back) == snapshot(sqlite_url)
    # the restored service works: a new decision appends to the audit log (PG sequence moved)
    with TestClient(create_app(make_settings(pg_database))) as client:
        pending = client.get(
            "/v1/quotes", params={"status": "pending"}, headers=approver_headers()
        ).json()[0]["id"]
        quote = client.get(f"/v1/quotes/{pending}").json()
        r = client.post(
            f"/v1/quotes/{pending}/approve",
            json={"content_hash": quote["content_hash"]},
            headers=approver_headers(),
        )
        assert r.status_code == 200 and len(r.json()["audit"]) == 2
        assert client.get("/v1/memtests").json()["total"] == 3


def test_restore_refuses_non_empty_and_corrupt(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _populate(url)
    path = tmp_path / "a.tfbackup"
    backup(url, path)
    with pytest.raises(BackupError, match="already holds"):
        restore(url, path)
    restore(url, path, replace=True)
    lines = gzip.decompress(path.read_bytes()).splitlines()
    record = json.loads(lines[1])
    record["row"]["raw_json"] += " "
    (tmp_path / "bad.tfbackup").write_bytes(
        gzip.compress(b"\n".join([lines[0], json.dumps(record).encode(), *lines[2:]]))
    )
    with pytest.raises(BackupError, match="sha256"):
        restore(f"sqlite:///{tmp_path / 'x.db'}", tmp_path / "bad.tfbackup")
    (tmp_path / "trunc.tfbackup").write_bytes(path.read_bytes()[:40])
    with pytest.raises(BackupError):
        restore(f"sqlite:///{tmp_path / 'y.db'}", tmp_path / "trunc.tfbackup")
