"""Entry point for `trainfit serve` (and `python -m app.server`): uvicorn with the service's
connection limits (app/http_protocol.py), keep-alive timeout and bounded log lines."""

from __future__ import annotations

import argparse
import os
import resource
from typing import Any

import uvicorn

from app.factory import create_app
from app.http_protocol import ConnectionLimits, deadline_protocol
from app.logs import log_config
from app.settings import Settings

# h11 buffers at most this much of an unfinished request line + headers (431/400 beyond)
MAX_HEADER_BYTES = 16 * 1024


def limits(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_connections=settings.max_connections,
    )


def uvicorn_options(settings: Settings, *, log_level: str = "info") -> dict[str, Any]:
    return {
        "log_level": log_level,
        "log_config": log_config(),
        "proxy_headers": True,
        "forwarded_allow_ips": "127.0.0.1",
        "http": deadline_protocol(limits(settings)),
        "timeout_keep_alive": settings.keep_alive_s,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
    }


def uvicorn_config(settings: Settings, host: str, port: int, **kw: Any) -> uvicorn.Config:
    """The Config `serve` runs (tests start it in a thread with `uvicorn.Server`)."""
    return uvicorn.Config(
        create_app(settings), host=host, port=port, **uvicorn_options(settings, **kw)
    )


def raise_open_file_limit(connections: int) -> None:
    """Room for `connections` sockets plus database connections and files (soft limit only,
    up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    database_url: str | None = None,
    *,
    log_level: str = "info",
    workers: int = 1,
) -> None:
    """Run the service until interrupted. `database_url` overrides `TRAINFIT_DATABASE_URL`;
    the other settings come from the environment. Migrations run at start-up."""
    overrides = {"database_url": database_url} if database_url else {}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    raise_open_file_limit(settings.max_connections)
    options = uvicorn_options(settings, log_level=log_level)
    if workers > 1:  # each worker imports app.main:app (settings from the environment)
        if database_url:
            os.environ["TRAINFIT_DATABASE_URL"] = database_url
        uvicorn.run("app.main:app", host=host, port=port, workers=workers, **options)
        return
    uvicorn.run(create_app(settings), host=host, port=port, **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the trainfit service (settings: TRAINFIT_*)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    serve(args.host, args.port, log_level=args.log_level, workers=args.workers)


if __name__ == "__main__":
    main()
