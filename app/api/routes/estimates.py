from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from app.api.strict import StrictJsonRoute
from app.schemas import CheckOut, ValidationErrorOut
from app.services import estimates
from estimator.errors import EstimatorInputError
from estimator.request import CheckRequest, EstimateRequest

router = APIRouter(prefix="/v1", tags=["estimates"], route_class=StrictJsonRoute)

_422 = {422: {"model": ValidationErrorOut, "description": "bad input; `loc` names the field"}}


@router.post(
    "/estimate",
    summary="Memory, FLOPs, time and cost per sequence length, and the verdict per GPU",
    responses=_422,
    response_model=dict[str, Any],
)
def estimate(body: EstimateRequest) -> Response:
    return DocumentResponse(estimates.estimate(body))


class DocumentResponse(JSONResponse):
    """A document of plain JSON types (dict, list, str, int, float, bool, None), built fresh
    for the response: the bytes JSONResponse writes, without jsonable_encoder's walk over it
    (~4x the estimate's own time at 100 cells, issue 17) nor json's check for cycles."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content,
            ensure_ascii=False,
            allow_nan=False,
            indent=None,
            separators=(",", ":"),
            check_circular=False,
        ).encode("utf-8")


@router.post(
    "/check",
    response_model=CheckOut,
    summary="Does it fit one GPU option? The worst sequence length decides (for CI)",
    responses=_422,
)
def check(body: CheckRequest) -> dict[str, Any]:
    try:
        return estimates.check(body)
    except EstimatorInputError as exc:
        # the check runs as an estimate over `gpus: [gpu]`; name the field the client sent
        if exc.field == "gpus" or exc.field.startswith("gpus[0]"):
            raise EstimatorInputError("gpu", exc.message) from None
        raise
