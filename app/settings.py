"""All service settings in one place, read from `TRAINFIT_*` environment variables.

Tokens: `TRAINFIT_UPLOAD_TOKENS`, `TRAINFIT_APPROVER_TOKENS` and `TRAINFIT_REQUESTER_TOKENS`
(quote requesters) are comma-separated entries `[name=]secret`, where `secret` is the token
itself or `sha256:<64 hex>` (its hash, so the plain token never has to be written into the
environment). Only the sha256 hashes are kept: they are computed while the settings are parsed.
`name` is recorded as the actor (uploaded_by, created_by, approver); without it the actor is
`token-<first 8 hex of the hash>`.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


@dataclass(frozen=True)
class TokenHash:
    """One accepted bearer token: who it belongs to and the sha256 of its value."""

    name: str
    sha256: str


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _parse_tokens(value: Any) -> tuple[TokenHash, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, tuple | list) and all(isinstance(v, TokenHash) for v in value):
        return tuple(value)
    entries = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    parsed: list[TokenHash] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        name, sep, secret = entry.partition("=")
        if not sep:
            name, secret = "", entry
        name, secret = name.strip(), secret.strip()
        if name and not _NAME.match(name):
            raise ValueError("token names may use letters, digits and _ . @ - (64 at most)")
        if secret.startswith("sha256:"):
            digest = secret.removeprefix("sha256:").lower()
            if not _HEX64.match(digest):
                raise ValueError("a 'sha256:' token entry needs 64 hex digits")
        else:
            if len(secret) < 8:
                raise ValueError("tokens must be at least 8 characters")
            digest = hash_token(secret)
        parsed.append(TokenHash(name=name or f"token-{digest[:8]}", sha256=digest))
    return tuple(parsed)


TokenHashes = Annotated[tuple[TokenHash, ...], NoDecode, BeforeValidator(_parse_tokens)]


class Settings(BaseSettings):
    """Service configuration. Every field maps to `TRAINFIT_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix="TRAINFIT_", extra="ignore", frozen=True)

    database_url: str = Field(
        "sqlite:///trainfit.db",
        description="SQLAlchemy URL: sqlite:///path.db or postgresql+psycopg://user@host/db",
    )
    upload_tokens: TokenHashes = ()
    approver_tokens: TokenHashes = ()
    requester_tokens: TokenHashes = Field((), description="may create and submit quotes")
    base_url: str = Field(
        "http://127.0.0.1:8000",
        pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
        description="public URL of the service: absolute links are built from it, never Host",
    )
    max_upload_bytes: int = Field(16 * 2**20, ge=1024, description="request body limit, bytes")
    secret_key: str = Field(
        default_factory=lambda: secrets.token_hex(32),
        description="signs CSRF tokens; set it when running several workers",
    )
    run_migrations: bool = True
    # after start-up, move every object then alive out of the cyclic collector's generations
    # (gc.freeze): a full collection of the ~130k objects of the imports took ~26 ms, a pause
    # of whichever request triggered it (issue 17)
    gc_freeze: bool = True
    sqlite_busy_timeout_ms: int = Field(5000, ge=0)
    db_pool_size: int = Field(10, ge=1, le=200, description="database connections kept open")
    db_max_overflow: int = Field(10, ge=0, le=200, description="extra connections under load")
    db_slot_wait_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="how long a request waits for a database slot before a 503 + Retry-After",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, le=600, description="a client must send its request line and headers within"
    )
    body_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="a client must send its whole request body within"
    )
    keep_alive_s: int = Field(5, ge=1, le=600, description="idle keep-alive connections close")
    max_connections: int = Field(
        1000, ge=1, description="open connections beyond this get 503 + Retry-After and close"
    )
    cookie_secure: bool = False
