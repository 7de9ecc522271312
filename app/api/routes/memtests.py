from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.deps import SessionDep, UploaderDep
from app.db import repository
from app.db.models import Memtest
from app.schemas import (
    MAX_OFFSET,
    MemtestCreated,
    MemtestDetail,
    MemtestList,
    MemtestSummary,
    MessageOut,
)
from app.services import estimates
from app.services.idempotency import IdempotencyKeyHeader, record_key, replay_or_claim
from app.services.memtests import load_stored, parse_upload

router = APIRouter(prefix="/v1/memtests", tags=["memtests"])

_404: dict[int | str, dict[str, Any]] = {
    404: {"model": MessageOut, "description": "no such memtest"}
}

_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "The memtest JSON file written by `trainfit-probe` (schema "
        "`trainfit.memtest/1`), sent as the body or as the multipart field `file`.",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
        },
    }
}


# a multipart upload's part limits: the file, and up to 10 other fields a client may add
# (ignored); starlette's messages for a body past them (starlette/formparsers.py)
_MAX_FILES, _MAX_FIELDS = 1, 10
_PART_LIMITS = ("Too many fields", "Too many files")


def _too_many_parts(message: str) -> list[dict[str, Any]]:
    """422 naming the body: a schema-valid object (the OpenAPI allows other fields) with more
    parts than the upload reads is refused as unprocessable, not as unparseable (400)."""
    return [
        {
            "loc": ["body"],
            "msg": f"{message} The upload reads one file part, `file` (at most "
            f"{_MAX_FILES} file and {_MAX_FIELDS} other fields).",
            "type": "too_many_parts",
        }
    ]


async def upload_bytes(request: Request) -> bytes:
    """The uploaded file's bytes, exactly as sent (the size limit applies while streaming)."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        try:
            form = await request.form(max_files=_MAX_FILES, max_fields=_MAX_FIELDS)
        except StarletteHTTPException as exc:  # starlette answers a part limit with a 400
            if exc.status_code == 400 and str(exc.detail).startswith(_PART_LIMITS):
                raise HTTPException(422, detail=_too_many_parts(str(exc.detail))) from None
            raise
        item = form.get("file")
        if not isinstance(item, UploadFile):
            raise HTTPException(
                422, detail=[{"loc": ["body", "file"], "msg": "missing", "type": "missing"}]
            )
        return await item.read()
    return await request.body()


def _summary(row: Memtest) -> MemtestSummary:
    return MemtestSummary(
        id=row.id,
        sha256=row.content_sha256,
        schema_id=row.schema_id,
        model_name=row.model_name,
        gpu_name=row.gpu_name,
        device=row.device,
        gpu_count=row.gpu_count,
        total_memory_bytes=row.total_memory_bytes,
        created_at=row.created_at,
        uploaded_by=row.uploaded_by,
        uploaded_at=row.uploaded_at,
        size_bytes=row.size_bytes,
    )


def _get(session: SessionDep, memtest_id: str) -> Memtest:
    row = repository.get_memtest(session, memtest_id)
    if row is None:
        raise HTTPException(404, detail=f"no memtest {memtest_id!r}")
    return row


@router.post(
    "",
    status_code=201,
    response_model=MemtestCreated,
    summary="Upload a memtest file (upload token). The same file twice gives the same id",
    openapi_extra=_UPLOAD_BODY,
    responses={
        200: {"model": MemtestCreated, "description": "this exact file was already stored"},
        400: {"description": "a multipart body that cannot be parsed"},
        401: {"model": MessageOut},
        403: {"model": MessageOut},
        413: {"model": MessageOut},
        422: {
            "description": "not a valid trainfit.memtest/1 document, or a multipart body of "
            "more parts than the upload reads; `loc` names the field"
        },
    },
)
def upload(
    response: Response,
    session: SessionDep,
    uploaded_by: UploaderDep,
    raw: Annotated[bytes, Depends(upload_bytes)],
    idempotency_key: IdempotencyKeyHeader = None,
) -> MemtestCreated:
    parsed = parse_upload(raw)
    claim = None
    if idempotency_key is not None:  # same key + same file: the first answer (201) again
        replayed, claim = replay_or_claim(
            session,
            scope="memtest",
            actor=uploaded_by,
            key=idempotency_key,
            body_sha256=parsed.sha256,
        )
        if replayed is not None:
            response.status_code = claim.status_code
            row = _get(session, replayed)
            response.headers["Location"] = f"/v1/memtests/{row.id}"
            created = claim.status_code == 201
            return MemtestCreated(
                id=row.id,
                sha256=row.content_sha256,
                duplicate=not created,
                url=f"/memtests/{row.id}",
            )
    row, created = repository.add_memtest(
        session,
        raw=parsed.text,
        sha256=parsed.sha256,
        fields=parsed.fields,
        uploaded_by=uploaded_by,
    )
    if claim is not None:
        record_key(session, replace(claim, status_code=201 if created else 200), row.id)
    url = f"/memtests/{row.id}"
    response.headers["Location"] = f"/v1/memtests/{row.id}"
    if not created:
        response.status_code = 200
    return MemtestCreated(id=row.id, sha256=row.content_sha256, duplicate=not created, url=url)


@router.get("", response_model=MemtestList, summary="Stored memtests, newest first")
def list_memtests(
    session: SessionDep,
    model: str | None = None,
    gpu: str | None = None,
    device: str | None = None,
    uploaded_by: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> MemtestList:
    rows, total = repository.list_memtests(
        session,
        model=model,
        gpu=gpu,
        device=device,
        uploaded_by=uploaded_by,
        limit=limit,
        offset=offset,
    )
    return MemtestList(total=total, items=[_summary(r) for r in rows])


@router.get(
    "/{memtest_id}",
    response_model=MemtestDetail,
    summary="One memtest with its document",
    responses=_404,
)
def get_memtest(session: SessionDep, memtest_id: str) -> MemtestDetail:
    row = _get(session, memtest_id)
    return MemtestDetail(**_summary(row).model_dump(), document=load_stored(row.raw_json))


@router.get(
    "/{memtest_id}/raw",
    summary="The file exactly as uploaded (its sha256 is the `sha256` field)",
    response_class=Response,
    responses={200: {"content": {"application/json": {}}}, **_404},
)
def get_raw(session: SessionDep, memtest_id: str) -> Response:
    row = _get(session, memtest_id)
    return Response(
        content=row.raw_json.encode("utf-8"),
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="memtest_{row.id}.json"'},
    )


@router.get(
    "/{memtest_id}/comparison",
    summary="Estimate vs measured per sequence length: error in bytes and %",
    responses=_404,
)
def comparison(session: SessionDep, memtest_id: str, profile: str = "default") -> dict[str, Any]:
    row = _get(session, memtest_id)
    try:
        return estimates.compare_memtest(load_stored(row.raw_json), profile=profile)
    except ValidationError as exc:  # the stored file does not make a request (e.g. a long name)
        raise HTTPException(
            422, detail=f"the stored memtest cannot be compared: {exc.errors()[0]['msg']}"
        ) from None
