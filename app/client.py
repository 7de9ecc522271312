"""Client for `trainfit check --server URL`: posts the check request to a running service.

    >>> result = check_remote("http://trainfit:8000", request_dict)   # doctest: +SKIP
    >>> sys.exit(0 if result["fits"] else 1)

Errors: `RemoteInputError` when the server refuses the request (4xx: bad input, exit 2);
`RemoteUnavailableError` when it cannot be reached or fails (connection, timeout, 5xx).
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["RemoteCheckError", "RemoteInputError", "RemoteUnavailableError", "check_remote"]


class RemoteCheckError(Exception):
    """Base class of the errors of `check_remote`."""


class RemoteInputError(RemoteCheckError):
    """The server answered 4xx. `status_code`; `detail` is the server's `detail` (for 422 a list
    of `{"loc": [...], "msg": ...}`)."""

    def __init__(self, status_code: int, detail: Any) -> None:
        self.status_code = status_code
        self.detail = detail
        super().__init__(f"server refused the request ({status_code}): {_describe(detail)}")


class RemoteUnavailableError(RemoteCheckError):
    """Connection refused, DNS, timeout, or a 5xx / non-JSON answer."""


def _describe(detail: Any) -> str:
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                parts.append(f"{loc or 'body'}: {item.get('msg', '')}")
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


def check_remote(
    server_url: str,
    request_dict: dict[str, Any],
    timeout: float = 30.0,
    *,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """POST `request_dict` (a `CheckRequest` body) to `<server_url>/v1/check`; returns the
    check document (`fits`, `verdict`, `peak_bytes`, `usable_bytes`, `margin_bytes`, ...)."""
    url = server_url.rstrip("/") + "/v1/check"
    try:
        with httpx.Client(timeout=timeout, transport=transport) as client:
            response = client.post(url, json=request_dict)
    except httpx.HTTPError as exc:
        raise RemoteUnavailableError(f"cannot reach {url}: {exc}") from exc
    if 400 <= response.status_code < 500:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise RemoteInputError(response.status_code, detail)
    if response.status_code != 200:
        raise RemoteUnavailableError(
            f"{url} answered {response.status_code}: {response.text[:200]}"
        )
    try:
        body: dict[str, Any] = response.json()
    except ValueError:
        raise RemoteUnavailableError(f"{url} answered with something that is not JSON") from None
    if not isinstance(body, dict) or "verdict" not in body:
        raise RemoteUnavailableError(f"{url} answered without a verdict: {str(body)[:200]}")
    return body
