"""The planner's questions over REST: same request fields as the CLI options, same answers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.strict import StrictJsonRoute
from app.schemas import ValidationErrorOut
from estimator import document as api
from estimator.request import RecommendRequest, SolverRequest

router = APIRouter(prefix="/v1", tags=["solvers"], route_class=StrictJsonRoute)

_422: dict[int | str, dict[str, Any]] = {
    422: {"model": ValidationErrorOut, "description": "bad input; `loc` names the field"}
}


@router.post("/max-seq", summary="Longest sequence that fits the GPU option", responses=_422)
def max_seq(body: SolverRequest) -> dict[str, Any]:
    return api.max_seq_document(body)


@router.post("/max-batch", summary="Largest micro-batch at `seq_len`", responses=_422)
def max_batch(body: SolverRequest) -> dict[str, Any]:
    return api.max_batch_document(body)


@router.post("/min-gpus", summary="Fewest cards of the kind that fit", responses=_422)
def min_gpus(body: SolverRequest) -> dict[str, Any]:
    return api.min_gpus_document(body)


@router.post("/recommend", summary="Best fitting setting per GPU, cheapest first", responses=_422)
def recommend(body: RecommendRequest) -> dict[str, Any]:
    return api.recommend_document(body)
