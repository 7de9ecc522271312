"""Storage: SQLAlchemy 2 tables, engine set-up, alembic migrations and repositories."""
