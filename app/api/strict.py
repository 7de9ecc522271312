"""Strict JSON bodies for the REST routes (`APIRouter(route_class=StrictJsonRoute)`).

Before FastAPI's own (lax) validation, a JSON body is
1. parsed with duplicate keys refused (422 naming the key's path, as `memtest_schema` does),
2. walked once: no string longer than MAX_STRING_CHARS and no lone UTF-16 surrogate (it can be
   neither stored nor encoded: a 500 before), 422 naming the path,
3. validated against the route's body type in pydantic's strict JSON mode: no `"48000"`, `true`
   or `"0.9"` where a number goes (lax mode coerced them).
A body that is not JSON at all is left to FastAPI (its 422 `json_invalid`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError

from memtest_schema import DuplicatedKey, reject_duplicate_keys

# Longer than any name, id, title or comment the models accept (comments: 10,000): a bound on
# what one string in a request may cost (a model's own `max_length` is usually far lower).
MAX_STRING_CHARS = 10_000

Loc = list[str | int]


def _is_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def find_problem(value: Any, loc: Loc) -> tuple[Loc, str, str] | None:
    """(loc, message, type) of the first duplicated key, overlong string or lone surrogate."""
    stack: list[tuple[Any, Loc]] = [(value, loc)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if len(item) > MAX_STRING_CHARS:
                return where, f"string longer than {MAX_STRING_CHARS} characters", "string_too_long"
            if _is_lone_surrogate(item):
                return where, "lone UTF-16 surrogate (not valid Unicode text)", "string_unicode"
        elif isinstance(item, dict):
            if isinstance(item, DuplicatedKey):
                return [*where, item.key], f"duplicated key {item.key[:100]!r}", "duplicate_key"
            for key, child in reversed(list(item.items())):
                if len(key) > MAX_STRING_CHARS or _is_lone_surrogate(key):
                    return [*where, key[:100]], "invalid key", "string_unicode"
                stack.append((child, [*where, key]))
        elif isinstance(item, list):
            stack.extend((child, [*where, i]) for i, child in reversed(list(enumerate(item))))
    return None


# A lone surrogate can reach us only as a `\\uD800`-`\\uDFFF` escape (UTF-8 cannot carry one):
# the costly path-finding walk runs only when such an escape (or a paired one) is in the body.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _raise(problem: tuple[Loc, str, str]) -> None:
    loc, msg, kind = problem
    raise RequestValidationError([{"loc": loc, "msg": msg, "type": kind}])


def _suspicious(value: Any) -> bool:
    """A duplicated key or an overlong string anywhere (no paths: the cheap first pass)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if len(item) > MAX_STRING_CHARS:
                return True
        elif kind is DuplicatedKey:
            return True
        elif kind is dict:
            if any(len(k) > MAX_STRING_CHARS for k in item):
                return True
            stack.extend(item.values())
        elif kind is list:
            stack.extend(x for x in item if type(x) in (str, dict, list, DuplicatedKey))
    return False


def check_json_body(raw: bytes, adapter: TypeAdapter[Any] | None = None) -> Any:
    """RequestValidationError for the problems above (a body that is not JSON is left alone).
    Order: surrogates (only if escaped ones occur), then the strict schema (which rejects an
    over-long list before anything walks it), then duplicate keys and string lengths.
    Returns the body as the strict schema validated it (a route may use it instead of
    FastAPI validating it again), or None: no adapter, or not JSON (FastAPI answers it)."""
    if _SURROGATE_ESCAPE.search(raw):
        try:
            parsed = json.loads(raw, object_pairs_hook=reject_duplicate_keys)
        except (ValueError, RecursionError):
            return None
        problem = find_problem(parsed, ["body"])
        if problem is not None:
            _raise(problem)
    value = None
    if adapter is not None:
        try:
            value = adapter.validate_json(raw, strict=True)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            if not (len(errors) == 1 and errors[0]["type"] == "json_invalid"):
                raise RequestValidationError(
                    [
                        {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
                        for e in errors[:20]
                    ]
                ) from None
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads(raw)
        try:
            parsed = _PLAIN_OBJECTS.decode(text)
        except _RepeatedKey:
            parsed = json.loads(raw, object_pairs_hook=reject_duplicate_keys)  # names the key
        else:
            if len(text) <= MAX_STRING_CHARS:
                return value  # no repeated key, and no string can be longer than the text
    except (ValueError, RecursionError):
        return None  # FastAPI answers it (422 json_invalid)
    if _suspicious(parsed):
        problem = find_problem(parsed, ["body"])
        if problem is not None:
            _raise(problem)
    return value


class _RepeatedKey(Exception):
    """An object with a key twice: `reject_duplicate_keys`' parse names it (the rare path)."""


def _without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _RepeatedKey
    return out


# json.loads' decoder with the hook above, built once (json.loads builds one per call with a
# hook): the common body, without a repeated key, parsed once in C (dict(pairs) per object)
_PLAIN_OBJECTS = json.JSONDecoder(object_pairs_hook=_without_repeats)


def body_adapter(route: APIRoute) -> TypeAdapter[Any] | None:
    params = route.dependant.body_params
    if len(params) != 1:
        return None
    annotation = params[0].field_info.annotation
    return None if annotation is None else TypeAdapter(annotation)


def is_json(request: Request) -> bool:
    content_type = request.headers.get("content-type", "")
    return content_type.split(";")[0].strip().lower() == "application/json"


class StrictJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()
        adapter = body_adapter(self)
        if adapter is None:
            return original

        async def strict_handler(request: Request) -> Response:
            if request.method in ("POST", "PUT", "PATCH") and is_json(request):
                raw = await request.body()  # cached: FastAPI reads the same bytes
                if raw.strip():
                    check_json_body(raw, adapter)
            return await original(request)

        return strict_handler
