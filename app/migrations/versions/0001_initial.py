"""memtests, quotes, audit_log

Revision ID: 0001
Revises:
Create Date: 2026-10-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "memtests",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("content_sha256", sa.String(64), nullable=False),
        sa.Column("raw_json", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("schema_id", sa.String(64), nullable=False),
        sa.Column("model_name", sa.String(200), nullable=False),
        sa.Column("gpu_name", sa.String(200), nullable=False),
        sa.Column("device", sa.String(32), nullable=False),
        sa.Column("gpu_count", sa.Integer()),
        sa.Column("total_memory_bytes", sa.BigInteger()),
        sa.Column("created_at", sa.DateTime(timezone=True)),
        sa.Column("uploaded_by", sa.String(100), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("content_sha256", name="uq_memtests_content_sha256"),
    )
    for column in ("model_name", "gpu_name", "device", "created_at", "uploaded_by"):
        op.create_index(f"ix_memtests_{column}", "memtests", [column])

    op.create_table(
        "quotes",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("request_json", sa.Text(), nullable=False),
        sa.Column("estimate_json", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(100), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("approver", sa.String(100)),
        sa.Column("decided_at", sa.DateTime(timezone=True)),
        sa.Column("comment", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('draft', 'pending', 'approved', 'rejected')", name="ck_quotes_status"
        ),
    )
    op.create_index("ix_quotes_status", "quotes", ["status"])
    op.create_index("ix_quotes_created_at", "quotes", ["created_at"])

    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "quote_id",
            sa.String(32),
            sa.ForeignKey("quotes.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("from_status", sa.String(16)),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("comment", sa.Text()),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_audit_log_quote_id", "audit_log", ["quote_id"])


def downgrade() -> None:
    op.drop_table("audit_log")
    op.drop_table("quotes")
    op.drop_table("memtests")
