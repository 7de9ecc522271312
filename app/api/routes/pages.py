"""HTML pages: the estimate form and its result.

`POST /estimate` (the form, files included) and `GET /estimate?<inputs>` (the estimate's link)
render the same result; `GET /?<inputs>` is the form pre-filled with them ("edit these
inputs"); `GET /estimate.md|.csv?<inputs>` is the result as the CLI prints it."""

from __future__ import annotations

from typing import Any, get_args

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, PlainTextResponse
from starlette.datastructures import UploadFile

from app.services import estimates, report
from app.services.charts import bar_chart
from app.services.forms import (
    FormError,
    FormInvalid,
    FormValues,
    build_requests,
    form_field,
    link_query,
)
from app.web.render import render
from estimator.errors import EstimatorInputError
from estimator.request import EstimateRequest, RecommendRequest, SolverRequest
from estimator.setup import TrainingSetup

router = APIRouter(include_in_schema=False)

MAX_FORM_FILE_BYTES = 8 * 2**20
TRAIN_CONFIG_FORMATS = (
    "axolotl",
    "llamafactory",
    "torchtune",
    "trl",
    "deepspeed",
    "accelerate",
    "peft",
)


def _choices() -> dict[str, tuple[str, ...]]:
    fields = TrainingSetup.model_fields
    names = ("stack", "objective", "method", "optimizer", "precision", "checkpointing", "loss")
    return {n: tuple(get_args(fields[n].annotation)) for n in names}


def _form_context(values: FormValues, errors: list[FormError] | None = None) -> dict[str, Any]:
    presets = estimates.list_presets()
    gpus = estimates.list_gpus()
    if not values.preset and presets:
        values.preset = presets[0]["id"]
    if not values.gpus and gpus:
        values.gpus = [gpus[0]["id"]]
    found = errors or []
    return {
        "v": values,
        "errors": found,
        "field_errors": {e.field: e.message for e in reversed(found)},
        "presets": presets,
        "gpus": gpus,
        "profiles": estimates.list_profiles(),
        "choices": _choices(),
        "train_config_formats": TRAIN_CONFIG_FORMATS,
    }


@router.get("/", response_class=HTMLResponse)
def index(request: Request) -> HTMLResponse:
    """The form; with the inputs of an estimate in the query string, pre-filled with them."""
    values = FormValues.from_form(request.query_params) if request.query_params else FormValues()
    return render(request, "index.html", _form_context(values))


async def _file_text(form: Any, name: str) -> tuple[str, str] | None:
    """(file name, text) of an uploaded file field, or None when none was chosen."""
    item = form.get(name)
    if not (isinstance(item, UploadFile) and item.filename):
        return None
    data = await item.read(MAX_FORM_FILE_BYTES + 1)
    if len(data) > MAX_FORM_FILE_BYTES:
        raise FormInvalid([FormError(name, f"larger than {MAX_FORM_FILE_BYTES // 2**20} MiB")])
    try:
        return item.filename, data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise FormInvalid([FormError(name, "not a UTF-8 text file")]) from None


async def _values_with_files(form: Any) -> FormValues:
    """The form's values with each uploaded file as text: a chosen config.json makes the model
    source `config` (the file is what the user meant, whatever radio stayed selected)."""
    values = FormValues.from_form(form)
    config = await _file_text(form, "config_file")
    if config is not None:
        values.config_text, values.model_source = config[1], "config"
        if not values.model_name:
            values.model_name = config[0].rsplit(".", 1)[0]
    lengths = await _file_text(form, "lengths_file")
    if lengths is not None:
        values.lengths_name, values.lengths_text = lengths
    train_config = await _file_text(form, "train_config_file")
    if train_config is not None:
        values.train_config_name, values.train_config_text = train_config
    return values


def compute(values: FormValues) -> list[report.Variant]:
    """Every (checkpointing, loss) request of the form, estimated. Raises FormInvalid."""
    requests = build_requests(values)
    try:
        return [
            report.Variant(ckpt, loss, req.model_dump(mode="json"), estimates.estimate(req))
            for ckpt, loss, req in requests
        ]
    except EstimatorInputError as exc:
        raise FormInvalid([FormError(form_field(exc.field), exc.message)]) from None


def recommend_for(req: EstimateRequest) -> dict[str, Any] | None:
    """The best setting per GPU for the length the run needs: the longest sample of the
    dataset when one is given (estimator.recommend counts what each length drops), else the
    longest requested length."""
    body = RecommendRequest(
        model=req.model,
        setup=req.setup,
        gpus=req.gpus,
        seq_len=None if req.dataset_lengths else max(req.seq_lens),
        dataset_lengths=req.dataset_lengths,
        tokens=req.tokens,
        epochs=req.epochs,
        prices=req.prices,
        usable_fraction=req.usable_fraction,
        profile=req.profile,
    )
    try:
        return estimates.recommend(body)
    except EstimatorInputError:
        return None


