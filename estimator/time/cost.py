"""Cost of a run per GPU option, and the ranking of the options that fit.

cost = GPU hours x price per GPU-hour. Prices come from the GPU catalog (on-demand list
prices with their source) unless the request overrides them (`{"h200": 5.0}`, CLI
`--price h200=5.0`). A GPU with neither has no cost: the reason says so, nothing is invented.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from estimator.errors import EstimatorInputError

NO_PRICE = "no price; pass --price {id}=USD"


@dataclass(frozen=True)
class Price:
    usd_per_gpu_hour: float | None
    source: str


def gpu_price(gpu: Any, prices: Mapping[str, float]) -> Price:
    """Override (keyed by catalog id, alias or option string resolved to the id) first, then
    the catalog's `price_usd_per_hour` with its `price_source`."""
    if gpu.id in prices:
        return Price(float(prices[gpu.id]), f"override ({gpu.id}={prices[gpu.id]:g} USD/h)")
    if gpu.price_usd_per_hour is not None:
        source = getattr(gpu, "price_source", None) or gpu.sources.get("price_usd_per_hour", "")
        return Price(float(gpu.price_usd_per_hour), f"catalog: {source}")
    return Price(None, "none")


NO_HOURS = "no GPU hours: give the run's tokens (--tokens, --target-tokens, --dataset)"


def run_cost(gpu_hours: float | None, price: Price, gpu_id: str) -> dict[str, Any]:
    """USD = GPU hours x USD per GPU-hour; None with a reason when either is missing."""
    return run_costs([gpu_hours], price, gpu_id)[0]


def run_costs(gpu_hours: list[float | None], price: Price, gpu_id: str) -> list[dict[str, Any]]:
    """`run_cost` of each of `gpu_hours` on one option's price (the estimate's cells)."""
    usd_per, source = price.usd_per_gpu_hour, price.source
    if usd_per is None:
        reason = _no_price(gpu_id)
        return [
            {"usd": None, "usd_per_gpu_hour": None, "price_source": source, "reason": reason}
            for _ in gpu_hours
        ]
    return [
        {"usd": None, "usd_per_gpu_hour": usd_per, "price_source": source, "reason": NO_HOURS}
        if hours is None
        else {"usd": hours * usd_per, "usd_per_gpu_hour": usd_per, "price_source": source}
        for hours in gpu_hours
    ]


@lru_cache(maxsize=256)
def _no_price(gpu_id: str) -> str:
    return NO_PRICE.format(id=gpu_id)


def rank_options(options: Mapping[str, Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Options that fit, ranked by cost (cheapest first; those without a cost last) and by
    wall time (fastest first); options that do not fit are listed apart with their verdict.
    Each option maps to {"fits": bool, "cost_usd": float|None, "wall_hours": float|None}."""
    fitting = [k for k, v in options.items() if v.get("fits")]
    if len(fitting) < 2:  # nothing to order (one GPU option, the usual estimate)
        by_cost, by_time = fitting, list(fitting)
    else:
        inf = float("inf")
        by_cost = sorted(fitting, key=lambda k: (_or(options[k].get("cost_usd"), inf), k))
        by_time = sorted(fitting, key=lambda k: (_or(options[k].get("wall_hours"), inf), k))
    not_fitting = [
        {"gpu": k, "verdict": options[k].get("verdict", "no")}
        for k, v in options.items()
        if not v.get("fits")
    ]
    return {"by_cost": by_cost, "by_time": by_time, "not_fitting": not_fitting}


def _or(value: float | None, default: float) -> float:
    return default if value is None else float(value)


def cheapest(ranked: Sequence[str]) -> str | None:
    return ranked[0] if ranked else None


def normalise_prices(prices: Mapping[str, float]) -> dict[str, float]:
    """Price overrides keyed by catalog id (aliases resolved; `2xh200` means the h200's price
    per GPU-hour). Negative or absurd prices -> EstimatorInputError naming the key."""
    from gpu_catalog import get_gpu

    out: dict[str, float] = {}
    for key, value in prices.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e4:
            raise EstimatorInputError(f"prices.{key}", f"{value!r} USD/h is outside 0..10000")
        try:
            gpu_id = get_gpu(key).id
        except ValueError:
            try:
                from estimator.gpu_options import resolve_gpu_option

                gpu_id = resolve_gpu_option(key)[0].id
            except EstimatorInputError:
                raise EstimatorInputError(f"prices.{key}", f"unknown GPU {key!r}") from None
        out[gpu_id] = float(value)
    return out


def parse_price_option(values: Sequence[str]) -> dict[str, float]:
    """`--price h200=5.0` (repeatable, or comma-separated `a100=2.5,h200=5`) -> {id: USD/h}."""
    out: dict[str, float] = {}
    for value in values:
        for item in value.split(","):
            if not item.strip():
                continue
            key, sep, number = item.partition("=")
            try:
                price = float(number)
            except ValueError:
                price = float("nan")
            if not sep or not key.strip() or price != price:
                raise EstimatorInputError("price", f"{item!r}: expected ID=USD, e.g. h200=5.0")
            out[key.strip().lower()] = price
    return normalise_prices(out)
