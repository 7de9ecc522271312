from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app import document_json
from app.api.strict import StrictJsonRoute, body_adapter, check_json_body, is_json
from app.schemas import CheckOut, ValidationErrorOut
from app.services import estimates
from estimator.errors import EstimatorInputError
from estimator.request import CheckRequest, EstimateRequest

router = APIRouter(prefix="/v1", tags=["estimates"], route_class=StrictJsonRoute)

_422: dict[int | str, dict[str, Any]] = {
    422: {"model": ValidationErrorOut, "description": "bad input; `loc` names the field"}
}

# The estimate is a pure function of the request body (the catalog, presets and profiles are
# packaged data, the work bounds fixed per app): each app keeps the answers to the last bodies
# it was sent, by their exact bytes, and answers a repeated body with the same bytes without
# parsing it again. Bounded in entries and in the size of a kept answer.
CACHE_ENTRIES = 128
CACHE_MAX_ANSWER_BYTES = 1 << 20


class DocumentCache:
    """The last `CACHE_ENTRIES` answers (200 only) by request body, oldest dropped first."""

    def __init__(self) -> None:
        self._answers: OrderedDict[bytes, bytes] = OrderedDict()

    def get(self, body: bytes) -> bytes | None:
        return self._answers.get(body)

    def put(self, body: bytes, answer: bytes) -> None:
        if len(answer) > CACHE_MAX_ANSWER_BYTES or len(body) > CACHE_MAX_ANSWER_BYTES:
            return
        self._answers[body] = answer
        while len(self._answers) > CACHE_ENTRIES:
            try:
                self._answers.popitem(last=False)
            except KeyError:  # another thread emptied it
                break


def _cache_of(app: Any) -> DocumentCache:
    cache = getattr(app.state, "estimate_cache", None)
    if cache is None:
        cache = app.state.estimate_cache = DocumentCache()
    return cache


class CachedDocumentRoute(StrictJsonRoute):
    """`StrictJsonRoute` for `POST /v1/estimate` whose 200 answers are kept per body
    (`DocumentCache`): a body sent again is answered from the cache. A new body that passes
    the strict checks goes to `estimate` as the strict schema validated it (FastAPI's own
    parse and lax validation of the same bytes were ~0.08 ms of a 100-cell request, issue 17);
    anything else (not JSON, or another content type) goes FastAPI's whole way."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        inner = super().get_route_handler()
        adapter = body_adapter(self)

        async def cached_handler(request: Request) -> Response:
            if request.method != "POST" or not is_json(request):
                return await inner(request)
            body = await request.body()  # cached: the inner handler reads the same bytes
            cache = _cache_of(request.app)
            answer = cache.get(body)
            if answer is not None:
                return Response(answer, media_type="application/json")
            checked = check_json_body(body, adapter) if body.strip() else None
            if isinstance(checked, EstimateRequest):
                response = await estimate(checked)
            else:
                response = await inner(request)
            if response.status_code == 200 and isinstance(response, DocumentResponse):
                cache.put(body, bytes(response.body))
            return response

        return cached_handler


# one cell renders in ~0.05 ms: small requests run on the event loop (no hop to a worker
# thread); larger ones, dataset scans and Hub ids (may read the network) in a thread
INLINE_CELLS = 100


async def estimate(body: EstimateRequest) -> Response:
    small = len(body.seq_lens) * len(body.gpus) <= INLINE_CELLS
    if small and not body.dataset_lengths and body.model.hub is None:
        return DocumentResponse(estimates.estimate(body))
    return await run_in_threadpool(lambda: DocumentResponse(estimates.estimate(body)))


class DocumentResponse(JSONResponse):
    """A document of plain JSON types (dict, list, str, int, float, bool, None), built fresh
    for the response: the bytes JSONResponse writes (`app/document_json.py` writes them ~2x
    faster than json.dumps, the same bytes), without jsonable_encoder's walk over it (~4x the
    estimate's own time at 100 cells, issue 17) nor json's check for cycles."""

    def render(self, content: Any) -> bytes:
        return document_json.encode(content)


router.add_api_route(
    "/estimate",
    estimate,
    methods=["POST"],
    summary="Memory, FLOPs, time and cost per sequence length, and the verdict per GPU",
    responses=_422,
    response_model=dict[str, Any],
    route_class_override=CachedDocumentRoute,
)


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
