"""Calls into the estimator library. The library computes; the service only renders.

Imports of `estimator.api` and `gpu_catalog` happen at call time so that the service starts (and
storage, memtest upload and health work) while a part of the library is still being written.
"""

from __future__ import annotations

from typing import Any

from estimator.request import CheckRequest, EstimateRequest


def estimate(req: EstimateRequest) -> dict[str, Any]:
    from estimator.api import estimate_document

    return estimate_document(req)


def check(req: CheckRequest) -> dict[str, Any]:
    from estimator.api import check_document

    return check_document(req)


def compare_memtest(doc: dict[str, Any], profile: str = "default") -> dict[str, Any]:
    from estimator.api import compare_memtest as compare

    return compare(doc, profile=profile)


def list_presets() -> list[dict[str, Any]]:
    from estimator.api import list_presets as presets

    return presets()


def list_profiles() -> list[str]:
    from estimator.api import list_profiles as profiles

    return profiles()


def list_gpus() -> list[dict[str, Any]]:
    import gpu_catalog

    out: list[dict[str, Any]] = []
    for gpu in gpu_catalog.list_gpus():
        out.append(gpu.model_dump(mode="json") if hasattr(gpu, "model_dump") else dict(gpu))
    return out
