"""Response and request models of the REST API that are the service's own (the estimate and
check requests are the estimator's `EstimateRequest` / `CheckRequest`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from estimator.request import EstimateRequest

QuoteStatus = Literal["draft", "pending", "approved", "rejected"]

# Text without NUL: PostgreSQL text columns cannot hold U+0000 (it was a 500 there, and stored on
# SQLite), so it is a 422 naming the field on every backend.
NO_NUL = r"^[^\x00]*$"

# list pagination: beyond this an OFFSET no longer fits a 64-bit SQL integer (was a 500)
MAX_OFFSET = 10**9

SEED_REQUEST_EXAMPLE: dict[str, Any] = {
    "model": {"preset": "qwen3.5-27b"},
    "setup": {
        "method": "lora",
        "lora_rank": 16,
        "lora_targets": [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
            "in_proj_qkv",
            "in_proj_z",
            "out_proj",
        ],
        "optimizer": "adamw-8bit",
        "checkpointing": "offload",
        "loss": "chunked",
        "batch": 1,
    },
    "seq_lens": [16000, 32000, 48000],
    "gpus": ["a100-80gb", "rtx-pro-6000", "h200", "2xh200"],
    "usable_fraction": 0.92,
    "profile": "seed-000",
}


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


class Ready(BaseModel):
    status: Literal["ok"] = "ok"
    database: Literal["ok"] = "ok"
    version: str


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str = "value_error"


class ValidationErrorOut(BaseModel):
    """422: the same shape FastAPI uses for request validation, so clients parse one format."""

    detail: list[ErrorItem]


class MessageOut(BaseModel):
    detail: str


class CheckOut(BaseModel):
    """The worst row of the estimate for one GPU option."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "fits": True,
                    "verdict": "fits",
                    "peak_bytes": 69_793_218_560,
                    "usable_bytes": 78_261_879_603,
                    "capacity_bytes": 85_066_173_440,
                    "margin_bytes": 8_468_661_043,
                    "gpu": "a100-80gb",
                    "seq_len": 48000,
                }
            ]
        },
    )

    fits: bool
    verdict: Literal["fits", "tight", "no"]
    peak_bytes: int
    usable_bytes: int
    capacity_bytes: int | None = None
    margin_bytes: int
    gpu: str | None = None
    seq_len: int | None = None


class MemtestCreated(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"id": "3f9a0c1d2e4b5a67", "sha256": "3f9a0c1d2e4b5a67...", "duplicate": False}
            ]
        }
    )

    id: str
    sha256: str
    duplicate: bool = Field(description="true when this exact file was uploaded before")
    url: str


class MemtestSummary(BaseModel):
    id: str
    sha256: str
    schema_id: str
    model_name: str
    gpu_name: str
    device: str
    gpu_count: int | None
    total_memory_bytes: int | None
    created_at: datetime | None
    uploaded_by: str
    uploaded_at: datetime
    size_bytes: int


class MemtestList(BaseModel):
    total: int
    items: list[MemtestSummary]


class MemtestDetail(MemtestSummary):
    document: dict[str, Any]


class QuoteCreate(BaseModel):
    """`POST /v1/quotes` (requester or approver token): the estimate request to quote. The
    estimate is computed now and stored with the quote, so the approver sees exactly the numbers
    it was asked about. The creator is the token's name: a `created_by` field is refused (422)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "title": "Qwen3.5-27B LoRA 48k, offload + chunked loss",
                    "request": SEED_REQUEST_EXAMPLE,
                    "submit": True,
                }
            ]
        },
    )

    request: EstimateRequest
    title: str = Field("", max_length=200, pattern=NO_NUL)
    comment: str | None = Field(None, max_length=10_000, pattern=NO_NUL)
    submit: bool = Field(True, description="true: pending approval; false: a draft")


class DecisionIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"comment": "go, H200 for 3 hours"}]}
    )

    comment: str | None = Field(None, max_length=10_000, pattern=NO_NUL)
    content_hash: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="approve: the quote's `content_hash` as you saw it (or send it as "
        "`If-Match`); 409 when the quote changed since, 428 without it",
    )


class AuditOut(BaseModel):
    from_status: QuoteStatus | None
    to_status: QuoteStatus
    actor: str
    comment: str | None
    at: datetime
    outcome: Literal["ok", "denied", "repriced"] = Field(
        "ok", description="denied: a refused attempt (reason in comment), nothing changed"
    )


class QuoteOut(BaseModel):
    id: str
    title: str
    status: QuoteStatus
    created_by: str
    created_at: datetime
    approver: str | None
    decided_at: datetime | None
    comment: str | None
    url: str
    request: dict[str, Any]
    estimate: dict[str, Any]
    audit: list[AuditOut]
    content_hash: str | None = Field(
        description="sha256 over request + estimate + catalog and profile versions: approve "
        "needs it (also the ETag); null for a quote stored before hashing: re-price it"
    )
    version: int = Field(description="1 when created, +1 per re-pricing")
    catalog_version: str | None
    profile_version: str | None
    stale: str | None = Field(
        description="why the stored numbers may no longer hold (re-price the quote), or null"
    )


class QuoteSummary(BaseModel):
    id: str
    title: str
    status: QuoteStatus
    created_by: str
    created_at: datetime
    approver: str | None
    decided_at: datetime | None
    url: str
