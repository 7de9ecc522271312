"""Quotes: create one (computing the estimate now) and render rows as API documents."""

from __future__ import annotations

import json

from sqlalchemy.orm import Session

from app.db import repository
from app.db.models import Quote
from app.schemas import AuditOut, QuoteCreate, QuoteOut, QuoteSummary
from app.services import estimates
from estimator.request import EstimateRequest


def quote_url(quote_id: str) -> str:
    return f"/quotes/{quote_id}"


def create_quote(
    session: Session,
    request: EstimateRequest,
    *,
    title: str,
    created_by: str,
    comment: str | None = None,
    submit: bool = True,
) -> Quote:
    document = estimates.estimate(request)
    return repository.add_quote(
        session,
        title=title,
        request=request.model_dump(mode="json"),
        estimate=document,
        created_by=created_by,
        status="pending" if submit else "draft",
        comment=comment,
    )


def create_from_api(session: Session, body: QuoteCreate) -> Quote:
    return create_quote(
        session,
        body.request,
        title=body.title,
        created_by=body.created_by,
        comment=body.comment,
        submit=body.submit,
    )


def to_summary(quote: Quote) -> QuoteSummary:
    return QuoteSummary(
        id=quote.id,
        title=quote.title,
        status=quote.status,  # type: ignore[arg-type]
        created_by=quote.created_by,
        created_at=quote.created_at,
        approver=quote.approver,
        decided_at=quote.decided_at,
        url=quote_url(quote.id),
    )


def to_document(session: Session, quote: Quote) -> QuoteOut:
    trail = repository.audit_trail(session, quote.id)
    return QuoteOut(
        **to_summary(quote).model_dump(),
        comment=quote.comment,
        request=json.loads(quote.request_json),
        estimate=json.loads(quote.estimate_json),
        audit=[
            AuditOut(
                from_status=e.from_status,  # type: ignore[arg-type]
                to_status=e.to_status,  # type: ignore[arg-type]
                actor=e.actor,
                comment=e.comment,
                at=e.at,
            )
            for e in trail
        ],
    )
