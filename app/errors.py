"""Input errors of the library -> HTTP 422 in FastAPI's own shape:
`{"detail": [{"loc": ["body", ...field path...], "msg": ..., "type": ...}]}`.

Every error body is bounded and encodable whatever the input: at most MAX_ERRORS items, each
`msg` at most MAX_MSG_CHARS, `input` echoed only when its JSON is at most MAX_ECHO_BYTES, and
JSON written ASCII-only (a lone surrogate in the input is escaped, not a 500)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from estimator.errors import EstimatorInputError
from memtest_schema import MemtestSchemaError

_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def field_loc(field: str, root: str = "body") -> list[str | int]:
    """`results[2].peak_allocated_bytes` -> ["body", "results", 2, "peak_allocated_bytes"]."""
    loc: list[str | int] = [root]
    for name, index in _PART.findall(field or ""):
        loc.append(int(index) if index else name)
    return loc


MAX_ERRORS = 10
MAX_MSG_CHARS = 300
MAX_ECHO_BYTES = 120
MAX_LOC_PARTS = 12


class SafeJSONResponse(JSONResponse):
    """ASCII JSON (`\\uXXXX` escapes): encodes lone surrogates instead of failing."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode("ascii")


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _echo(value: Any) -> Any:
    """`value` when its JSON is small, else nothing (the caller drops the key)."""
    try:
        encoded = json.dumps(value, ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError):
        return _NO_ECHO
    return value if len(encoded) <= MAX_ECHO_BYTES else _NO_ECHO


_NO_ECHO = object()


def bounded_errors(errors: Any) -> list[dict[str, Any]]:
    """At most MAX_ERRORS items of loc/msg/type (+ a small `input`), each part truncated."""
    items = list(errors) if isinstance(errors, list | tuple) else [errors]
    out: list[dict[str, Any]] = []
    for err in items[:MAX_ERRORS]:
        if not isinstance(err, dict):
            out.append({"loc": ["body"], "msg": _short(str(err), MAX_MSG_CHARS), "type": "error"})
            continue
        loc = [
            part if isinstance(part, int) else _short(str(part), 100)
            for part in list(err.get("loc", []))[:MAX_LOC_PARTS]
        ]
        item: dict[str, Any] = {
            "loc": loc,
            "msg": _short(str(err.get("msg", "")), MAX_MSG_CHARS),
            "type": _short(str(err.get("type", "value_error")), 64),
        }
        if "input" in err:
            echoed = _echo(_finite(err["input"]))
            if echoed is not _NO_ECHO:
                item["input"] = echoed
        out.append(item)
    if len(items) > MAX_ERRORS:
        out.append(
            {
                "loc": ["body"],
                "msg": f"{len(items) - MAX_ERRORS} more errors not shown",
                "type": "too_many_errors",
            }
        )
    return out


def unprocessable(loc: list[str | int], msg: str, kind: str = "value_error") -> JSONResponse:
    return SafeJSONResponse(
        status_code=422,
        content={"detail": bounded_errors([{"loc": loc, "msg": msg, "type": kind}])},
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
    return SafeJSONResponse(status_code=422, content={"detail": bounded_errors(detail)})


# FastAPI answers a JSON body it cannot decode (e.g. invalid UTF-8) with this bare 400; every
# other malformed body is a 422 naming `body`, so clients and the OpenAPI schema see one shape.
_BODY_PARSE_ERROR = "There was an error parsing the body"
# Starlette's multipart parser answers a form with more parts than the route reads
# (`request.form(max_files=..., max_fields=...)`) with a bare 400 starting so; the body is
# well-formed, just more than the route takes: a 422 naming `body`, as the other bodies
_PART_LIMITS = ("Too many fields", "Too many files")


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == _BODY_PARSE_ERROR:
        return unprocessable(["body"], "the body is not valid JSON in UTF-8", "json_invalid")
    if exc.status_code == 400 and str(exc.detail).startswith(_PART_LIMITS):
        return unprocessable(
            ["body"], f"{exc.detail} This form reads no more parts.", "too_many_parts"
        )
    if exc.status_code in (204, 304) or exc.status_code < 400:
        return await http_exception_handler(request, exc)
    headers = exc.headers
    if exc.status_code == 405:  # every method of every route on this path, not just the first
        headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
    detail: Any = exc.detail
    if isinstance(detail, str):
        detail = _short(detail, 2 * MAX_MSG_CHARS)
    elif exc.status_code == 422:
        detail = bounded_errors(detail)
    return SafeJSONResponse(
        status_code=exc.status_code, content={"detail": detail}, headers=headers
    )


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """The methods the app answers on this request's path. Starlette's 405 names only the
    methods of the first route whose path matched (`POST` for /v1/quotes, which also has GET).
    HEAD is answered wherever GET is (app/headers.py)."""
    methods = {
        method
        for method in _METHODS
        for route in request.app.router.routes
        if route.matches({**request.scope, "method": method})[0] is Match.FULL
    }
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def _finite(value: Any) -> Any:
    """NaN and ±Infinity (accepted by Python's JSON parser) as strings: echoing them back in
    `input` made the 422 itself fail to serialise (a 500)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


async def _request_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return SafeJSONResponse(
        status_code=422, content={"detail": jsonable_encoder(bounded_errors(exc.errors()))}
    )


async def _database_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    """The database did not answer (down, restarting, locked past the busy timeout, or the
    pool timed out): a 503 the client may retry, never a 500. Integrity and programming errors
    are not caught here: they are bugs."""
    return SafeJSONResponse(
        status_code=503,
        content={"detail": f"database unavailable: {type(exc).__name__}"},
        headers={"Retry-After": "1"},
    )


def install_error_handlers(app: FastAPI) -> None:
    for unavailable in (OperationalError, InterfaceError, PoolTimeout):
        app.add_exception_handler(unavailable, _database_unavailable)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(EstimatorInputError, _estimator_input)
    app.add_exception_handler(MemtestSchemaError, _memtest_schema)
    app.add_exception_handler(ValidationError, _pydantic)
