from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from app.api.deps import ApproverDep, SessionDep
from app.db import repository
from app.db.models import QUOTE_STATUSES
from app.schemas import (
    MAX_OFFSET,
    DecisionIn,
    MessageOut,
    QuoteCreate,
    QuoteOut,
    QuoteStatus,
    QuoteSummary,
)
from app.services import quotes

router = APIRouter(prefix="/v1/quotes", tags=["quotes"])

_AUTH = {401: {"model": MessageOut}, 403: {"model": MessageOut}, 404: {"model": MessageOut}}


@router.post(
    "",
    status_code=201,
    response_model=QuoteOut,
    summary="Save an estimate as a quote (pending approval unless `submit` is false)",
)
def create(session: SessionDep, body: QuoteCreate) -> QuoteOut:
    quote = quotes.create_from_api(session, body)
    return quotes.to_document(session, quote)


@router.get("", response_model=list[QuoteSummary], summary="Quotes, newest first")
def list_quotes(
    session: SessionDep,
    status: QuoteStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[QuoteSummary]:
    rows = repository.list_quotes(session, status=status, limit=limit, offset=offset)
    return [quotes.to_summary(q) for q in rows]


@router.get(
    "/{quote_id}",
    response_model=QuoteOut,
    summary="A quote with its audit trail",
    responses={404: {"model": MessageOut}},
)
def get_quote(session: SessionDep, quote_id: str) -> QuoteOut:
    quote = repository.get_quote(session, quote_id)
    if quote is None:
        raise HTTPException(404, detail=f"no quote {quote_id!r}")
    return quotes.to_document(session, quote)


def _decide(
    session: SessionDep, quote_id: str, to_status: str, actor: str, comment: str | None
) -> QuoteOut:
    assert to_status in QUOTE_STATUSES
    try:
        quote = repository.change_quote_status(
            session, quote_id, to_status=to_status, actor=actor, comment=comment
        )
    except repository.TransitionError as exc:
        raise HTTPException(409, detail=str(exc)) from None
    if quote is None:
        raise HTTPException(404, detail=f"no quote {quote_id!r}")
    return quotes.to_document(session, quote)


@router.post(
    "/{quote_id}/approve",
    response_model=QuoteOut,
    summary="Approve a pending quote (approver token)",
    responses={**_AUTH, 409: {"model": MessageOut, "description": "not pending"}},
)
def approve(
    session: SessionDep, quote_id: str, approver: ApproverDep, body: DecisionIn | None = None
) -> QuoteOut:
    return _decide(session, quote_id, "approved", approver, body.comment if body else None)


@router.post(
    "/{quote_id}/reject",
    response_model=QuoteOut,
    summary="Reject a pending quote (approver token)",
    responses={**_AUTH, 409: {"model": MessageOut, "description": "not pending"}},
)
def reject(
    session: SessionDep, quote_id: str, approver: ApproverDep, body: DecisionIn | None = None
) -> QuoteOut:
    return _decide(session, quote_id, "rejected", approver, body.comment if body else None)


@router.post(
    "/{quote_id}/submit",
    response_model=QuoteOut,
    summary="Submit a draft for approval",
    responses={404: {"model": MessageOut}, 409: {"model": MessageOut}},
)
def submit(session: SessionDep, quote_id: str, body: DecisionIn | None = None) -> QuoteOut:
    quote = repository.get_quote(session, quote_id)
    actor = quote.created_by if quote else "anonymous"
    return _decide(session, quote_id, "pending", actor, body.comment if body else None)
