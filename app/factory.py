"""`create_app(settings)`: the FastAPI application with its database, routes and limits."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app import openapi
from app.api.routes import (
    catalog,
    docs,
    estimates,
    health,
    memtests,
    pages,
    pages_memtests,
    pages_quotes,
    quotes,
    solvers,
)
from app.api.routes.docs import DOCS_STATIC_URL, docs_static_dir
from app.db.engine import is_memory_sqlite, make_engine, make_session_factory
from app.db.migrate import upgrade_head
from app.db.slots import DbSlots
from app.errors import install_error_handlers
from app.headers import SecurityHeaders
from app.limits import BodySizeLimit, RejectNul
from app.settings import Settings

STATIC_DIR = Path(__file__).resolve().parent / "static"

DESCRIPTION = """Capacity planner and cost estimator for LLM training.

Estimates and checks are open. Uploading memtests needs an upload token and approving quotes an
approver token: `Authorization: Bearer <token>`. All memory figures in JSON are bytes.
"""


def _version() -> str:
    try:
        return version("trainfit")
    except PackageNotFoundError:
        return "0.0.0"


def pool_capacity(settings: Settings) -> int:
    return settings.db_pool_size + settings.db_max_overflow


def freeze_start_up_objects() -> None:
    """Collect the start-up's garbage, then exempt what is left (modules, routes, catalog,
    caches: alive as long as the process) from every later collection (`gc.freeze`, the
    Python docs' advice for long-lived processes). Requests' own cycles are still collected;
    a full collection no longer walks the start-up's ~130k objects (~26 ms each time on this
    machine, `bench/speed.py`'s `rest_gc_full`)."""
    gc.collect()
    gc.freeze()


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app. The engine is created here; migrations run at start-up (lifespan)."""
    settings = settings or Settings()
    engine = make_engine(
        settings.database_url,
        busy_timeout_ms=settings.sqlite_busy_timeout_ms,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.run_migrations:
            upgrade_head(engine)
        if settings.gc_freeze:
            freeze_start_up_objects()
        yield
        engine.dispose()

    app = FastAPI(
        title="trainfit",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from local files by app/api/routes/docs.py
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = make_session_factory(engine)
    app.state.db_slots = DbSlots(
        1 if is_memory_sqlite(settings.database_url) else pool_capacity(settings),
        wait_s=settings.db_slot_wait_s,
    )
    app.state.version = _version()

    install_error_handlers(app)
    openapi.install(app)
    pages_all = (pages, pages_quotes, pages_memtests, docs)
    for module in (health, catalog, estimates, solvers, memtests, quotes, *pages_all):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.mount(DOCS_STATIC_URL, StaticFiles(directory=docs_static_dir()), name="static-docs")
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_upload_bytes)
    app.add_middleware(RejectNul)
    app.add_middleware(SecurityHeaders)  # outermost: 413/422 from the limits get them too
    return app
