"""HTML pages: the estimate form, results, quotes (save, approve/reject) and memtests.

State-changing form posts (saving a quote, deciding one) check the CSRF token first."""

from __future__ import annotations

import json
from typing import Any, get_args

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app.api.deps import SessionDep
from app.db import repository
from app.security import (
    CSRF_FIELD,
    Identity,
    csrf_token_for,
    quote_identity,
    set_csrf_cookie,
    verify_csrf,
)
from app.services import estimates, quotes, report
from app.services.charts import bar_chart
from app.services.forms import FormError, FormInvalid, FormValues, LengthStats, build_requests
from app.services.memtests import load_stored
from app.templating import templates
from estimator.errors import EstimatorInputError
from estimator.request import EstimateRequest, RecommendRequest
from estimator.setup import TrainingSetup

router = APIRouter(include_in_schema=False)

MAX_FORM_FILE_BYTES = 8 * 2**20


def _choices() -> dict[str, tuple[str, ...]]:
    fields = TrainingSetup.model_fields
    names = ("method", "optimizer", "precision", "checkpointing", "loss")
    return {n: tuple(get_args(fields[n].annotation)) for n in names}


def _render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    if "csrf_token" not in context:
        context["csrf_token"] = csrf_token_for(request)
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    new_token = getattr(request.state, "new_csrf_token", None)
    if new_token:
        set_csrf_cookie(response, new_token, request.app.state.settings)
    return response


def _error_page(request: Request, status_code: int, message: str) -> HTMLResponse:
    return _render(
        request, "error.html", {"status_code": status_code, "message": message}, status_code
    )


def _form_context(values: FormValues, errors: list[FormError] | None = None) -> dict[str, Any]:
    presets = estimates.list_presets()
    gpus = estimates.list_gpus()
    if not values.preset and presets:
        values.preset = presets[0]["id"]
    if not values.gpus and gpus:
        values.gpus = [gpus[0]["id"]]
    return {
        "v": values,
        "errors": errors or [],
        "presets": presets,
        "gpus": gpus,
        "profiles": estimates.list_profiles(),
        "choices": _choices(),
    }


@router.get("/", response_class=HTMLResponse)
def index(request: Request) -> HTMLResponse:
    return _render(request, "index.html", _form_context(FormValues()))


async def _file(form: Any, name: str) -> bytes | None:
    item = form.get(name)
    if isinstance(item, UploadFile) and item.filename:
        data = await item.read(MAX_FORM_FILE_BYTES + 1)
        if len(data) > MAX_FORM_FILE_BYTES:
            raise HTTPException(413, detail=f"{name}: larger than {MAX_FORM_FILE_BYTES} bytes")
        return data or None
    return None


def _setup_summary(setup: dict[str, Any]) -> str:
    parts = [setup.get("method", "?")]
    if setup.get("method") in ("lora", "qlora"):
        parts.append(f"rank {setup.get('lora_rank')} on {', '.join(setup.get('lora_targets', []))}")
    parts += [
        f"optimizer {setup.get('optimizer')}",
        f"precision {setup.get('precision')}",
        f"batch {setup.get('batch')}",
    ]
    return " · ".join(str(p) for p in parts)


def _result_context(variants: list[report.Variant], stats: LengthStats | None) -> dict[str, Any]:
    first = variants[0]
    model = first.document.get("model", {})
    opts = report.options(variants)
    return {
        "variants": variants,
        "model_name": model.get("name", "model"),
        "model_params_total": model.get("params_total"),
        "model_params_trainable": model.get("params_trainable"),
        "setup_summary": _setup_summary(first.request["setup"]),
        "usable_fraction": first.request.get("usable_fraction", 0.92),
        "table": report.fit_table(variants),
        "chart": bar_chart(report.memory_chart(variants)),
        "opts": opts,
        "show_costs": report.has_costs(opts),
        "assumptions": first.document.get("assumptions", {}),
        "lengths": stats,
    }


def _compute(requests: list[tuple[str, str, EstimateRequest]]) -> list[report.Variant]:
    return [
        report.Variant(ckpt, loss, req.model_dump(mode="json"), estimates.estimate(req))
        for ckpt, loss, req in requests
    ]


def _recommend(req: EstimateRequest) -> dict[str, Any]:
    """The best setting per GPU at the longest requested length (estimator.recommend)."""
    body = RecommendRequest(
        model=req.model,
        setup=req.setup,
        gpus=req.gpus,
        seq_len=max(req.seq_lens),
        dataset_lengths=req.dataset_lengths,
        tokens=req.tokens,
        epochs=req.epochs,
        prices=req.prices,
        usable_fraction=req.usable_fraction,
        profile=req.profile,
    )
    return estimates.recommend(body)


