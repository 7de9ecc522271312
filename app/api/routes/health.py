from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from sqlalchemy import text

from app.api.deps import SessionDep
from app.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness and database check")
def healthz(request: Request, session: SessionDep) -> Health:
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means: not healthy
        raise HTTPException(503, detail=f"database unavailable: {type(exc).__name__}") from None
    return Health(version=request.app.state.version)
