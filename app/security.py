"""Bearer tokens (sha256 at rest, constant-time compare) and CSRF tokens for HTML forms.

CSRF: signed double-submit cookie. A page that holds a state-changing form sets the cookie
`trainfit_csrf` = `<nonce>.<hmac(secret_key, nonce)>` and puts the same value in a hidden field;
a POST is accepted only when the field equals the cookie and the signature is ours.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fastapi import HTTPException, Request, Response, status

from app.settings import Settings, TokenHash, hash_token

CSRF_COOKIE = "trainfit_csrf"
CSRF_FIELD = "csrf_token"


def match_token(presented: str, accepted: Sequence[TokenHash]) -> TokenHash | None:
    """The entry whose hash equals sha256(presented). Every entry is compared (no early exit),
    each with `hmac.compare_digest`."""
    digest = hash_token(presented)
    found: TokenHash | None = None
    for entry in accepted:
        if hmac.compare_digest(digest, entry.sha256):
            found = entry
    return found


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def authenticate(presented: str | None, accepted: Sequence[TokenHash], what: str) -> str:
    """The actor name for a valid token; 401 without a token, 403 with a wrong one."""
    if presented is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail=f"{what} needs a bearer token (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    entry = match_token(presented, accepted)
    if entry is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=f"this token may not {what}")
    return entry.name


def require_uploader(request: Request) -> str:
    settings: Settings = request.app.state.settings
    return authenticate(bearer_token(request), settings.upload_tokens, "upload memtests")


def require_approver(request: Request) -> str:
    settings: Settings = request.app.state.settings
    return authenticate(bearer_token(request), settings.approver_tokens, "approve quotes")


Role = Literal["requester", "approver"]


@dataclass(frozen=True)
class Identity:
    """Who a quote request comes from: the token's name and its role. An approver may also do
    everything a requester may (create and submit quotes, see every quote)."""

    name: str
    role: Role

    @property
    def is_approver(self) -> bool:
        return self.role == "approver"


def quote_identity(presented: str | None, settings: Settings, what: str) -> Identity:
    """The identity of a requester or approver token; 401 without one, 403 for any other.
    Both lists are always compared in full (constant time whatever matches)."""
    if presented is None:
        authenticate(None, (), what)  # raises the 401
    approver = match_token(presented or "", settings.approver_tokens)
    requester = match_token(presented or "", settings.requester_tokens)
    if approver is not None:
        return Identity(approver.name, "approver")
    if requester is not None:
        return Identity(requester.name, "requester")
    raise HTTPException(status.HTTP_403_FORBIDDEN, detail=f"this token may not {what}")


def require_quote_identity(request: Request) -> Identity:
    settings: Settings = request.app.state.settings
    return quote_identity(bearer_token(request), settings, "create or see quotes")


def _sign(secret_key: str, nonce: str) -> str:
    return hmac.new(secret_key.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def csrf_token_for(request: Request, response: Response | None = None) -> str:
    """The request's valid CSRF token (reused from its cookie), or a new one set on `response`."""
    settings: Settings = request.app.state.settings
    current = request.cookies.get(CSRF_COOKIE)
    if current and _valid_signature(settings.secret_key, current):
        return current
    nonce = secrets.token_urlsafe(24)
    token = f"{nonce}.{_sign(settings.secret_key, nonce)}"
    request.state.new_csrf_token = token
    if response is not None:
        set_csrf_cookie(response, token, settings)
    return token


def set_csrf_cookie(response: Response, token: str, settings: Settings) -> None:
    response.set_cookie(
        CSRF_COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=settings.cookie_secure,
        path="/",
    )


def _valid_signature(secret_key: str, token: str) -> bool:
    nonce, _, signature = token.partition(".")
    return bool(nonce) and hmac.compare_digest(signature, _sign(secret_key, nonce))


def verify_csrf(request: Request, submitted: str | None) -> None:
    settings: Settings = request.app.state.settings
    cookie = request.cookies.get(CSRF_COOKIE)
    if (
        not cookie
        or not submitted
        or not hmac.compare_digest(cookie, submitted)
        or not _valid_signature(settings.secret_key, cookie)
    ):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail="CSRF check failed: reload the page and submit the form again",
        )
