"""Memtest uploads: strict parsing and validation (`memtest_schema`), content hash, and the
fields the table indexes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db.repository import MemtestFields
from memtest_schema import MemtestSchemaError, load_memtest


@dataclass(frozen=True)
class ParsedMemtest:
    text: str
    sha256: str
    document: dict[str, Any]
    fields: MemtestFields


def lone_surrogate_path(value: Any, path: str) -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate, if any."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, child in value.items():
            child_path = f"{path}.{key}" if path else str(key)
            found = lone_surrogate_path(key, child_path) or lone_surrogate_path(child, child_path)
            if found is not None:
                return found.encode("utf-8", "replace").decode("utf-8")
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found = lone_surrogate_path(child, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def parse_upload(raw: bytes) -> ParsedMemtest:
    """Raises `MemtestSchemaError` (field, message) for anything that is not a valid
    `trainfit.memtest/1` document."""
    if not raw.strip():
        raise MemtestSchemaError("", "empty body: send the memtest JSON file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MemtestSchemaError("", f"not UTF-8: {exc}") from None
    if "\x00" in text:
        raise MemtestSchemaError("", "NUL character in the document")
    document = load_memtest(raw)
    surrogate = lone_surrogate_path(document, "")
    if surrogate is not None:  # valid JSON escapes, but no text column can store them
        raise MemtestSchemaError(surrogate, "lone UTF-16 surrogate (not valid Unicode text)")
    env = document["environment"]
    model = document["model"]
    for field, value in (
        ("model.name", model.get("name")),
        ("environment.gpu_name", env.get("gpu_name")),
        ("environment.device", env.get("device")),
    ):
        if isinstance(value, str) and "\x00" in value:  # indexed columns: PostgreSQL refuses NUL
            raise MemtestSchemaError(field, "NUL character")
    return ParsedMemtest(
        text=text,
        sha256=hashlib.sha256(raw).hexdigest(),
        document=document,
        fields=MemtestFields(
            schema_id=document["schema"],
            model_name=model["name"],
            gpu_name=env.get("gpu_name") or "",
            device=env["device"],
            gpu_count=env.get("gpu_count"),
            total_memory_bytes=env.get("total_memory_bytes"),
            created_at=_parse_time(document["created_at"]),
        ),
    )


def _parse_time(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def load_stored(raw_json: str) -> dict[str, Any]:
    """A stored file back as a document (it was validated on upload)."""
    parsed: dict[str, Any] = json.loads(raw_json)
    return parsed
