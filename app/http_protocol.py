"""uvicorn's h11 protocol with read deadlines and a connection cap (issue 16, item 4: 1,000
half-sent requests were held for 60 s; 1,100 exhausted the open-file limit).

- A client has `header_timeout_s` from connecting (or, on a kept-alive connection, from the
  first byte of its next request) to finish the request line and headers, and then
  `body_timeout_s` to finish the body. Past either: `408 Request Timeout` (when no response has
  started) and the connection is closed. An idle kept-alive connection is closed after
  uvicorn's `timeout_keep_alive`.
  When the deadline passes while the client's bytes wait unread in the kernel (the event loop
  is behind, not the client), it is extended by GRACE_S, at most MAX_GRACES times.
- Beyond `max_connections` open connections a new one gets `503` with `Retry-After` and is
  closed at once, before anything is read from it.

Use it as `uvicorn.Config(http=deadline_protocol(limits))`.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import struct
import termios
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 1000


def _raw_response(status: str, text: str, extra: str = "") -> bytes:
    body = text.encode("ascii")
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


TIMED_OUT = _raw_response("408 Request Timeout", "request not received in time")
TOO_MANY = _raw_response("503 Service Unavailable", "too many connections", "retry-after: 1\r\n")


GRACE_S = 0.5
MAX_GRACES = 4


def _unread_bytes(transport: asyncio.Transport) -> int:
    """Bytes the kernel holds for this socket that the server has not read yet (0 if unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", raw)[0])


class DeadlineH11Protocol(H11Protocol):
    def __init__(self, *args: Any, limits: ConnectionLimits | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits or ConnectionLimits()
        self._deadline: asyncio.TimerHandle | None = None
        self._phase = ""
        self._graces = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.write(TOO_MANY)
            transport.close()
            return
        self._arm("headers", self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm("headers", self.limits.header_timeout_s)  # next request, kept-alive
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        """Move the deadline along with the client's side of the exchange: headers (IDLE, armed
        on connect or on the first byte), body (SEND_BODY), nothing once the request is in."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._phase != "body":
                self._arm("body", self.limits.body_timeout_s)
        elif state is not h11.IDLE:
            self._disarm()

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._graces = 0
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._phase = ""

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._graces < MAX_GRACES and _unread_bytes(self.transport) > 0:
            # the client's bytes are here, the event loop is behind reading them: not the
            # client's fault (seen with 500 clients on 2 busy cores); wait a little, a few times
            self._graces += 1
            self._deadline = self.loop.call_later(GRACE_S, self._expired)
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(TIMED_OUT)
        self.logger.info("closed a connection that did not send its request in time")
        self.transport.close()


def deadline_protocol(limits: ConnectionLimits) -> Any:
    """The protocol factory for `uvicorn.Config(http=...)` (picklable, for `--workers`)."""
    return functools.partial(DeadlineH11Protocol, limits=limits)
