"""Entry point for `trainfit serve`."""

from __future__ import annotations

import uvicorn

from app.factory import create_app
from app.settings import Settings


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    database_url: str | None = None,
    *,
    log_level: str = "info",
) -> None:
    """Run the service until interrupted. `database_url` overrides `TRAINFIT_DATABASE_URL`;
    the other settings come from the environment. Migrations run at start-up."""
    overrides = {"database_url": database_url} if database_url else {}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=log_level,
        proxy_headers=True,
        forwarded_allow_ips="127.0.0.1",
    )
