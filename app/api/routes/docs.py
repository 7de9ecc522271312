"""`/docs` (Swagger UI) and `/redoc` from the app's own files: the viewers' JavaScript and CSS
come from the fastapi-offline package (mounted at /static-docs by the factory), so the pages
work offline and no request leaves the server's origin (no CDN, no Google fonts)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)

DOCS_STATIC_URL = "/static-docs"


def docs_static_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title} - API",
        swagger_js_url=f"{DOCS_STATIC_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{DOCS_STATIC_URL}/swagger-ui.css",
        swagger_favicon_url=f"{DOCS_STATIC_URL}/favicon.png",
        swagger_ui_parameters={"validatorUrl": None},  # no badge from validator.swagger.io
    )


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title} - API",
        redoc_js_url=f"{DOCS_STATIC_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{DOCS_STATIC_URL}/favicon.png",
        with_google_fonts=False,
    )
