"""A live server for the reliability tests: `app.server.uvicorn_config` (the deadlines, the
connection cap and the log formatters `trainfit serve` uses) under uvicorn in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from service_support import free_port

from app.server import uvicorn_config
from app.settings import Settings


@contextmanager
def live_server(settings: Settings) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn_config(settings, "127.0.0.1", port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
