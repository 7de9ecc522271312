"""Security headers on every response, and HEAD wherever GET exists (ASGI middleware).

- `Content-Security-Policy`: scripts and styles only from this origin (no inline script or
  handler: the pages use /static/*.js), no plugins, no framing (`frame-ancestors 'none'`),
  forms post only here. The API docs pages (/docs, /redoc) are FastAPI's own HTML with one
  inline bootstrap script and the viewer from this origin (/static-docs, app/api/routes/docs.py):
  their policy allows exactly those inline scripts by their sha256, still no inline script.
- `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`, `X-Frame-Options: DENY`
  (for browsers without CSP 3), `Cross-Origin-Opener-Policy: same-origin`.
- HEAD: answered as GET without the body (Content-Length kept), so `HEAD /healthz` is a 200
  rather than a 405.
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
DOCS_PATHS = ("/docs", "/redoc")

STATIC_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.S)


def docs_csp(html: bytes) -> str:
    """The policy for a docs page: its inline scripts by hash, the viewer from this origin."""
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(m.group(1)).digest()).decode()}'"
        for m in _INLINE_SCRIPT.finditer(html)
    )
    return (
        f"default-src 'self'; script-src 'self' {hashes}; "
        "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'; worker-src 'self' blob:"
    )


def _with_headers(message: Message, csp: str) -> Message:
    skip = {b"content-security-policy", *(name for name, _ in STATIC_HEADERS)}
    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in skip]
    headers += [*STATIC_HEADERS, (b"content-security-policy", csp.encode("latin-1"))]
    return {**message, "headers": headers}


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = scope.get("method") == "HEAD"
        if head:
            scope = {**scope, "method": "GET"}
        if scope.get("path") in DOCS_PATHS:
            await self._docs(scope, receive, send, head)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = _with_headers(message, CSP)
            elif message["type"] == "http.response.body" and head:
                message = {**message, "body": b""}
            await send(message)

        await self.app(scope, receive, secured)

    async def _docs(self, scope: Scope, receive: Receive, send: Send, head: bool) -> None:
        """Buffer the (small) docs page to hash its inline scripts into the policy."""
        start: Message | None = None
        chunks: list[bytes] = []

        async def buffered(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    assert start is not None
                    body = b"".join(chunks)
                    await send(_with_headers(start, docs_csp(body)))
                    await send({"type": "http.response.body", "body": b"" if head else body})

        await self.app(scope, receive, buffered)
