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

from app.db.models import AuditEntry, IdempotencyKey, Memtest, Quote, utcnow

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


@dataclass(frozen=True)
class Content:
    """What a quote's approval is bound to (app.services.content)."""

    content_hash: str
    catalog_version: str
    profile_version: str


@dataclass(frozen=True)
class IdempotencyClaim:
    """An `Idempotency-Key` to record with the row it creates (same transaction)."""

    scope: str
    actor: str
    key: str
    body_sha256: str
    status_code: int = 201


class IdempotencyReplay(Exception):
    """The key was used before (possibly by a concurrent request that won the race)."""

    def __init__(self, record: IdempotencyKey) -> None:
        super().__init__(f"idempotency key {record.key!r} already used")
        self.record = record


def get_idempotency(session: Session, scope: str, actor: str, key: str) -> IdempotencyKey | None:
    return session.get(IdempotencyKey, (scope, actor, key))


def _claim_row(claim: IdempotencyClaim, resource_id: str, now: datetime) -> IdempotencyKey:
    return IdempotencyKey(
        scope=claim.scope,
        actor=claim.actor,
        key=claim.key,
        body_sha256=claim.body_sha256,
        resource_id=resource_id,
        status_code=claim.status_code,
        created_at=now,
    )


def _commit_claimed(session: Session, claim: IdempotencyClaim | None) -> None:
    """Commit; when the key's row lost a race, roll back and raise with the winner's record."""
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        if claim is None:
            raise
        record = get_idempotency(session, claim.scope, claim.actor, claim.key)
        if record is None:
            raise
        raise IdempotencyReplay(record) from None


def record_idempotency(session: Session, claim: IdempotencyClaim, resource_id: str) -> None:
    """For resources created without add_quote (memtests): the key alone, committed."""
    session.add(_claim_row(claim, resource_id, utcnow()))
    _commit_claimed(session, claim)


def add_quote(
    session: Session,
    *,
    title: str,
    request: dict[str, Any],
    estimate: dict[str, Any],
    created_by: str,
    status: str = "pending",
    comment: str | None = None,
    content: Content | None = None,
    idempotency: IdempotencyClaim | None = None,
) -> Quote:
    """Insert a quote and its creation audit entry (and the idempotency key, if any) in one
    transaction. Raises IdempotencyReplay when the key was claimed meanwhile."""
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
        content_hash=content.content_hash if content else None,
        catalog_version=content.catalog_version if content else None,
        profile_version=content.profile_version if content else None,
        version=1,
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
    if idempotency is not None:
        session.add(_claim_row(idempotency, quote.id, now))
    _commit_claimed(session, idempotency)
    return quote


def get_quote(session: Session, quote_id: str) -> Quote | None:
    return session.get(Quote, quote_id)


def list_quotes(
    session: Session,
    *,
    status: str | None = None,
    created_by: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Quote]:
    query = select(Quote)
    if status is not None:
        query = query.where(Quote.status == status)
    if created_by is not None:
        query = query.where(Quote.created_by == created_by)
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


class ContentChanged(Exception):
    """The quote's content hash is not the one the decision was made on."""


ALLOWED_TRANSITIONS: dict[str, tuple[str, ...]] = {
    "pending": ("draft",),
    "approved": ("pending",),
    "rejected": ("pending",),
}


def change_quote_status(
    session: Session,
    quote_id: str,
    *,
    to_status: str,
    actor: str,
    comment: str | None,
    expected_hash: str | None = None,
) -> Quote | None:
    """Atomic compare-and-set of the status (and, with `expected_hash`, of the content hash),
    with its audit entry in the same transaction. Returns None when the quote does not exist;
    raises TransitionError when not allowed (e.g. approving a quote that was approved or
    rejected meanwhile) and ContentChanged when the content was re-priced meanwhile."""
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
    condition = [Quote.id == quote_id, Quote.status == current]
    if expected_hash is not None:
        condition.append(Quote.content_hash == expected_hash)
    result = session.execute(
        update(Quote)
        .where(*condition)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        session.expire_all()
        fresh = session.get(Quote, quote_id)
        if fresh is not None and fresh.status == current:
            raise ContentChanged(f"quote {quote_id} was re-priced meanwhile: reload it")
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


def record_denied(session: Session, quote: Quote, *, wanted: str, actor: str, reason: str) -> None:
    """Audit a refused decision or submission (the quote itself is unchanged)."""
    session.rollback()
    session.add(
        AuditEntry(
            quote_id=quote.id,
            from_status=quote.status,
            to_status=wanted,
            actor=actor[:100],
            comment=reason[:1000],
            at=utcnow(),
            outcome="denied",
        )
    )
    session.commit()


REPRICEABLE = ("draft", "pending")


def reprice_quote(
    session: Session,
    quote: Quote,
    *,
    estimate: dict[str, Any],
    content: Content,
    actor: str,
) -> Quote:
    """Store a newly computed estimate with its content hash and versions as the next version
    (compare-and-set on the version the caller read). Raises TransitionError when the quote is
    no longer a draft or pending, ContentChanged when another re-pricing won."""
    read_version, read_status, old_hash = quote.version, quote.status, quote.content_hash
    if read_status not in REPRICEABLE:
        raise TransitionError(read_status, "re-priced")
    result = session.execute(
        update(Quote)
        .where(Quote.id == quote.id, Quote.version == read_version, Quote.status == read_status)
        .values(
            estimate_json=json.dumps(estimate),
            content_hash=content.content_hash,
            catalog_version=content.catalog_version,
            profile_version=content.profile_version,
            version=read_version + 1,
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        session.expire_all()
        fresh = session.get(Quote, quote.id)
        if fresh is None or fresh.status not in REPRICEABLE:
            raise TransitionError(fresh.status if fresh else "gone", "re-priced")
        raise ContentChanged(f"quote {quote.id} was changed meanwhile: reload it")
    session.add(
        AuditEntry(
            quote_id=quote.id,
            from_status=read_status,
            to_status=read_status,
            actor=actor,
            comment=f"re-priced: content {(old_hash or 'none')[:12]} -> "
            f"{content.content_hash[:12]} (version {read_version + 1})",
            at=utcnow(),
            outcome="repriced",
        )
    )
    session.commit()
    session.refresh(quote)
    return quote
