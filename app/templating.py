"""Jinja2 environment for the pages (autoescaped) with the display filters: bytes -> GiB."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import jinja2
from fastapi.templating import Jinja2Templates

from app.services.report import CHECKPOINTING_LABELS, LOSS_LABELS, gib

TEMPLATES_DIR = Path(str(files("templates")))  # the top-level `templates` package

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), autoescape=True)
templates = Jinja2Templates(env=_env)
templates.env.filters["gib"] = gib
templates.env.filters["thousands"] = lambda n: f"{n:,}" if isinstance(n, int | float) else n
templates.env.filters["usd"] = lambda v: "–" if v is None else f"{v:,.2f}"
templates.env.filters["hours"] = lambda v: "–" if v is None else f"{v:,.1f}"
templates.env.filters["pct"] = lambda v: "–" if v is None else f"{v:+.1f} %"
templates.env.globals["labels"] = {"checkpointing": CHECKPOINTING_LABELS, "loss": LOSS_LABELS}


def _mem(value: float | int | None, unit: str = "GiB", signed: bool = False) -> str:
    if value is None:
        return "–"
    scaled = value / (2**20 if unit == "MiB" else 2**30)
    return f"{scaled:+,.1f}" if signed else f"{scaled:,.1f}"


templates.env.filters["mem"] = _mem