@router.post("/estimate", response_class=HTMLResponse)
async def estimate_page(request: Request) -> HTMLResponse:
    form = await request.form(max_files=4, max_fields=200)
    values = FormValues.from_form(form)
    try:
        config_file = await _file(form, "config_file")
        lengths_file = await _file(form, "lengths_file")
        requests, stats = build_requests(values, config_file=config_file, lengths_file=lengths_file)
        variants = await run_in_threadpool(_compute, requests)
        recommendation = await run_in_threadpool(_recommend, requests[0][2])
    except FormInvalid as exc:
        context = await run_in_threadpool(_form_context, values, exc.errors)
        return _render(request, "index.html", context, 422)
    except EstimatorInputError as exc:
        context = await run_in_threadpool(
            _form_context, values, [FormError(exc.field, exc.message)]
        )
        return _render(request, "index.html", context, 422)
    context = _result_context(variants, stats)
    context["recommendation"] = recommendation
    return _render(request, "result.html", context)


@router.post("/quotes")
async def save_quote(request: Request, session: SessionDep) -> Response:
    form = await request.form(max_files=0, max_fields=100)
    submitted = form.get(CSRF_FIELD)
    verify_csrf(request, submitted if isinstance(submitted, str) else None)
    bodies = [b for b in form.getlist("request_json") if isinstance(b, str)]
    try:
        index = int(str(form.get("variant", "0")))
        body = EstimateRequest.model_validate(json.loads(bodies[index]))
    except (ValueError, IndexError, ValidationError):
        return _error_page(request, 422, "The quote form is incomplete: make the estimate again.")
    title = str(form.get("title", ""))[:200]
    comment = str(form.get("comment", "")).strip()[:10_000] or None
    if "\x00" in f"{title}{comment or ''}":
        return _error_page(request, 422, "Title and comment may not contain NUL characters.")
    identity = _form_identity(request, form, "save quotes")
    if identity is None:
        return _error_page(request, 403, "That is not a requester or approver token.")
    try:
        quote = await run_in_threadpool(
            quotes.create_quote,
            session,
            body,
            title=title,
            created_by=identity.name,
            comment=comment,
        )
    except EstimatorInputError as exc:
        return _error_page(request, 422, f"{exc.field}: {exc.message}")
    return RedirectResponse(quotes.quote_url(quote.id), status_code=303)


def _form_identity(request: Request, form: Any, what: str) -> Identity | None:
    """The requester or approver behind the form's `token` field, or None."""
    token = str(form.get("token", "")).strip() or None
    if token is None:
        return None
    try:
        return quote_identity(token, request.app.state.settings, what)
    except HTTPException:
        return None


@router.get("/quotes", response_class=HTMLResponse)
def quotes_page(request: Request) -> HTMLResponse:
    """The list needs a token (a requester sees their own quotes, an approver all): the page
    asks for it and posts it (never in the URL)."""
    return _render(request, "quotes.html", {"quotes": None})


@router.post("/quotes/list", response_class=HTMLResponse)
async def quotes_list_page(request: Request, session: SessionDep) -> HTMLResponse:
    form = await request.form(max_files=0, max_fields=10)
    submitted = form.get(CSRF_FIELD)
    verify_csrf(request, submitted if isinstance(submitted, str) else None)
    identity = _form_identity(request, form, "list quotes")
    if identity is None:
        context = {"quotes": None, "error": "That is not a requester or approver token."}
        return _render(request, "quotes.html", context, 403)
    owner = None if identity.is_approver else identity.name
    rows = await run_in_threadpool(repository.list_quotes, session, created_by=owner, limit=500)
    context = {"quotes": [quotes.to_summary(q) for q in rows], "who": identity}
    return _render(request, "quotes.html", context)


def _quote_context(session: SessionDep, quote_id: str) -> dict[str, Any] | None:
    row = repository.get_quote(session, quote_id)
    if row is None:
        return None
    doc = quotes.to_document(session, row)
    setup = doc.request.get("setup", {})
    variant = report.Variant(
        setup.get("checkpointing", "?"), setup.get("loss", "?"), doc.request, doc.estimate
    )
    opts = report.options([variant])
    return {
        "quote": doc,
        "table": report.fit_table([variant]),
        "chart": bar_chart(report.memory_chart([variant])),
        "opts": opts,
        "show_costs": report.has_costs(opts),
    }


