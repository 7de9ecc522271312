"""What an approver reads first about a quote: model, method, stack, profile, setup, lengths,
the chosen GPU option and the total (hours, USD) with the price's source; a price typed in the
request (an override) is flagged, never shown as a catalog price."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.db.models import Quote
from app.services.quotes import quote_url
from app.services.report import missing_reason, setup_summary


@dataclass(frozen=True)
class QuoteView:
    id: str
    url: str
    title: str
    status: str
    created_by: str
    created_at: Any
    approver: str | None
    model: str
    method: str
    stack: str
    profile: str
    setup: str
    seq_lens: list[int]
    option: str  # the chosen GPU option, or the options when several were saved
    verdict: str | None
    wall_hours: float | None
    gpu_hours: float | None
    cards: int | None
    usd: float | None
    usd_per_gpu_hour: float | None
    price_source: str
    override: bool
    missing: str | None
    tokens: float | None


def quote_view(quote: Quote) -> QuoteView:
    request: dict[str, Any] = json.loads(quote.request_json)
    estimate: dict[str, Any] = json.loads(quote.estimate_json)
    setup = estimate.get("setup") or request.get("setup", {})
    gpus: list[str] = list(request.get("gpus", []))
    training = estimate.get("training") or {}
    chosen = gpus[0] if len(gpus) == 1 else None
    option: dict[str, Any] = (training.get("options") or {}).get(chosen, {}) if chosen else {}
    source = str(option.get("price_source") or "none")
    verdict = option.get("verdict")
    return QuoteView(
        id=quote.id,
        url=quote_url(quote.id),
        title=quote.title,
        status=quote.status,
        created_by=quote.created_by,
        created_at=quote.created_at,
        approver=quote.approver,
        model=str(estimate.get("model", {}).get("name", "?")),
        method=str(setup.get("method", "?")),
        stack=str(setup.get("stack", "hf")),
        profile=str(request.get("profile", "default")),
        setup=setup_summary(setup),
        seq_lens=list(request.get("seq_lens", [])),
        option=chosen or ", ".join(gpus),
        verdict=verdict,
        wall_hours=option.get("wall_hours") if verdict == "fits" else None,
        gpu_hours=option.get("gpu_hours") if verdict == "fits" else None,
        cards=option.get("gpus"),
        usd=option.get("cost_usd") if verdict == "fits" else None,
        usd_per_gpu_hour=option.get("usd_per_gpu_hour"),
        price_source=source,
        override=source.startswith("override"),
        missing=missing_reason(str(verdict), option, chosen)
        if chosen
        else "several GPU options: no single total",
        tokens=training.get("tokens"),
    )
