"""Bounded log lines: every record the server writes (access lines, warnings, tracebacks) is cut
to a fixed length, so that hostile requests (16 KiB paths, a flood of broken connections) cannot
turn into hundreds of megabytes of log. `log_config()` is uvicorn's own configuration with
these formatters."""

from __future__ import annotations

import copy
import logging
from typing import Any

from uvicorn.config import LOGGING_CONFIG
from uvicorn.logging import AccessFormatter, DefaultFormatter

MAX_LINE_CHARS = 1000  # an access line or a message
MAX_RECORD_CHARS = 8000  # a message with its traceback


def bound(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... [{len(text) - limit + 40} characters cut]"


def _bounded(formatted: str) -> str:
    first, newline, rest = formatted.partition("\n")
    if not newline:
        return bound(first, MAX_LINE_CHARS)
    return bound(bound(first, MAX_LINE_CHARS) + newline + rest, MAX_RECORD_CHARS)


class BoundedFormatter(DefaultFormatter):
    def format(self, record: logging.LogRecord) -> str:
        return _bounded(super().format(record))


class BoundedAccessFormatter(AccessFormatter):
    def format(self, record: logging.LogRecord) -> str:
        return _bounded(super().format(record))


def log_config() -> dict[str, Any]:
    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["default"]["()"] = "app.logs.BoundedFormatter"
    config["formatters"]["access"]["()"] = "app.logs.BoundedAccessFormatter"
    config["root"] = {"handlers": ["default"], "level": "WARNING"}
    return config