@router.get("/quotes/{quote_id}", response_class=HTMLResponse)
def quote_page(request: Request, session: SessionDep, quote_id: str) -> HTMLResponse:
    context = _quote_context(session, quote_id)
    if context is None:
        return _error_page(request, 404, f"No quote {quote_id!r}.")
    done = request.query_params.get("done")
    if done in ("approved", "rejected", "repriced"):
        context["message"] = f"Quote {done}."
    return _render(request, "quote.html", context)


@router.post("/quotes/{quote_id}/decision", response_class=HTMLResponse)
async def decide_quote(request: Request, session: SessionDep, quote_id: str) -> Response:
    """Approve, reject or re-price from the quote page (a token field; CSRF checked). Approving
    binds to the content hash the page was rendered with (hidden field)."""
    form = await request.form(max_files=0, max_fields=20)
    submitted = form.get(CSRF_FIELD)
    verify_csrf(request, submitted if isinstance(submitted, str) else None)
    decision = str(form.get("decision"))
    comment = str(form.get("comment", "")).strip()[:10_000] or None
    seen_hash = str(form.get("content_hash", "")).strip()[:64] or None
    to_status = {"approve": "approved", "reject": "rejected", "reprice": "repriced"}.get(decision)

    def fail(status_code: int, message: str) -> HTMLResponse:
        context = _quote_context(session, quote_id)
        if context is None:
            return _error_page(request, 404, f"No quote {quote_id!r}.")
        context["error"] = message
        return _render(request, "quote.html", context, status_code)

    quote = repository.get_quote(session, quote_id)
    if quote is None:
        return _error_page(request, 404, f"No quote {quote_id!r}.")
    if to_status is None:
        return fail(422, "Choose approve, reject or re-price.")
    if comment and "\x00" in comment:
        return fail(422, "The comment may not contain NUL characters.")
    identity = _form_identity(request, form, "decide quotes")
    if to_status == "repriced":
        if identity is None or not (identity.is_approver or identity.name == quote.created_by):
            return fail(403, "Re-pricing needs the creator's token or an approver token.")
        try:
            await run_in_threadpool(quotes.reprice, session, quote, identity.name)
        except (repository.TransitionError, repository.ContentChanged) as exc:
            return fail(409, str(exc))
        return RedirectResponse(f"{quotes.quote_url(quote_id)}?done=repriced", status_code=303)
    if identity is None or not identity.is_approver:
        actor = identity.name if identity else "invalid-token"
        reason = "That is not an approver token."
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


@router.get("/memtests", response_class=HTMLResponse)
def memtests_page(request: Request, session: SessionDep) -> HTMLResponse:
    rows, _ = repository.list_memtests(session, limit=500)
    base_url = request.app.state.settings.base_url.rstrip("/") + "/"  # never the Host header
    return _render(request, "memtests.html", {"items": rows, "base_url": base_url})


@router.get("/memtests/{memtest_id}", response_class=HTMLResponse)
def memtest_page(
    request: Request, session: SessionDep, memtest_id: str, profile: str = "default"
) -> HTMLResponse:
    row = repository.get_memtest(session, memtest_id)
    if row is None:
        return _error_page(request, 404, f"No memtest {memtest_id!r}.")
    doc = load_stored(row.raw_json)
    profiles = estimates.list_profiles()
    if profile not in profiles:
        profile = "default"
    error = None
    try:
        rows = report.comparison_rows(estimates.compare_memtest(doc, profile=profile))
    except (EstimatorInputError, ValidationError) as exc:  # the stored file, not this request
        error = (
            f"{exc.field}: {exc.message}"
            if isinstance(exc, EstimatorInputError)
            else "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3]
            )
        )
        rows = [
            report.ComparisonRow(
                r["seq_len"], r["status"], r.get("peak_allocated_bytes"), None, None, None
            )
            for r in doc.get("results", [])
        ]
    context = {
        "m": row,
        "env": doc.get("environment", {}),
        "setup_summary": _setup_summary(doc.get("setup", {})),
        "profiles": profiles,
        "profile": profile,
        "rows": rows,
        "comparison_error": error,
        "chart": bar_chart(
            report.comparison_chart(rows, doc.get("environment", {}).get("total_memory_bytes"))
        ),
    }
    return _render(request, "memtest.html", context)