def _max_context(variants: list[report.Variant]) -> list[dict[str, Any]]:
    """The longest sequence (a multiple of 256) per GPU option and setting, from the solver."""
    out = []
    for v in variants:
        req = EstimateRequest.model_validate(v.request)
        for gpu in req.gpus:
            answer = estimates.max_seq(
                SolverRequest(
                    model=req.model,
                    setup=req.setup,
                    gpu=gpu,
                    usable_fraction=req.usable_fraction,
                    profile=req.profile,
                )
            )
            out.append({"variant": v.label, "gpu": gpu, "seq_len": answer.get("seq_len")})
    return out


def _dataset(report_: dict[str, Any] | None) -> dict[str, Any] | None:
    """The document's dataset report with its rows by maximum length (for the fit table)."""
    if not report_:
        return None
    return {**report_, "by_seq": {d["max_seq"]: d for d in report_.get("by_max_seq", [])}}


def result_context(variants: list[report.Variant], values: FormValues) -> dict[str, Any]:
    first = variants[0]
    model = first.document.get("model", {})
    opts = report.options(variants)
    query = link_query(values)
    req = EstimateRequest.model_validate(first.request)
    max_context = _max_context(variants)
    return {
        "variants": variants,
        "model_name": model.get("name", "model"),
        "model_params_total": model.get("params_total"),
        "model_params_trainable": model.get("params_trainable"),
        "model_notes": model.get("notes", []),
        "setup_summary": report.setup_summary(first.document.get("setup", first.request["setup"])),
        "profile": first.request.get("profile", "default"),
        "usable_fraction": first.request.get("usable_fraction", 0.92),
        "table": report.fit_table(variants),
        "chart": bar_chart(report.memory_chart(variants)),
        "max_context": max_context,
        "max_context_chart": bar_chart(report.max_context_chart(max_context, req.seq_lens)),
        "opts": opts,
        "assumptions": first.document.get("assumptions", {}),
        "dataset": _dataset(first.document.get("dataset")),
        "train_config": first.document.get("train_config"),
        "calibration": first.document.get("calibration"),
        "recommendation": recommend_for(req),
        "query": query,
        "values": values,
    }


async def _result(request: Request, values: FormValues) -> HTMLResponse:
    try:
        variants = await run_in_threadpool(compute, values)
        context = await run_in_threadpool(result_context, variants, values)
    except FormInvalid as exc:
        context = await run_in_threadpool(_form_context, values, exc.errors)
        return render(request, "index.html", context, 422)
    return render(request, "result.html", context)


@router.post("/estimate", response_class=HTMLResponse)
async def estimate_page(request: Request) -> HTMLResponse:
    form = await request.form(max_files=4, max_fields=200)
    try:
        values = await _values_with_files(form)
    except FormInvalid as exc:
        values = FormValues.from_form(form)
        context = await run_in_threadpool(_form_context, values, exc.errors)
        return render(request, "index.html", context, 422)
    return await _result(request, values)


@router.get("/estimate", response_class=HTMLResponse)
async def estimate_link(request: Request) -> HTMLResponse:
    """The estimate's link: its inputs in the query string."""
    return await _result(request, FormValues.from_form(request.query_params))


def _combined_document(values: FormValues) -> dict[str, Any]:
    """One document with a row per (length, checkpointing, loss), as `trainfit estimate` with
    comma lists makes (estimator.document.estimate's variants)."""
    from estimator.document import estimate

    requests = build_requests(values)
    variants = [{"checkpointing": c, "loss": x} for c, x, _ in requests]
    return estimate(requests[0][2], variants if len(variants) > 1 else None)


@router.get("/estimate.{fmt}", response_class=PlainTextResponse)
async def estimate_text(request: Request, fmt: str) -> PlainTextResponse:
    """The estimate as Markdown or CSV (what `trainfit estimate --format markdown|csv` prints)."""
    from estimator.formats import render_csv, render_markdown

    if fmt not in ("md", "csv"):
        raise HTTPException(404, detail="formats: md, csv")
    values = FormValues.from_form(request.query_params)
    try:
        doc = await run_in_threadpool(_combined_document, values)
    except FormInvalid as exc:
        text = "\n".join(f"{e.field}: {e.message}" for e in exc.errors)
        return PlainTextResponse(text + "\n", status_code=422)
    except EstimatorInputError as exc:
        return PlainTextResponse(f"{form_field(exc.field)}: {exc.message}\n", status_code=422)
    if fmt == "csv":
        return PlainTextResponse(render_csv(doc), media_type="text/csv; charset=utf-8")
    return PlainTextResponse(render_markdown(doc), media_type="text/markdown; charset=utf-8")
