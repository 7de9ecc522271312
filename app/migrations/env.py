"""Alembic environment: uses the connection handed over by `app.db.migrate.upgrade_head`, or
`sqlalchemy.url` / `TRAINFIT_DATABASE_URL` when run from the `alembic` command line."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from app.db.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite ALTER TABLE support for later revisions
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = (
        config.get_main_option("sqlalchemy.url")
        or os.environ.get("TRAINFIT_DATABASE_URL")
        or "sqlite:///trainfit.db"
    )
    engine = create_engine(url)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


def run_migrations_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("TRAINFIT_DATABASE_URL")
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
