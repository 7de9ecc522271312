"""`trainfit db backup` / `trainfit db restore`: a portable, consistent copy of the service's data.

The backup is one gzip'd JSON-lines file: a header line
`{"format": "trainfit.backup/1", "alembic_revision": ..., "created_at": ..., "counts": {...}}`
then one line per row, `{"table": "memtests" | "quotes" | "audit_log", "row": {...}}`.
Rows are read in one snapshot (PostgreSQL REPEATABLE READ; SQLite one read transaction), so a
backup taken while the service runs is consistent: no approval without its audit entry.
The format does not depend on the backend: back up SQLite, restore into PostgreSQL, and back.

Restore runs the migrations, refuses a database that already holds data unless `replace=True`
(then it empties the three tables first), inserts every row in one transaction, checks each
memtest's sha256 against its stored bytes, and moves PostgreSQL's audit_log id sequence past
the restored ids.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    Connection,
    DateTime,
    Engine,
    Table,
    delete,
    event,
    func,
    insert,
    select,
    text,
)

from app.db.engine import make_engine
from app.db.migrate import upgrade_head
from app.db.models import AuditEntry, Memtest, Quote, UTCDateTime, utcnow

FORMAT = "trainfit.backup/1"
TABLES: tuple[Table, ...] = (  # insert order (FKs)
    cast(Table, Memtest.__table__),
    cast(Table, Quote.__table__),
    cast(Table, AuditEntry.__table__),
)


class BackupError(Exception):
    """The backup file is not usable, or the target database is not empty."""


@dataclass
class BackupSummary:
    path: str
    counts: dict[str, int] = field(default_factory=dict)
    alembic_revision: str | None = None


def _engine(database_url: str) -> Engine:
    engine = make_engine(database_url)
    if engine.dialect.name == "sqlite":
        # pysqlite defers BEGIN; emit it ourselves so that all reads share one snapshot
        # (SQLAlchemy's documented recipe for SQLite transactions).
        @event.listens_for(engine, "connect")
        def _no_autobegin(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN")

    return engine


def _revision(connection: Connection) -> str | None:
    try:
        value = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except Exception:
        return None
    return str(value) if value is not None else None


def _encode(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def backup(database_url: str, path: str | Path) -> BackupSummary:
    """Write every memtest, quote and audit entry to `path` (gzip'd JSON lines)."""
    path = Path(path)
    engine = _engine(database_url)
    tmp = path.with_name(path.name + ".partial")
    try:
        with engine.connect() as connection:
            if engine.dialect.name == "postgresql":
                connection = connection.execution_options(isolation_level="REPEATABLE READ")
            with connection.begin():
                revision = _revision(connection)
                counts: dict[str, int] = {}
                lines: list[bytes] = []
                for table in TABLES:
                    order = [c for c in table.primary_key.columns]
                    rows = connection.execute(select(table).order_by(*order)).mappings().all()
                    counts[table.name] = len(rows)
                    for row in rows:
                        record = {
                            "table": table.name,
                            "row": {k: _encode(v) for k, v in row.items()},
                        }
                        lines.append(json.dumps(record, ensure_ascii=False).encode() + b"\n")
        header = {
            "format": FORMAT,
            "alembic_revision": revision,
            "created_at": utcnow().isoformat(),
            "counts": counts,
        }
        with gzip.open(tmp, "wb") as out:
            out.write(json.dumps(header).encode() + b"\n")
            out.writelines(lines)
        tmp.replace(path)  # a crash mid-write never leaves a truncated backup under `path`
    finally:
        engine.dispose()
        tmp.unlink(missing_ok=True)
    return BackupSummary(path=str(path), counts=counts, alembic_revision=revision)


def _decode(table: Any, row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in row.items():
        if name not in table.c:
            raise BackupError(f"{table.name}: unknown column {name!r}")
        column = table.c[name]
        if value is not None and isinstance(column.type, UTCDateTime | DateTime):
            value = datetime.fromisoformat(value)
        out[name] = value
    return out


def read_backup(path: str | Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """(header, rows per table) of a backup file; BackupError when it is not one."""
    tables = {t.name: t for t in TABLES}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in tables}
    try:
        with gzip.open(path, "rb") as src:
            header = json.loads(src.readline())
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise BackupError(f"not a {FORMAT} file")
            for number, line in enumerate(src, start=2):
                record = json.loads(line)
                name = record.get("table")
                if name not in tables:
                    raise BackupError(f"line {number}: unknown table {name!r}")
                rows[name].append(_decode(tables[name], record["row"]))
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise BackupError(f"{path}: unreadable backup ({type(exc).__name__}: {exc})") from None
    for name, count in header.get("counts", {}).items():
        if len(rows.get(name, [])) != count:
            raise BackupError(f"{name}: header says {count} rows, file has {len(rows[name])}")
    for row in rows["memtests"]:
        digest = hashlib.sha256(row["raw_json"].encode("utf-8")).hexdigest()
        if digest != row["content_sha256"]:
            raise BackupError(f"memtest {row['id']}: stored bytes do not match their sha256")
    return header, rows


def restore(database_url: str, path: str | Path, *, replace: bool = False) -> BackupSummary:
    """Load a backup into `database_url` (migrated first). Refuses a non-empty database unless
    `replace`; everything happens in one transaction (all or nothing)."""
    header, rows = read_backup(path)
    engine = make_engine(database_url)
    try:
        upgrade_head(engine)
        with engine.begin() as connection:
            present = sum(
                connection.execute(select(func.count()).select_from(t)).scalar_one() for t in TABLES
            )
            if present and not replace:
                raise BackupError(
                    f"the database already holds {present} rows; restore into an empty one "
                    "or pass replace=True (--replace)"
                )
            for table in reversed(TABLES):
                connection.execute(delete(table))
            for table in TABLES:
                if rows[table.name]:
                    connection.execute(insert(table), rows[table.name])
            if engine.dialect.name == "postgresql":
                connection.execute(
                    text(
                        "SELECT setval(pg_get_serial_sequence('audit_log', 'id'), "
                        "COALESCE((SELECT MAX(id) FROM audit_log), 0) + 1, false)"
                    )
                )
    finally:
        engine.dispose()
    return BackupSummary(
        path=str(path),
        counts={name: len(r) for name, r in rows.items()},
        alembic_revision=header.get("alembic_revision"),
    )


def snapshot(database_url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, ordered by primary key (for comparisons in tests)."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            out: dict[str, list[dict[str, Any]]] = {}
            for table in TABLES:
                order = [c for c in table.primary_key.columns]
                result = connection.execute(select(table).order_by(*order)).mappings().all()
                out[table.name] = [{k: _encode(v) for k, v in r.items()} for r in result]
            return out
    finally:
        engine.dispose()


__all__ = ["BackupError", "BackupSummary", "backup", "read_backup", "restore", "snapshot"]
