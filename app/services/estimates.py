"""Calls into the estimator library and the GPU catalog. The library computes; the service only
renders. (Tests replace these functions with stand-ins of the documented shapes.)"""

from __future__ import annotations

from typing import Any

import gpu_catalog
from estimator import document as api
from estimator.request import CheckRequest, EstimateRequest, RecommendRequest


def estimate(req: EstimateRequest) -> dict[str, Any]:
    return api.estimate_document(req)


def check(req: CheckRequest) -> dict[str, Any]:
    return api.check_document(req)


def recommend(req: RecommendRequest) -> dict[str, Any]:
    return api.recommend_document(req)


def compare_memtest(doc: dict[str, Any], profile: str = "default") -> dict[str, Any]:
    return api.compare_memtest(doc, profile=profile)


def list_presets() -> list[dict[str, Any]]:
    return api.list_presets()


def list_profiles() -> list[str]:
    return api.list_profiles()


def list_gpus() -> list[dict[str, Any]]:
    return [gpu.model_dump(mode="json") for gpu in gpu_catalog.list_gpus()]
