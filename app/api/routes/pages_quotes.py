"""HTML pages for quotes: save one from a result (choosing the GPU option), the list (with a
status filter), the quote page an approver decides on, and its decisions.

State-changing form posts check the CSRF token first. A saved quote's request names exactly
the chosen GPU option (`gpus: [option]`), so its estimate, total and price are that option's.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.datastructures import QueryParams

from app.api.deps import SessionDep
from app.api.routes.pages import compute, recommend_for, result_context
from app.db import repository
from app.security import CSRF_FIELD, verify_csrf
from app.services import quotes, report
from app.services.charts import bar_chart
from app.services.forms import FormInvalid, FormValues
from app.services.quote_view import quote_view
from app.web.render import error_page, form_identity, render
from estimator.errors import EstimatorInputError
from estimator.request import EstimateRequest

router = APIRouter(include_in_schema=False)

STATUSES = ("pending", "draft", "approved", "rejected")
REQUESTER_HELP = (
    "No requester token is configured on this server, so nobody can save quotes yet. Create "
    "one with `trainfit token create --role requester --name NAME`, put the printed entry in "
    "TRAINFIT_REQUESTER_TOKENS and restart the service."
)
APPROVER_HELP = (
    "No approver token is configured on this server, so nobody can approve yet. Create one "
    "with `trainfit token create --role approver --name NAME`, put the printed entry in "
    "TRAINFIT_APPROVER_TOKENS and restart the service."
)


def _chosen_request(form: Any) -> tuple[EstimateRequest, EstimateRequest]:
    """The request of the chosen option (`option` = "<variant index>:<GPU option>") and the
    variant's request with every GPU option (what the recommendation was made for)."""
    bodies = [b for b in form.getlist("request_json") if isinstance(b, str)]
    chosen = form.get("option") or f"{form.get('variant', '0')}:"  # variant: every GPU
    index_text, _, gpu = str(chosen).partition(":")
    body = json.loads(bodies[int(index_text)])
    whole = EstimateRequest.model_validate(body)
    if gpu:
        if gpu not in body.get("gpus", []):
            raise ValueError("the chosen GPU is not one of the estimate's")
        body["gpus"] = [gpu]
    return EstimateRequest.model_validate(body), whole


@router.post("/quotes")
async def save_quote(request: Request, session: SessionDep) -> Response:
    form = await request.form(max_files=0, max_fields=100)
    submitted = form.get(CSRF_FIELD)
    verify_csrf(request, submitted if isinstance(submitted, str) else None)
    try:
        body, whole = _chosen_request(form)
    except (ValueError, IndexError, ValidationError):
        return error_page(request, 422, "The quote form is incomplete: make the estimate again.")
    title = str(form.get("title", ""))[:200]
    comment = str(form.get("comment", "")).strip()[:10_000] or None
    if "\x00" in f"{title}{comment or ''}":
        return error_page(request, 422, "Title and comment may not contain NUL characters.")
    identity = form_identity(request, form, "save quotes")
    if identity is None:
        settings = request.app.state.settings
        message = (
            "That is not a requester or approver token."
            if settings.requester_tokens or settings.approver_tokens
            else REQUESTER_HELP
        )
        return await _result_again(request, form, message, title, comment)
    try:
        quote = await run_in_threadpool(
            quotes.create_quote,
            session,
            body,
            title=title,
            created_by=identity.name,
            comment=comment,
            submit=form.get("submit") != "draft",
            recommendation=await run_in_threadpool(recommend_for, whole),
        )
    except EstimatorInputError as exc:
        return error_page(request, 422, f"{exc.field}: {exc.message}")
    return RedirectResponse(quotes.quote_url(quote.id), status_code=303)


async def _result_again(
    request: Request, form: Any, message: str, title: str, comment: str | None
) -> HTMLResponse:
    """The result page again (from the inputs the quote form carries), with the error next to
    the quote form and what was typed kept; the error page when the inputs are gone."""
    query = str(form.get("query", ""))
    if not query:
        return error_page(request, 403, message)
    values = FormValues.from_form(QueryParams(query))
    try:
        variants = await run_in_threadpool(compute, values)
        context = await run_in_threadpool(result_context, variants, values)
    except FormInvalid:
        return error_page(request, 403, message)
    context.update(
        quote_error=message,
        quote_title=title,
        quote_comment=comment or "",
        quote_option=str(form.get("option", "")),
    )
    return render(request, "result.html", context, 403)


@router.get("/quotes", response_class=HTMLResponse)
def quotes_page(request: Request) -> HTMLResponse:
    """The list needs a token (a requester sees their own quotes, an approver all): the page
    asks for it and posts it (never in the URL)."""
    status = request.query_params.get("status", "pending")
    return render(request, "quotes.html", {"quotes": None, "status": status, "statuses": STATUSES})


