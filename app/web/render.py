"""Render a page with its CSRF token (cookie set when new), and the error page."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse

from app.security import Identity, csrf_token_for, quote_identity, set_csrf_cookie
from app.templating import templates


def render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    if "csrf_token" not in context:
        context["csrf_token"] = csrf_token_for(request)
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    new_token = getattr(request.state, "new_csrf_token", None)
    if new_token:
        set_csrf_cookie(response, new_token, request.app.state.settings)
    return response


def error_page(request: Request, status_code: int, message: str) -> HTMLResponse:
    return render(
        request, "error.html", {"status_code": status_code, "message": message}, status_code
    )


def form_identity(request: Request, form: Any, what: str) -> Identity | None:
    """The requester or approver behind the form's `token` field, or None."""
    token = str(form.get("token", "")).strip() or None
    if token is None:
        return None
    try:
        return quote_identity(token, request.app.state.settings, what)
    except HTTPException:
        return None
