from __future__ import annotations

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
    # the document is plain JSON types already: serialised once, as JSONResponse would, without
    # jsonable_encoder's walk (~4x the estimate's own time at 100 cells, issue 17)
    return JSONResponse(estimates.estimate(body))


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
