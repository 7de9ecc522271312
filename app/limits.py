"""Request body limit (ASGI middleware): 413 when `Content-Length` says the body is too big, and
also when a body without (or with a lying) `Content-Length` streams past the limit."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, detail=f"request body is larger than {limit} bytes")


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_json(send, 400, "Content-Length is not a number")
                    return
                if declared > self.max_bytes:
                    await _send_json(
                        send, 413, f"request body is larger than {self.max_bytes} bytes"
                    )
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await _send_json(send, 413, str(exc.detail))


async def _send_json(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RejectNul:
    """422 for a NUL character (U+0000) in the path or the query string. Nothing stored can
    contain one, and PostgreSQL refuses it in any text parameter (a 500 before this)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            loc = _nul_location(scope.get("path", ""), scope.get("query_string", b""))
            if loc is not None:
                body = json.dumps(
                    {"detail": [{"loc": loc, "msg": "NUL character", "type": "value_error"}]}
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 422,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _nul_location(path: str, query_string: bytes) -> list[str] | None:
    if "\x00" in path:  # the server has percent-decoded it already
        return ["path"]
    query = query_string.decode("latin-1")
    if "\x00" in query or "%00" in query:
        for key, value in parse_qsl(query, keep_blank_values=True):
            if "\x00" in key or "\x00" in value:
                return ["query", key.replace("\x00", "")]
        return ["query"]
    return None
