"""Storage on SQLite and PostgreSQL: migrations, dedupe, quote status changes, audit trail."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from service_support import memtest_bytes
from sqlalchemy import Engine, inspect
from sqlalchemy.orm import Session, sessionmaker

from app.db import repository
from app.db.engine import make_engine, make_session_factory
from app.db.migrate import upgrade_head
from app.services.memtests import parse_upload


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    upgrade_head(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(engine)


def test_migrations_create_the_tables_and_indexes_and_rerun_cleanly(engine: Engine) -> None:
    upgrade_head(engine)  # a second start-up is a no-op
    inspector = inspect(engine)
    assert {"memtests", "quotes", "audit_log", "alembic_version"} <= set(
        inspector.get_table_names()
    )
    indexed = {tuple(ix["column_names"]) for ix in inspector.get_indexes("memtests")}
    for column in ("model_name", "gpu_name", "device", "created_at", "uploaded_by"):
        assert (column,) in indexed
    uniques = inspector.get_unique_constraints("memtests")
    assert any(u["column_names"] == ["content_sha256"] for u in uniques)


def test_sqlite_uses_wal(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    engine.dispose()


def test_add_memtest_dedupes_by_content_hash(factory: sessionmaker[Session]) -> None:
    parsed = parse_upload(memtest_bytes())
    with factory() as session:
        first, created = repository.add_memtest(
            session, raw=parsed.text, sha256=parsed.sha256, fields=parsed.fields, uploaded_by="a"
        )
        assert created
    with factory() as session:
        again, created = repository.add_memtest(
            session, raw=parsed.text, sha256=parsed.sha256, fields=parsed.fields, uploaded_by="b"
        )
        assert not created
        assert again.id == first.id
        assert again.uploaded_by == "a"
        assert again.raw_json == parsed.text
        assert again.created_at is not None and again.created_at.utcoffset() is not None


def test_racing_inserts_fall_back_to_the_existing_row(factory: sessionmaker[Session]) -> None:
    parsed = parse_upload(memtest_bytes(created_at="2026-10-09T00:00:00Z"))

    def insert(i: int) -> tuple[str, bool]:
        with factory() as session:
            row, created = repository.add_memtest(
                session,
                raw=parsed.text,
                sha256=parsed.sha256,
                fields=parsed.fields,
                uploaded_by=f"u{i}",
            )
            return row.id, created

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(insert, range(16)))
    assert len({r for r, _ in results}) == 1
    assert [c for _, c in results].count(True) == 1


def _quote(session: Session, status: str = "pending") -> str:
    quote = repository.add_quote(
        session,
        title="t",
        request={"model": {"preset": "x"}},
        estimate={"rows": []},
        created_by="alice",
        status=status,
    )
    return quote.id


def test_quote_lifecycle_is_audited(factory: sessionmaker[Session]) -> None:
    with factory() as session:
        quote_id = _quote(session, status="draft")
        repository.change_quote_status(
            session, quote_id, to_status="pending", actor="alice", comment=None
        )
        approved = repository.change_quote_status(
            session, quote_id, to_status="approved", actor="kral", comment="go"
        )
        assert approved is not None
        assert (approved.status, approved.approver, approved.comment) == ("approved", "kral", "go")
        assert approved.decided_at is not None
        trail = repository.audit_trail(session, quote_id)
    assert [(e.from_status, e.to_status, e.actor) for e in trail] == [
        (None, "draft", "alice"),
        ("draft", "pending", "alice"),
        ("pending", "approved", "kral"),
    ]


def test_a_decided_quote_cannot_be_decided_again(factory: sessionmaker[Session]) -> None:
    with factory() as session:
        quote_id = _quote(session)
        repository.change_quote_status(
            session, quote_id, to_status="rejected", actor="kral", comment="too dear"
        )
        with pytest.raises(repository.TransitionError):
            repository.change_quote_status(
                session, quote_id, to_status="approved", actor="kral", comment=None
            )
        assert (
            repository.change_quote_status(
                session, "missing", to_status="approved", actor="kral", comment=None
            )
            is None
        )


def test_concurrent_approvals_record_one_decision(factory: sessionmaker[Session]) -> None:
    with factory() as session:
        quote_id = _quote(session)

    def decide(i: int) -> str:
        with factory() as session:
            try:
                repository.change_quote_status(
                    session,
                    quote_id,
                    to_status="approved" if i % 2 else "rejected",
                    actor=f"a{i}",
                    comment=None,
                )
            except repository.TransitionError:
                return "refused"
            return "done"

    with ThreadPoolExecutor(max_workers=6) as pool:
        outcomes = list(pool.map(decide, range(12)))
    assert outcomes.count("done") == 1
    with factory() as session:
        assert len(repository.audit_trail(session, quote_id)) == 2


def test_status_check_constraint(factory: sessionmaker[Session]) -> None:
    from sqlalchemy.exc import IntegrityError

    with factory() as session, pytest.raises(IntegrityError):
        _quote(session, status="bogus")
