"""Constraints the request models enforce in validators, written into the OpenAPI schema too
(issue 16: schemathesis found schema-valid requests that the service rejects):

- `lora_targets`: at least one name;
- `seq_lens` items: 1 .. MAX_SEQ_LEN.

What the schema does not say stays a documented 422 (tests/reliability/schemathesis.toml): a
config.json that is not a model the estimator knows, a training-config text, GPU ids and
presets outside the catalog, and `ModelInput`'s "exactly one of config, preset, hub, params"
(a `oneOf` saying it made schemathesis 4.32's coverage phase crash in CPython's AST builder)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from estimator.request import MAX_SEQ_LEN


def tighten(schema: dict[str, Any]) -> dict[str, Any]:
    components = schema.get("components", {}).get("schemas", {})
    setup = components.get("TrainingSetup", {}).get("properties", {})
    if "lora_targets" in setup:
        setup["lora_targets"].update(minItems=1)
    for component in components.values():
        seq_lens = component.get("properties", {}).get("seq_lens")
        if seq_lens is not None and seq_lens.get("items", {}).get("type") == "integer":
            seq_lens["items"].update(minimum=1, maximum=MAX_SEQ_LEN)
    return schema


def install(app: FastAPI) -> None:
    """`app.openapi()` returns the tightened schema (built once, as FastAPI caches it)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = tighten(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
