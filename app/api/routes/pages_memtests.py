"""HTML pages for memtests: the list with a web upload (upload token; CSRF checked), and a
memtest's page: measured vs estimated per sequence length and per component (allocated and
reserved), measured vs estimated tokens/s, and "calibrate from this memtest" (the estimate
re-priced with the measured speed: `GET /estimate?...calib_*`)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from app.api.deps import SessionDep
from app.db import repository
from app.security import CSRF_FIELD, match_token, verify_csrf
from app.services import estimates
from app.services.charts import bar_chart
from app.services.forms import FormValues
from app.services.memtest_view import (
    comparison_chart,
    component_rows,
    peak_rows,
    unit_for,
)
from app.services.memtests import load_stored, parse_upload
from app.web.render import error_page, render
from estimator.errors import EstimatorInputError
from memtest_schema import MemtestSchemaError

router = APIRouter(include_in_schema=False)

MAX_MEMTEST_BYTES = 16 * 2**20
CALIBRATE_GPUS = ("a100-80gb", "h100-80gb", "h200", "rtx-pro-6000")


def _list_context(request: Request, session: SessionDep) -> dict[str, Any]:
    rows, _ = repository.list_memtests(session, limit=500)
    base_url = request.app.state.settings.base_url.rstrip("/") + "/"  # never the Host header
    return {"items": rows, "base_url": base_url}


@router.get("/memtests", response_class=HTMLResponse)
def memtests_page(request: Request, session: SessionDep) -> HTMLResponse:
    return render(request, "memtests.html", _list_context(request, session))


@router.post("/memtests/upload", response_class=HTMLResponse)
async def upload_page(request: Request, session: SessionDep) -> Response:
    """The web upload: a memtest file and an upload token (the same token as the REST upload)."""
    form = await request.form(max_files=1, max_fields=10)
    submitted = form.get(CSRF_FIELD)
    verify_csrf(request, submitted if isinstance(submitted, str) else None)

    def fail(status_code: int, message: str) -> HTMLResponse:
        context = _list_context(request, session)
        context["error"] = message
        return render(request, "memtests.html", context, status_code)

    token = str(form.get("token", "")).strip()
    entry = match_token(token, request.app.state.settings.upload_tokens) if token else None
    if entry is None:
        return fail(403, "That is not an upload token (TRAINFIT_UPLOAD_TOKENS).")
    item = form.get("memtest_file")
    if isinstance(item, str) or item is None or not item.filename:
        return fail(422, "Choose a memtest_*.json file.")
    raw = await item.read(MAX_MEMTEST_BYTES + 1)
    if len(raw) > MAX_MEMTEST_BYTES:
        return fail(413, f"The file is larger than {MAX_MEMTEST_BYTES // 2**20} MiB.")
    try:
        parsed = parse_upload(raw)
    except MemtestSchemaError as exc:
        return fail(422, f"Not a trainfit.memtest/1 file: {exc}")
    row, _ = await run_in_threadpool(
        repository.add_memtest,
        session,
        raw=parsed.text,
        sha256=parsed.sha256,
        fields=parsed.fields,
        uploaded_by=entry.name,
    )
    return RedirectResponse(f"/memtests/{row.id}", status_code=303)


def _calibrate_query(doc: dict[str, Any], gpu: str, seq: int, tps: float, mid: str) -> str:
    """The estimate form's inputs for the memtest's model and setup, calibrated."""
    setup = doc.get("setup") or {}
    values = FormValues(
        model_source="config",
        config_text=json.dumps((doc.get("model") or {}).get("config") or {}),
        model_name=str((doc.get("model") or {}).get("name") or ""),
        stack=str(setup.get("stack") or "probe"),
        method=str(setup.get("method") or "full"),
        lora_rank=str(setup.get("lora_rank") or 16),
        lora_targets=",".join(setup.get("lora_targets") or ["all-linear"]),
        optimizer=str(setup.get("optimizer") or "adamw"),
        precision=str(setup.get("precision") or "mixed"),
        checkpointing=[str(setup.get("checkpointing") or "gpu")],
        loss=[str(setup.get("loss") or "full")],
        batch=str(setup.get("batch") or 1),
        seq_lens=str(seq),
        gpus=list(dict.fromkeys([gpu, *CALIBRATE_GPUS])),
        calib_gpu=gpu,
        calib_seq=str(seq),
        calib_tps=f"{tps:.6g}",
        calib_source=mid,
    )
    return values.query()


@router.get("/memtests/{memtest_id}", response_class=HTMLResponse)
def memtest_page(
    request: Request, session: SessionDep, memtest_id: str, profile: str = "default"
) -> HTMLResponse:
    row = repository.get_memtest(session, memtest_id)
    if row is None:
        return error_page(request, 404, f"No memtest {memtest_id!r}.")
    doc = load_stored(row.raw_json)
    env = doc.get("environment", {})
    profiles = estimates.list_profiles()
    if profile not in profiles:
        profile = "default"
    error = None
    comparison: dict[str, Any] = {"rows": []}
    try:
        comparison = estimates.compare_memtest(doc, profile=profile)
    except (EstimatorInputError, ValidationError) as exc:  # the stored file, not this request
        error = (
            f"{exc.field}: {exc.message}"
            if isinstance(exc, EstimatorInputError)
            else "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3]
            )
        )
    peaks = peak_rows(doc, comparison)
    unit = unit_for(peaks)
    # the card the memtest ran on and its tokens/s next to the time model's: compare_memtest's
    gpu, speeds = comparison.get("gpu"), comparison.get("speed", [])
    calibrate = [
        {
            "seq_len": s["seq_len"],
            "tps": s["measured_tokens_per_second"],
            "query": _calibrate_query(
                doc, gpu, s["seq_len"], s["measured_tokens_per_second"], row.id
            ),
        }
        for s in speeds
        if gpu and s["measured_tokens_per_second"]
    ]
    context = {
        "m": row,
        "env": env,
        "setup": doc.get("setup", {}),
        "profiles": profiles,
        "profile": profile,
        "peaks": peaks,
        "outside": any(p["measured_outside"] is not None for p in peaks),
        "reserved_simulated": any(p["reserved_simulated"] for p in peaks),
        "components": component_rows(comparison),
        "speeds": speeds,
        "gpu": gpu,
        "calibrate": calibrate,
        "unit": unit,
        "comparison_error": error,
        "chart": bar_chart(
            comparison_chart(
                peaks, env.get("total_memory_bytes") if env.get("device") == "cuda" else None, unit
            )
        ),
    }
    return render(request, "memtest.html", context)
