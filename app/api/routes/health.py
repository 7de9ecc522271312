"""`/healthz`: liveness, answered in-process (no database, no worker thread), so a busy or
unreachable database never makes an orchestrator restart a working process.
`/readyz`: readiness, a `SELECT 1` through a database slot (503 when none is free within a
couple of seconds, or when the database does not answer)."""

from __future__ import annotations

import anyio
import anyio.to_thread
from fastapi import APIRouter, HTTPException, Request
from sqlalchemy import Engine, text

from app.db.slots import DatabaseBusy, DbSlots
from app.schemas import Health, MessageOut, Ready

router = APIRouter(tags=["health"])

READY_WAIT_S = 2.0


@router.get("/healthz", response_model=Health, summary="Liveness (in-process, no database)")
async def healthz(request: Request) -> Health:
    return Health(version=request.app.state.version)


def _select_one(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


@router.get(
    "/readyz",
    response_model=Ready,
    summary="Readiness: a database round trip (503 when the database is busy or down)",
    responses={503: {"model": MessageOut}},
)
async def readyz(request: Request) -> Ready:
    slots: DbSlots = request.app.state.db_slots
    try:
        async with slots.hold(READY_WAIT_S):
            with anyio.fail_after(READY_WAIT_S * 5):
                await anyio.to_thread.run_sync(
                    _select_one, request.app.state.engine, abandon_on_cancel=True
                )
    except DatabaseBusy:
        raise
    except Exception as exc:  # any driver error or the timeout means: not ready
        raise HTTPException(
            503,
            detail=f"database unavailable: {type(exc).__name__}",
            headers={"Retry-After": "1"},
        ) from None
    return Ready(version=request.app.state.version)
