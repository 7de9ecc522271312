"""Input errors of the library -> HTTP 422 in FastAPI's own shape:
`{"detail": [{"loc": ["body", ...field path...], "msg": ..., "type": ...}]}`."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from estimator.errors import EstimatorInputError
from memtest_schema import MemtestSchemaError

_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def field_loc(field: str, root: str = "body") -> list[str | int]:
    """`results[2].peak_allocated_bytes` -> ["body", "results", 2, "peak_allocated_bytes"]."""
    loc: list[str | int] = [root]
    for name, index in _PART.findall(field or ""):
        loc.append(int(index) if index else name)
    return loc


def unprocessable(loc: list[str | int], msg: str, kind: str = "value_error") -> JSONResponse:
    return JSONResponse(
        status_code=422, content={"detail": [{"loc": loc, "msg": msg, "type": kind}]}
    )


def estimator_field_path(field: str) -> str:
    """The estimator names config fields relative to the config (`config.hidden_size`); in the
    request body they sit under `model`."""
    return f"model.{field}" if field == "config" or field.startswith("config.") else field


async def _estimator_input(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EstimatorInputError)
    return unprocessable(field_loc(estimator_field_path(exc.field)), exc.message, "estimator_input")


async def _memtest_schema(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MemtestSchemaError)
    return unprocessable(field_loc(exc.field), exc.message, "memtest_schema")


async def _pydantic(_request: Request, exc: Exception) -> JSONResponse:
    """A model the library builds from the request rejected a value: still the client's input."""
    assert isinstance(exc, ValidationError)
    detail: list[dict[str, Any]] = [
        {"loc": ["body", *err["loc"]], "msg": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False, include_context=False, include_input=False)
    ]
    return JSONResponse(status_code=422, content={"detail": detail})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(EstimatorInputError, _estimator_input)
    app.add_exception_handler(MemtestSchemaError, _memtest_schema)
    app.add_exception_handler(ValidationError, _pydantic)
