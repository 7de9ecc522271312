"""Uploading a memtest: `POST <URL>` (the service's route is `POST /v1/memtests`, 201 -> {id})."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

__all__ = ["UploadError", "upload_memtest"]

TIMEOUT_S = 60.0


class UploadError(RuntimeError):
    """The server did not accept the memtest (message says why)."""


def _headers(token: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _parse_id(status: int, body: bytes) -> str:
    if status not in (200, 201):
        raise UploadError(f"server answered {status}: {body[:500].decode('utf-8', 'replace')}")
    try:
        data = json.loads(body)
    except ValueError:
        raise UploadError(f"server answered {status} without JSON") from None
    if not isinstance(data, dict) or "id" not in data:
        raise UploadError(f"server answered {status} without an id")
    return str(data["id"])


def upload_memtest(url: str, doc: dict[str, Any], token: str | None) -> str:
    """POST the document; returns the id the server gave it. httpx when installed, else urllib."""
    body = json.dumps(doc).encode("utf-8")
    try:
        import httpx
    except ImportError:
        httpx = None  # type: ignore[assignment]
    if httpx is not None:
        try:
            resp = httpx.post(url, content=body, headers=_headers(token), timeout=TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise UploadError(f"cannot reach {url}: {exc}") from None
        return _parse_id(resp.status_code, resp.content)
    req = urllib.request.Request(url, data=body, headers=_headers(token), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
            return _parse_id(resp.status, resp.read())
    except urllib.error.HTTPError as exc:
        return _parse_id(exc.code, exc.read())
    except (urllib.error.URLError, OSError) as exc:
        raise UploadError(f"cannot reach {url}: {exc}") from None
