"""Run the alembic migrations in `app/migrations` programmatically (`alembic upgrade head`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
_PG_LOCK_ID = 0x7472_6169  # "trai": one migrating process at a time on PostgreSQL


def alembic_config(database_url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url:
        cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade_head(engine: Engine) -> None:
    """Bring the database to the newest revision. On PostgreSQL an advisory lock serialises
    workers that start at the same moment."""
    cfg = alembic_config()
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_ID})
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")
