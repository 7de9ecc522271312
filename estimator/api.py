"""The functions front ends call (CLI, REST service): one place that turns requests into
documents."""

from __future__ import annotations

from typing import Any

from estimator.errors import EstimatorInputError
from estimator.estimate import estimate
from estimator.presets import PRESET_SOURCES, preset_config, preset_ids
from estimator.profile import list_profiles as _list_profiles
from estimator.request import CheckRequest, EstimateRequest, RecommendRequest, SolverRequest


def estimate_document(
    req: EstimateRequest, variants: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return estimate(req, variants)


def check_document(req: CheckRequest) -> dict[str, Any]:
    """Does the setup fit the one GPU at every requested length? Reports the worst row."""
    doc = estimate(req.as_estimate_request())
    option = next(iter(doc["gpus"]))
    worst = max(doc["rows"], key=lambda r: r["fit"][option]["peak_bytes"] or 0)
    fit = worst["fit"][option]
    return {
        "fits": fit["verdict"] == "fits",
        "verdict": fit["verdict"],
        "gpu": option,
        "seq_len": worst["seq_len"],
        "peak_bytes": fit["peak_bytes"],
        "usable_bytes": fit["usable_bytes"],
        "capacity_bytes": fit["capacity_bytes"],
        "margin_bytes": fit["margin_bytes"],
        "usable_fraction": req.usable_fraction,
        "peak_is_lower_bound": fit["peak_is_lower_bound"],
        "profile": doc["profile"],
        "rows": [
            {
                "seq_len": r["seq_len"],
                **{k: r["fit"][option][k] for k in ("verdict", "peak_bytes", "margin_bytes")},
            }
            for r in doc["rows"]
        ],
    }


def list_presets() -> list[dict[str, Any]]:
    from estimator.architectures import spec_from_config

    out = []
    for pid in preset_ids():
        spec = spec_from_config(preset_config(pid), name=pid)
        out.append(
            {
                "id": pid,
                "name": pid,
                "model_type": spec.model_type,
                "params_total": spec.params_total,
                "source": PRESET_SOURCES[pid],
            }
        )
    return out


def list_profiles() -> list[str]:
    return _list_profiles()


def compare_memtest(doc: dict[str, Any], profile: str = "default") -> dict[str, Any]:
    from estimator.compare import compare

    return compare(doc, profile)


def _solver_inputs(req: SolverRequest) -> tuple[Any, Any, Any, Any, int]:
    from estimator.estimate import devices_for, parse_gpu_options
    from estimator.models import resolve_model
    from estimator.profile import load_profile
    from estimator.solvers import Budget

    spec = resolve_model(req.model)
    option = parse_gpu_options([req.gpu])[0]
    budget = Budget(option.gpu.capacity_bytes, req.usable_fraction)
    return spec, req.setup, budget, load_profile(req.profile), devices_for(option, req.setup)


def _needs_seq(req: SolverRequest) -> int:
    if req.seq_len is None:
        raise EstimatorInputError("seq_len", "required for this question")
    return req.seq_len


def max_seq_document(req: SolverRequest) -> dict[str, Any]:
    from estimator.solvers import max_seq

    spec, setup, budget, profile, devices = _solver_inputs(req)
    return {"gpu": req.gpu, **max_seq(spec, setup, budget, profile, req.granularity, devices)}


def max_batch_document(req: SolverRequest) -> dict[str, Any]:
    from estimator.solvers import max_batch

    spec, setup, budget, profile, devices = _solver_inputs(req)
    return {"gpu": req.gpu, **max_batch(spec, setup, _needs_seq(req), budget, profile, devices)}


def min_gpus_document(req: SolverRequest) -> dict[str, Any]:
    from estimator.solvers import min_gpus

    spec, setup, budget, profile, _ = _solver_inputs(req)
    return {"gpu": req.gpu, **min_gpus(spec, setup, _needs_seq(req), budget, profile)}


def recommend_document(req: RecommendRequest) -> dict[str, Any]:
    from estimator.estimate import parse_gpu_options
    from estimator.models import resolve_model
    from estimator.pricing import normalise_prices
    from estimator.profile import load_profile
    from estimator.recommend import recommend

    return recommend(
        resolve_model(req.model),
        req.setup,
        parse_gpu_options(req.gpus),
        load_profile(req.profile),
        req.usable_fraction,
        required_seq=req.seq_len,
        lengths=req.dataset_lengths,
        tokens=req.tokens,
        epochs=req.epochs,
        prices=normalise_prices(req.prices) if req.prices else {},
        overflow=req.overflow,
    )
