"""Quotes over REST. Who may do what (tokens: `Authorization: Bearer <token>`):

- create, submit (own drafts), re-price (own drafts/pending), list (own): a requester token;
- the same on every quote, plus approve and reject: an approver token;
- read one quote by its (unguessable) id: anyone with the id, as the quote page.

Approve is bound to content: it needs the quote's `content_hash` (body or `If-Match`) and is
refused (409) when the stored request/estimate, the GPU catalog or the profile changed since the
quote was priced. Every refused approve, reject or submit is recorded in the audit trail.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app.api.deps import SessionDep
from app.api.strict import StrictJsonRoute
from app.db import repository
from app.db.models import Quote
from app.errors import estimator_field_path
from app.schemas import (
    MAX_OFFSET,
    DecisionIn,
    MessageOut,
    QuoteCreate,
    QuoteOut,
    QuoteStatus,
    QuoteSummary,
)
from app.security import Identity, bearer_token, quote_identity, require_quote_identity
from app.services import content, quotes
from app.services.idempotency import IdempotencyKeyHeader, replay_or_claim
from estimator.errors import EstimatorInputError

router = APIRouter(prefix="/v1/quotes", tags=["quotes"], route_class=StrictJsonRoute)

IdentityDep = Annotated[Identity, Depends(require_quote_identity)]
IfMatch = Annotated[
    str | None,
    Header(
        max_length=200,
        description="the quote's content_hash (its ETag), instead of the body field",
    ),
]

_AUTH: dict[int | str, dict[str, Any]] = {
    401: {"model": MessageOut},
    403: {"model": MessageOut},
    404: {"model": MessageOut},
}
_DECIDE: dict[int | str, dict[str, Any]] = {
    **_AUTH,
    409: {"model": MessageOut, "description": "not pending, or its content changed"},
}


def _found(session: SessionDep, quote_id: str) -> Quote:
    quote = repository.get_quote(session, quote_id)
    if quote is None:
        raise HTTPException(404, detail=f"no quote {quote_id[:100]!r}")
    return quote


def _document(session: SessionDep, quote: Quote, response: Response | None = None) -> QuoteOut:
    doc = quotes.to_document(session, quote)
    if response is not None and doc.content_hash:
        response.headers["ETag"] = f'"{doc.content_hash}"'
    return doc


@router.post(
    "",
    status_code=201,
    response_model=QuoteOut,
    summary="Save an estimate as a quote (requester or approver token; pending unless "
    "`submit` is false). `Idempotency-Key`: a retry with the same key and body gets the same "
    "quote; the same key with another body is a 422",
    responses={**_AUTH, 422: {"description": "invalid request, or a reused Idempotency-Key"}},
)
def create(
    session: SessionDep,
    body: QuoteCreate,
    identity: IdentityDep,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> QuoteOut:
    claim = None
    if idempotency_key is not None:
        replayed, claim = replay_or_claim(
            session,
            scope="quote",
            actor=identity.name,
            key=idempotency_key,
            body_sha256=content.sha256_hex(body.model_dump(mode="json")),
        )
        if replayed is not None:
            return _document(session, _found(session, replayed), response)
    try:
        quote = quotes.create_from_api(session, body, identity.name, claim)
    except EstimatorInputError as exc:  # the estimator names fields of the request: nest them
        raise EstimatorInputError(
            f"request.{estimator_field_path(exc.field)}", exc.message
        ) from None
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ["body", "request", *e["loc"]]} for e in exc.errors(include_url=False)]
        ) from None
    except repository.IdempotencyReplay as race:  # a concurrent retry won: answer as it did
        if claim is None or race.record.body_sha256 != claim.body_sha256:
            raise HTTPException(422, detail="Idempotency-Key reused with another body") from None
        quote = _found(session, race.record.resource_id)
    return _document(session, quote, response)


@router.get(
    "",
    response_model=list[QuoteSummary],
    summary="Quotes, newest first: a requester sees their own, an approver all",
    responses={401: {"model": MessageOut}, 403: {"model": MessageOut}},
)
def list_quotes(
    session: SessionDep,
    identity: IdentityDep,
    status: QuoteStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[QuoteSummary]:
    rows = repository.list_quotes(
        session,
        status=status,
        created_by=None if identity.is_approver else identity.name,
        limit=limit,
        offset=offset,
    )
    return [quotes.to_summary(q) for q in rows]


@router.get(
    "/{quote_id}",
    response_model=QuoteOut,
    summary="A quote with its audit trail and content hash (also its ETag)",
    responses={404: {"model": MessageOut}},
)
def get_quote(session: SessionDep, quote_id: str, response: Response) -> QuoteOut:
    return _document(session, _found(session, quote_id), response)


def _acting(request: Request, session: SessionDep, quote: Quote, wanted: str) -> Identity:
    """The identity behind the request's token. A wrong token is a 403 and is audited (actor
    `invalid-token`); no token at all is a 401 (not audited: no credential was tried)."""
    settings = request.app.state.settings
    presented = bearer_token(request)
    try:
        return quote_identity(presented, settings, f"change quotes ({wanted})")
    except HTTPException as exc:
        if exc.status_code == 403:
            repository.record_denied(
                session, quote, wanted=wanted, actor="invalid-token", reason="unknown token"
            )
        raise


def _refuse(session: SessionDep, quote: Quote, identity: Identity, wanted: str, why: str) -> None:
    repository.record_denied(session, quote, wanted=wanted, actor=identity.name, reason=why)
    raise HTTPException(403, detail=why)


def _decide(
    session: SessionDep,
    quote: Quote,
    identity: Identity,
    to_status: str,
    body: DecisionIn | None,
    if_match: str | None = None,
) -> QuoteOut:
    presented = (body.content_hash if body else None) or _etag_value(if_match)
    try:
        changed = quotes.decide(
            session,
            quote,
            to_status=to_status,
            actor=identity.name,
            comment=body.comment if body else None,
            presented_hash=presented,
        )
    except quotes.DecisionRefused as exc:
        raise HTTPException(exc.status_code, detail=exc.reason) from None
    return _document(session, changed)


def _etag_value(if_match: str | None) -> str | None:
    if not if_match:
        return None
    value = if_match.strip().removeprefix("W/").strip('"')
    return value or None


@router.post(
    "/{quote_id}/approve",
    response_model=QuoteOut,
    summary="Approve a pending quote (approver token; `content_hash` or If-Match required)",
    responses={**_DECIDE, 428: {"model": MessageOut, "description": "no content_hash"}},
)
def approve(
    request: Request,
    session: SessionDep,
    quote_id: str,
    if_match: IfMatch = None,
    body: DecisionIn | None = None,
) -> QuoteOut:
    quote = _found(session, quote_id)
    identity = _acting(request, session, quote, "approved")
    if not identity.is_approver:
        _refuse(session, quote, identity, "approved", "this token may not approve quotes")
    return _decide(session, quote, identity, "approved", body, if_match)


@router.post(
    "/{quote_id}/reject",
    response_model=QuoteOut,
    summary="Reject a pending quote (approver token)",
    responses=_DECIDE,
)
def reject(
    request: Request, session: SessionDep, quote_id: str, body: DecisionIn | None = None
) -> QuoteOut:
    quote = _found(session, quote_id)
    identity = _acting(request, session, quote, "rejected")
    if not identity.is_approver:
        _refuse(session, quote, identity, "rejected", "this token may not reject quotes")
    return _decide(session, quote, identity, "rejected", body)


@router.post(
    "/{quote_id}/submit",
    response_model=QuoteOut,
    summary="Submit a draft for approval (its creator's requester token, or an approver's)",
    responses=_DECIDE,
)
def submit(
    request: Request, session: SessionDep, quote_id: str, body: DecisionIn | None = None
) -> QuoteOut:
    quote = _found(session, quote_id)
    identity = _acting(request, session, quote, "pending")
    if not identity.is_approver and identity.name != quote.created_by:
        _refuse(session, quote, identity, "pending", "only its creator may submit this draft")
    return _decide(session, quote, identity, "pending", body)


@router.post(
    "/{quote_id}/reprice",
    response_model=QuoteOut,
    summary="Price a draft or pending quote again with today's catalog and profile (its "
    "creator's token or an approver's): a new version with a new content_hash",
    responses={**_AUTH, 409: {"model": MessageOut, "description": "decided, or changed"}},
)
def reprice(request: Request, session: SessionDep, quote_id: str, response: Response) -> QuoteOut:
    quote = _found(session, quote_id)
    identity = _acting(request, session, quote, quote.status)
    if not identity.is_approver and identity.name != quote.created_by:
        raise HTTPException(403, detail="only its creator or an approver may re-price a quote")
    try:
        quote = quotes.reprice(session, quote, identity.name)
    except (repository.TransitionError, repository.ContentChanged) as exc:
        raise HTTPException(409, detail=str(exc)) from None
    return _document(session, quote, response)
