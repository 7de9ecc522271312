"""quote content hash and versions, audit outcome, idempotency keys

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("quotes") as batch:
        batch.add_column(sa.Column("content_hash", sa.String(64)))
        batch.add_column(sa.Column("catalog_version", sa.String(64)))
        batch.add_column(sa.Column("profile_version", sa.String(64)))
        batch.add_column(sa.Column("version", sa.Integer(), nullable=False, server_default="1"))
    with op.batch_alter_table("audit_log") as batch:
        batch.add_column(sa.Column("outcome", sa.String(16), nullable=False, server_default="ok"))
    op.create_index("ix_quotes_created_by", "quotes", ["created_by"])
    op.create_table(
        "idempotency_keys",
        sa.Column("scope", sa.String(16), primary_key=True),
        sa.Column("actor", sa.String(100), primary_key=True),
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("resource_id", sa.String(32), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    op.drop_index("ix_quotes_created_by", "quotes")
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("outcome")
    with op.batch_alter_table("quotes") as batch:
        for column in ("version", "profile_version", "catalog_version", "content_hash"):
            batch.drop_column(column)
