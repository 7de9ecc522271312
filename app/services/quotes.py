"""Quotes: create one (computing the estimate now), re-price it, decide it with the approval
bound to its content, and render rows as API documents."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from app.db import repository
from app.db.models import Quote
from app.schemas import AuditOut, QuoteCreate, QuoteOut, QuoteSummary
from app.services import content, estimates
from estimator.request import EstimateRequest


def quote_url(quote_id: str) -> str:
    return f"/quotes/{quote_id}"


def _priced(
    request: EstimateRequest, recommendation: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any], repository.Content]:
    """(request JSON, estimate, content) for a request priced now. `recommendation`: what the
    web page recommended when the quote was saved, kept in the document (and its hash)."""
    document = estimates.estimate(request)
    if recommendation is not None:
        document = {**document, "recommendation": recommendation}
    request_json = request.model_dump(mode="json")
    versions = content.current_versions(request.profile)
    return (
        request_json,
        document,
        repository.Content(
            content_hash=content.content_hash(request_json, document, versions),
            catalog_version=versions.catalog,
            profile_version=versions.profile,
        ),
    )


def create_quote(
    session: Session,
    request: EstimateRequest,
    *,
    title: str,
    created_by: str,
    comment: str | None = None,
    submit: bool = True,
    idempotency: repository.IdempotencyClaim | None = None,
    recommendation: dict[str, Any] | None = None,
) -> Quote:
    request_json, document, priced = _priced(request, recommendation)
    return repository.add_quote(
        session,
        title=title,
        request=request_json,
        estimate=document,
        created_by=created_by,
        status="pending" if submit else "draft",
        comment=comment,
        content=priced,
        idempotency=idempotency,
    )


def create_from_api(
    session: Session,
    body: QuoteCreate,
    created_by: str,
    idempotency: repository.IdempotencyClaim | None = None,
) -> Quote:
    return create_quote(
        session,
        body.request,
        title=body.title,
        created_by=created_by,
        comment=body.comment,
        submit=body.submit,
        idempotency=idempotency,
    )


def stored_json(quote: Quote) -> tuple[dict[str, Any], dict[str, Any]]:
    return json.loads(quote.request_json), json.loads(quote.estimate_json)


def staleness(quote: Quote) -> str | None:
    """Why the quote's approval would not be bound to what is stored and priced now: no hash,
    a row changed after pricing, or a catalog / profile changed since. None when it holds."""
    if quote.content_hash is None or quote.catalog_version is None or quote.profile_version is None:
        return "the quote has no content hash (stored before hashing): re-price it"
    request, estimate = stored_json(quote)
    stored = content.Versions(quote.catalog_version, quote.profile_version)
    if content.content_hash(request, estimate, stored) != quote.content_hash:
        return "the stored request or estimate changed after pricing: re-price it"
    if content.catalog_version() != quote.catalog_version:
        return "the GPU catalog changed since this quote was priced: re-price it"
    try:
        profile_now = content.profile_version(str(request.get("profile", "default")))
    except Exception:  # the profile is gone: cannot be re-priced as it was
        return "the assumption profile of this quote no longer exists"
    if profile_now != quote.profile_version:
        return "the assumption profile changed since this quote was priced: re-price it"
    return None


class DecisionRefused(Exception):
    """An approval (or submission) that is not allowed; recorded in the audit trail."""

    def __init__(self, status_code: int, reason: str) -> None:
        super().__init__(reason)
        self.status_code = status_code
        self.reason = reason


def check_approval(quote: Quote, presented_hash: str | None) -> None:
    """Raise DecisionRefused unless `presented_hash` is the quote's content hash and that hash
    still describes what is stored and priced now."""
    if presented_hash is None:
        raise DecisionRefused(
            428, "approve needs the quote's content_hash (body field or If-Match header)"
        )
    reason = staleness(quote)
    if reason is not None:
        raise DecisionRefused(409, reason)
    if presented_hash != quote.content_hash:
        raise DecisionRefused(
            409,
            f"the quote changed since you saw it: it is now version {quote.version} "
            f"with content_hash {quote.content_hash}; reload it",
        )


def decide(
    session: Session,
    quote: Quote,
    *,
    to_status: str,
    actor: str,
    comment: str | None,
    presented_hash: str | None = None,
) -> Quote:
    """Approve, reject or submit; every refusal is audited, then raised as DecisionRefused."""
    try:
        if to_status == "approved":
            check_approval(quote, presented_hash)
        changed = repository.change_quote_status(
            session,
            quote.id,
            to_status=to_status,
            actor=actor,
            comment=comment,
            expected_hash=quote.content_hash if to_status == "approved" else None,
        )
    except repository.TransitionError as exc:
        refused = DecisionRefused(409, str(exc))
    except repository.ContentChanged as exc:
        refused = DecisionRefused(409, str(exc))
    except DecisionRefused as exc:
        refused = exc
    else:
        assert changed is not None  # the row was read above; quotes are never deleted
        return changed
    session.expire_all()
    fresh = repository.get_quote(session, quote.id) or quote
    repository.record_denied(session, fresh, wanted=to_status, actor=actor, reason=refused.reason)
    raise refused


def reprice(session: Session, quote: Quote, actor: str) -> Quote:
    """Price the stored request again with today's catalog and profile: a new version."""
    request = EstimateRequest.model_validate(json.loads(quote.request_json))
    saved = json.loads(quote.estimate_json).get("recommendation")  # as saved, not re-made
    _, document, priced = _priced(request, saved)
    return repository.reprice_quote(session, quote, estimate=document, content=priced, actor=actor)


def to_summary(quote: Quote) -> QuoteSummary:
    return QuoteSummary(
        id=quote.id,
        title=quote.title,
        status=quote.status,
        created_by=quote.created_by,
        created_at=quote.created_at,
        approver=quote.approver,
        decided_at=quote.decided_at,
        url=quote_url(quote.id),
    )


def _trail(session: Session, quote_id: str) -> list[AuditOut]:
    return [
        AuditOut(
            from_status=e.from_status,
            to_status=e.to_status,
            actor=e.actor,
            comment=e.comment,
            at=e.at,
            outcome=e.outcome or "ok",
        )
        for e in repository.audit_trail(session, quote_id)
    ]


def to_document(session: Session, quote: Quote) -> QuoteOut:
    request, estimate = stored_json(quote)
    return QuoteOut(
        **to_summary(quote).model_dump(),
        comment=quote.comment,
        request=request,
        estimate=estimate,
        audit=_trail(session, quote.id),
        content_hash=quote.content_hash,
        version=quote.version,
        catalog_version=quote.catalog_version,
        profile_version=quote.profile_version,
        stale=staleness(quote) if quote.status in repository.REPRICEABLE else None,
    )
