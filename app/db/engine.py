"""Engine and session factory. SQLite gets WAL mode, a busy timeout and foreign keys."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

POOL_SIZE = 10
MAX_OVERFLOW = 10


def is_memory_sqlite(database_url: str) -> bool:
    url = make_url(database_url)
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def make_engine(
    database_url: str,
    *,
    busy_timeout_ms: int = 5000,
    pool_size: int = POOL_SIZE,
    max_overflow: int = MAX_OVERFLOW,
) -> Engine:
    """The pool holds `pool_size + max_overflow` connections: the app's database slots
    (app/db/slots.py) match it, so no request waits for a connection in a worker thread."""
    url = make_url(database_url)
    pool: dict[str, Any] = {"pool_size": pool_size, "max_overflow": max_overflow}
    if url.get_backend_name() == "sqlite":
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
            **({} if is_memory_sqlite(database_url) else pool),
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            if url.database not in (None, "", ":memory:"):
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **pool)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)
