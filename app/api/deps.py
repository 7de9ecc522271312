"""Request-scoped dependencies: settings and one database session per request.

The session holds one of the app's database slots (app/db/slots.py) from before the route runs
until it is closed, which happens as soon as the route function has returned and its answer is
serialised (`scope="function"`), before the response is sent: a slow reader never holds a
connection. Closing runs in a thread of its own limiter, so it never waits behind route threads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from app.db.slots import DbSlots
from app.security import require_approver, require_uploader
from app.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    slots: DbSlots = request.app.state.db_slots
    async with slots.hold():
        session: Session = request.app.state.session_factory()
        try:
            yield session
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(session.close, limiter=anyio.CapacityLimiter(1))


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
UploaderDep = Annotated[str, Depends(require_uploader)]
ApproverDep = Annotated[str, Depends(require_approver)]
