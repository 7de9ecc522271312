from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.services import estimates

router = APIRouter(prefix="/v1", tags=["catalog"])


@router.get("/gpus", summary="GPU catalog (capacity in bytes, dense bf16 TFLOPS, price)")
def gpus() -> list[dict[str, Any]]:
    return estimates.list_gpus()


@router.get("/models", summary="Model presets usable as `model.preset`")
def models() -> list[dict[str, Any]]:
    return estimates.list_presets()


@router.get("/profiles", summary="Assumption profiles usable as `profile`")
def profiles() -> list[str]:
    return estimates.list_profiles()
