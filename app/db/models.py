"""Tables. Byte counts are BigInteger; times are UTC (`UTCDateTime`)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

QUOTE_STATUSES = ("draft", "pending", "approved", "rejected")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on every backend (SQLite stores no zone: read values get UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC) if value is not None else None


class Base(DeclarativeBase):
    pass


class Memtest(Base):
    """One uploaded memtest file. `raw_json` is the upload byte for byte (UTF-8 text);
    `content_sha256` is the sha256 of those bytes, unique, so the same file twice is one row."""

    __tablename__ = "memtests"
    __table_args__ = (UniqueConstraint("content_sha256", name="uq_memtests_content_sha256"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    content_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    raw_json: Mapped[str] = mapped_column(Text, nullable=False)
    size_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    schema_id: Mapped[str] = mapped_column(String(64), nullable=False)
    model_name: Mapped[str] = mapped_column(String(200), nullable=False, index=True)
    gpu_name: Mapped[str] = mapped_column(String(200), nullable=False, index=True)
    device: Mapped[str] = mapped_column(String(32), nullable=False, index=True)
    gpu_count: Mapped[int | None] = mapped_column(Integer)
    total_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    uploaded_by: Mapped[str] = mapped_column(String(100), nullable=False, index=True)
    uploaded_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)


class Quote(Base):
    """A saved estimate awaiting (or past) approval: the request and the estimate as computed
    when the quote was made, so a later change of the estimator does not change the quote."""

    __tablename__ = "quotes"
    __table_args__ = (
        CheckConstraint(
            "status IN ('draft', 'pending', 'approved', 'rejected')", name="ck_quotes_status"
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    title: Mapped[str] = mapped_column(String(200), nullable=False, default="")
    request_json: Mapped[str] = mapped_column(Text, nullable=False)
    estimate_json: Mapped[str] = mapped_column(Text, nullable=False)
    created_by: Mapped[str] = mapped_column(String(100), nullable=False, index=True)
    status: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    approver: Mapped[str | None] = mapped_column(String(100))
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    comment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(
        UTCDateTime, nullable=False, default=utcnow, index=True
    )
    # what an approval is bound to (app.services.content): sha256 over the canonical JSON of
    # request + estimate + the catalog and profile versions it was priced with. NULL for quotes
    # stored before revision 0002: they must be re-priced before they can be approved.
    content_hash: Mapped[str | None] = mapped_column(String(64))
    catalog_version: Mapped[str | None] = mapped_column(String(64))
    profile_version: Mapped[str | None] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer, nullable=False, default=1, server_default="1")


class AuditEntry(Base):
    """Every status change of a quote, creation included (`from_status` NULL), every re-pricing
    (`outcome` "repriced") and every refused decision or submission (`outcome` "denied", the
    reason in `comment`; `to_status` is then the status that was asked for)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    quote_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("quotes.id", ondelete="CASCADE"), nullable=False, index=True
    )
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16), nullable=False)
    actor: Mapped[str] = mapped_column(String(100), nullable=False)
    comment: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    outcome: Mapped[str] = mapped_column(
        String(16), nullable=False, default="ok", server_default="ok"
    )


class IdempotencyKey(Base):
    """An `Idempotency-Key` seen on a create: per (scope, actor, key) the sha256 of the body it
    came with and the resource it made, so a retry gets the same answer and a different body
    under the same key is refused."""

    __tablename__ = "idempotency_keys"

    scope: Mapped[str] = mapped_column(String(16), primary_key=True)
    actor: Mapped[str] = mapped_column(String(100), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    body_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    resource_id: Mapped[str] = mapped_column(String(32), nullable=False)
    status_code: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, default=utcnow)
