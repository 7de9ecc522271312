"""Calls into the estimator library and the GPU catalog. The library computes; the service only
renders. (Tests replace these functions with stand-ins of the documented shapes.)"""

from __future__ import annotations

from typing import Any

import gpu_catalog
from estimator import document as api
from estimator.errors import EstimatorInputError
from estimator.request import CheckRequest, EstimateRequest, RecommendRequest, SolverRequest

# Work bounds of one estimate (issue 16): each cap alone is fine, their product is not. 256
# lengths x 64 GPU options was 49 s of CPU and a 23 MB answer; 256 lengths x 2.7 M dataset
# samples another ~50 s (the packing is per length over every sample).
MAX_CELLS = 1024  # len(seq_lens) x len(gpus)
MAX_LENGTH_SCANS = 20_000_000  # len(seq_lens) x len(dataset_lengths)


def check_work(req: EstimateRequest) -> None:
    """EstimatorInputError (422 naming the field) for a request above the work bounds."""
    cells = len(req.seq_lens) * len(req.gpus)
    if cells > MAX_CELLS:
        raise EstimatorInputError(
            "seq_lens",
            f"{len(req.seq_lens)} lengths x {len(req.gpus)} GPU options = {cells} cells; "
            f"at most {MAX_CELLS} per request (split it)",
        )
    scans = len(req.seq_lens) * len(req.dataset_lengths or ())
    if scans > MAX_LENGTH_SCANS:
        raise EstimatorInputError(
            "dataset_lengths",
            f"{len(req.dataset_lengths or ())} samples x {len(req.seq_lens)} lengths is above "
            f"{MAX_LENGTH_SCANS:,} per request: send fewer lengths or a sample of the dataset",
        )


def estimate(req: EstimateRequest) -> dict[str, Any]:
    check_work(req)
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


def max_seq(req: SolverRequest) -> dict[str, Any]:
    return api.max_seq_document(req)
