"""Database slots: at most `capacity` requests hold a database session at once, where
`capacity` is the connection pool's size plus overflow.

Why (issue 16, item 1): with one session per request taken in a worker thread, 56 simultaneous
reads froze the service for 30 s: 40 worker threads waited for pool connections held by
finished requests whose response serialisation needed a worker thread (the pool timeout then
answered 40 x 500). With no more sessions than pool connections, no thread ever waits for the
pool; a request that cannot get a slot within `wait_s` is answered 503 with `Retry-After`
instead of queueing without bound. The wait happens on the event loop, not in a thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import HTTPException


class DatabaseBusy(HTTPException):
    """503 with Retry-After: every slot stayed taken for the whole wait."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(
            503,
            detail="the database is busy: retry later",
            headers={"Retry-After": str(retry_after_s)},
        )


class DbSlots:
    def __init__(self, capacity: int, wait_s: float, retry_after_s: int = 1) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self._semaphore: anyio.Semaphore | None = None

    def _sem(self) -> anyio.Semaphore:
        # created lazily inside the running event loop (one loop per server process)
        if self._semaphore is None:
            self._semaphore = anyio.Semaphore(self.capacity)
        return self._semaphore

    @property
    def in_use(self) -> int:
        return self.capacity - self._sem().value if self._semaphore is not None else 0

    @asynccontextmanager
    async def hold(self, wait_s: float | None = None) -> AsyncIterator[None]:
        semaphore = self._sem()
        with anyio.move_on_after(self.wait_s if wait_s is None else wait_s) as waited:
            await semaphore.acquire()
        if waited.cancelled_caught:
            raise DatabaseBusy(self.retry_after_s)
        try:
            yield
        finally:
            semaphore.release()