@router.post("/quotes/list", response_class=HTMLResponse)
async def quotes_list_page(request: Request, session: SessionDep) -> HTMLResponse:
    form = await request.form(max_files=0, max_fields=10)
    submitted = form.get(CSRF_FIELD)
    verify_csrf(request, submitted if isinstance(submitted, str) else None)
    status = str(form.get("status", "pending"))
    context: dict[str, Any] = {"quotes": None, "status": status, "statuses": STATUSES}
    identity = form_identity(request, form, "list quotes")
    if identity is None:
        context["error"] = "That is not a requester or approver token."
        return render(request, "quotes.html", context, 403)
    owner = None if identity.is_approver else identity.name
    rows = await run_in_threadpool(
        repository.list_quotes,
        session,
        status=status if status in STATUSES else None,
        created_by=owner,
        limit=500,
    )
    context.update(quotes=[quote_view(q) for q in rows], who=identity)
    return render(request, "quotes.html", context)


def _quote_context(request: Request, session: SessionDep, quote_id: str) -> dict[str, Any] | None:
    row = repository.get_quote(session, quote_id)
    if row is None:
        return None
    doc = quotes.to_document(session, row)
    setup = doc.request.get("setup", {})
    variant = report.Variant(
        setup.get("checkpointing", "?"), setup.get("loss", "?"), doc.request, doc.estimate
    )
    return {
        "quote": doc,
        "view": quote_view(row),
        "table": report.fit_table([variant]),
        "chart": bar_chart(report.memory_chart([variant])),
        "opts": report.options([variant]),
        "approver_configured": bool(request.app.state.settings.approver_tokens),
        "approver_help": APPROVER_HELP,
        "typed_comment": "",
    }


@router.get("/quotes/{quote_id}", response_class=HTMLResponse)
def quote_page(request: Request, session: SessionDep, quote_id: str) -> HTMLResponse:
    context = _quote_context(request, session, quote_id)
    if context is None:
        return error_page(request, 404, f"No quote {quote_id!r}.")
    done = request.query_params.get("done")
    if done in ("approved", "rejected", "repriced", "submitted"):
        context["message"] = f"Quote {done}."
    return render(request, "quote.html", context)


@router.post("/quotes/{quote_id}/decision", response_class=HTMLResponse)
async def decide_quote(request: Request, session: SessionDep, quote_id: str) -> Response:
    """Approve, reject, submit a draft or re-price from the quote page (a token field; CSRF
    checked). Approving binds to the content hash the page was rendered with (hidden field).
    A refusal re-renders the page with the typed comment kept and is audited."""
    form = await request.form(max_files=0, max_fields=20)
    submitted = form.get(CSRF_FIELD)
    verify_csrf(request, submitted if isinstance(submitted, str) else None)
    decision = str(form.get("decision"))
    comment = str(form.get("comment", "")).strip()[:10_000] or None
    seen_hash = str(form.get("content_hash", "")).strip()[:64] or None
    to_status = {
        "approve": "approved",
        "reject": "rejected",
        "reprice": "repriced",
        "submit": "pending",
    }.get(decision)

    def fail(status_code: int, message: str) -> HTMLResponse:
        context = _quote_context(request, session, quote_id)
        if context is None:
            return error_page(request, 404, f"No quote {quote_id!r}.")
        context["error"] = message
        context["typed_comment"] = comment or ""
        return render(request, "quote.html", context, status_code)

    quote = repository.get_quote(session, quote_id)
    if quote is None:
        return error_page(request, 404, f"No quote {quote_id!r}.")
    if to_status is None:
        return fail(422, "Choose approve, reject, submit or re-price.")
    if comment and "\x00" in comment:
        return fail(422, "The comment may not contain NUL characters.")
    identity = form_identity(request, form, "decide quotes")
    if to_status in ("repriced", "pending"):
        if identity is None or not (identity.is_approver or identity.name == quote.created_by):
            what = "Re-pricing" if to_status == "repriced" else "Submitting"
            return fail(403, f"{what} needs the creator's token or an approver token.")
        try:
            if to_status == "repriced":
                await run_in_threadpool(quotes.reprice, session, quote, identity.name)
            else:
                await run_in_threadpool(
                    quotes.decide,
                    session,
                    quote,
                    to_status="pending",
                    actor=identity.name,
                    comment=comment,
                )
        except (repository.TransitionError, repository.ContentChanged) as exc:
            return fail(409, str(exc))
        except quotes.DecisionRefused as exc:
            return fail(exc.status_code, exc.reason)
        done = "repriced" if to_status == "repriced" else "submitted"
        return RedirectResponse(f"{quotes.quote_url(quote_id)}?done={done}", status_code=303)
    if identity is None or not identity.is_approver:
        actor = identity.name if identity else "invalid-token"
        configured = bool(request.app.state.settings.approver_tokens)
        reason = "That is not an approver token." if configured else APPROVER_HELP
        repository.record_denied(session, quote, wanted=to_status, actor=actor, reason=reason)
        return fail(403, reason)
    try:
        await run_in_threadpool(
            quotes.decide,
            session,
            quote,
            to_status=to_status,
            actor=identity.name,
            comment=comment,
            presented_hash=seen_hash,
        )
    except quotes.DecisionRefused as exc:
        return fail(exc.status_code, exc.reason)
    return RedirectResponse(f"{quotes.quote_url(quote_id)}?done={to_status}", status_code=303)
