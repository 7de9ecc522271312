"""`Idempotency-Key` on creates (quotes, memtest uploads): a retry with the same key and the
same body gets the resource the first request made; the same key with another body is a 422.
Keys are per (scope, actor): two clients cannot collide, nor read each other's answers."""

from __future__ import annotations

import contextlib
from typing import Annotated

from fastapi import Header, HTTPException
from sqlalchemy.orm import Session

from app.db import repository

IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,200}$"  # printable ASCII, no spaces

IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="a client-chosen key (e.g. a UUID): retries with it do not create twice",
    ),
]


def replay_or_claim(
    session: Session, *, scope: str, actor: str, key: str, body_sha256: str, status_code: int = 201
) -> tuple[str | None, repository.IdempotencyClaim]:
    """(id of the resource made earlier with this key and body, or None; the claim to store
    with a new one). 422 when the key was used with another body."""
    record = repository.get_idempotency(session, scope, actor, key)
    if record is not None:
        if record.body_sha256 != body_sha256:
            raise HTTPException(
                422,
                detail=f"Idempotency-Key {key[:64]!r} was used with another body: "
                "use a new key for a new request",
            )
        return record.resource_id, repository.IdempotencyClaim(
            scope, actor, key, body_sha256, record.status_code
        )
    return None, repository.IdempotencyClaim(scope, actor, key, body_sha256, status_code)


def record_key(session: Session, claim: repository.IdempotencyClaim, resource_id: str) -> None:
    """Store the key after its resource was made (memtests: the file's row is content-addressed,
    so a concurrent retry that recorded the key first made the same row: nothing to do)."""
    with contextlib.suppress(repository.IdempotencyReplay):
        repository.record_idempotency(session, claim, resource_id)
