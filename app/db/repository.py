"""Storage operations. Each function owns its transaction (commit or rollback)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import AuditEntry, Memtest, Quote, utcnow

MEMTEST_ID_HEX = 16  # the id is the first 16 hex digits of the file's sha256


@dataclass(frozen=True)
class MemtestFields:
    """What is indexed from a memtest document (the file itself is kept verbatim)."""

    schema_id: str
    model_name: str
    gpu_name: str
    device: str
    gpu_count: int | None
    total_memory_bytes: int | None
    created_at: datetime | None


def add_memtest(
    session: Session, *, raw: str, sha256: str, fields: MemtestFields, uploaded_by: str
) -> tuple[Memtest, bool]:
    """Insert a memtest unless a file with the same sha256 exists. Returns (row, created).

    Safe under concurrent uploads of the same file: the UNIQUE constraint decides, and the loser
    of the race reads the winner's row."""
    existing = session.scalar(select(Memtest).where(Memtest.content_sha256 == sha256))
    if existing is not None:
        return existing, False
    row = Memtest(
        id=sha256[:MEMTEST_ID_HEX],
        content_sha256=sha256,
        raw_json=raw,
        size_bytes=len(raw.encode("utf-8")),
        schema_id=fields.schema_id,
        model_name=fields.model_name[:200],
        gpu_name=fields.gpu_name[:200],
        device=fields.device[:32],
        gpu_count=fields.gpu_count,
        total_memory_bytes=fields.total_memory_bytes,
        created_at=fields.created_at,
        uploaded_by=uploaded_by,
        uploaded_at=utcnow(),
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = session.scalar(select(Memtest).where(Memtest.content_sha256 == sha256))
        if existing is None:  # not a duplicate file: a real constraint violation
            raise
        return existing, False
    return row, True


def get_memtest(session: Session, memtest_id: str) -> Memtest | None:
    return session.get(Memtest, memtest_id)


def list_memtests(
    session: Session,
    *,
    model: str | None = None,
    gpu: str | None = None,
    device: str | None = None,
    uploaded_by: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[Memtest], int]:
    """Newest first; filters match exactly. Returns (page, total matching)."""
    query = select(Memtest)
    if model is not None:
        query = query.where(Memtest.model_name == model)
    if gpu is not None:
        query = query.where(Memtest.gpu_name == gpu)
    if device is not None:
        query = query.where(Memtest.device == device)
    if uploaded_by is not None:
        query = query.where(Memtest.uploaded_by == uploaded_by)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(
        query.order_by(Memtest.uploaded_at.desc(), Memtest.id).limit(limit).offset(offset)
    ).all()
    return list(rows), int(total)


def new_quote_id() -> str:
    return secrets.token_hex(8)


def add_quote(
    session: Session,
    *,
    title: str,
    request: dict[str, Any],
    estimate: dict[str, Any],
    created_by: str,
    status: str = "pending",
    comment: str | None = None,
) -> Quote:
    now = utcnow()
    quote = Quote(
        id=new_quote_id(),
        title=title,
        request_json=json.dumps(request, sort_keys=True),
        estimate_json=json.dumps(estimate),  # key order kept: it is the GPU column order
        created_by=created_by,
        status=status,
        comment=None,
        created_at=now,
    )
    session.add(quote)
    session.flush()
    session.add(
        AuditEntry(
            quote_id=quote.id,
            from_status=None,
            to_status=status,
            actor=created_by,
            comment=comment,
            at=now,
        )
    )
    session.commit()
    return quote


def get_quote(session: Session, quote_id: str) -> Quote | None:
    return session.get(Quote, quote_id)


def list_quotes(
    session: Session, *, status: str | None = None, limit: int = 100, offset: int = 0
) -> list[Quote]:
    query = select(Quote)
    if status is not None:
        query = query.where(Quote.status == status)
    query = query.order_by(Quote.created_at.desc(), Quote.id).limit(limit).offset(offset)
    return list(session.scalars(query).all())


def audit_trail(session: Session, quote_id: str) -> list[AuditEntry]:
    query = select(AuditEntry).where(AuditEntry.quote_id == quote_id).order_by(AuditEntry.id)
    return list(session.scalars(query).all())


class TransitionError(Exception):
    """The quote is not in a state from which this change is allowed."""

    def __init__(self, current: str, wanted: str) -> None:
        super().__init__(f"quote is {current}; cannot change it to {wanted}")
        self.current = current
        self.wanted = wanted


ALLOWED_TRANSITIONS: dict[str, tuple[str, ...]] = {
    "pending": ("draft",),
    "approved": ("pending",),
    "rejected": ("pending",),
}


def change_quote_status(
    session: Session, quote_id: str, *, to_status: str, actor: str, comment: str | None
) -> Quote | None:
    """Atomic compare-and-set of the status, with its audit entry in the same transaction.
    Returns None when the quote does not exist; raises TransitionError when not allowed
    (e.g. approving a quote that was approved or rejected meanwhile)."""
    quote = session.get(Quote, quote_id)
    if quote is None:
        return None
    current = quote.status
    if current not in ALLOWED_TRANSITIONS.get(to_status, ()):
        raise TransitionError(current, to_status)
    now = utcnow()
    decided = to_status in ("approved", "rejected")
    values: dict[str, Any] = {"status": to_status}
    if decided:
        values.update(approver=actor, decided_at=now, comment=comment)
    result = session.execute(
        update(Quote)
        .where(Quote.id == quote_id, Quote.status == current)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        session.expire_all()
        fresh = session.get(Quote, quote_id)
        raise TransitionError(fresh.status if fresh else "gone", to_status)
    session.add(
        AuditEntry(
            quote_id=quote_id,
            from_status=current,
            to_status=to_status,
            actor=actor,
            comment=comment,
            at=now,
        )
    )
    session.commit()
    session.refresh(quote)
    return quote
