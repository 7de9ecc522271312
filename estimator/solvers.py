"""Answers to the planner's questions, solved exactly on the same memory model as `estimate`:
the longest sequence, the largest micro-batch, the fewest GPUs that fit, the best setting.

Memory never decreases with sequence length or batch and never increases with more shards
(property-tested in tests/estimator/test_properties.py), so the fitting set is a prefix
(or suffix) and bisection over integers is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from typing import TYPE_CHECKING, Any

from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.memory.model import memory_on_card
from estimator.objective import losses_for, smallest_batch
from estimator.profile import Profile
from estimator.scenario import Scenario
from estimator.spec import ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

MAX_SEQ_SEARCH = 16 * 2**20  # 16 Mi tokens: beyond any context a card could hold
MAX_BATCH_SEARCH = 1 << 20
MAX_GPUS_SEARCH = 100_000


@dataclass(frozen=True)
class Budget:
    """A card and the fraction of it that counts: the target of every solver."""

    capacity_bytes: int
    usable_fraction: float = 0.92

    @property
    def usable_bytes(self) -> float:
        return self.capacity_bytes * self.usable_fraction


def peak_bytes(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq: int,
    batch: int,
    profile: Profile,
    devices: int | None = None,
    card_bytes: float | None = None,
) -> float:
    """The peak per device on `devices` cards of `card_bytes` each (`memory_breakdown`: the
    card's size matters to Unsloth's loss alone; None: without a card)."""
    if card_bytes is None:
        return float(memory_breakdown(spec, setup, [seq], batch, profile, devices=devices).peak[0])
    return float(memory_on_card(spec, setup, [seq], batch, profile, devices, card_bytes).peak[0])


def largest_fitting(fits: Callable[[int], bool], upper: int) -> int | None:
    """Largest k in 1..upper with fits(k), given fits is True on a prefix. None if fits(1) fails.
    Exponential search for the first failure, then bisection."""
    if not fits(1):
        return None
    good, step = 1, 1
    while True:
        probe = min(good + step, upper)
        if probe == good:
            return good
        if not fits(probe):
            bad = probe
            break
        good, step = probe, step * 2
    return _boundary(fits, good, bad)[0]


def smallest_fitting(fits: Callable[[int], bool], upper: int) -> int | None:
    """Smallest k in 1..upper with fits(k), given fits is True on a suffix."""
    if not fits(upper):
        return None
    return _boundary(lambda k: not fits(k), 0, upper)[1]  # 0 treated as failing


def _boundary(holds: Callable[[int], bool], yes: int, no: int) -> tuple[int, int]:
    """Bisection between `yes` (holds) and `no` (does not): the adjacent pair (yes, no)."""
    while abs(no - yes) > 1:
        mid = (yes + no) // 2
        if holds(mid):
            yes = mid
        else:
            no = mid
    return yes, no


def max_seq(
    spec: ModelSpec,
    setup: TrainingSetup,
    budget: Budget,
    profile: Profile,
    granularity: int = 256,
    devices: int | None = None,
    upper: int = MAX_SEQ_SEARCH,
) -> dict[str, Any]:
    """Longest sequence (a multiple of `granularity`) whose peak fits the usable budget."""
    card = budget.capacity_bytes

    def fits(k: int) -> bool:
        return (
            peak_bytes(spec, setup, k * granularity, setup.batch, profile, devices, card)
            <= budget.usable_bytes
        )

    k = largest_fitting(fits, max(upper // granularity, 1))
    sc = Scenario(spec, setup, profile, count=devices)
    return _answer(
        "seq_len", None if k is None else k * granularity, granularity, sc, budget, upper
    )


def max_batch(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq: int,
    budget: Budget,
    profile: Profile,
    devices: int | None = None,
    upper: int = MAX_BATCH_SEARCH,
) -> dict[str, Any]:
    """Largest micro-batch at `seq` that fits; none below the objective's smallest
    (`smallest_batch`: KTO's 2)."""
    card = budget.capacity_bytes
    lowest = smallest_batch(setup.objective)

    def fits(b: int) -> bool:
        return peak_bytes(spec, setup, seq, b, profile, devices, card) <= budget.usable_bytes

    b = largest_fitting(fits, upper)
    if b is not None and b < lowest:
        b = None
    fixed = setup.model_copy(update={"batch": b or lowest})
    sc = Scenario(spec, fixed, profile, seq_len=seq, count=devices)
    out = _answer("batch", b, 1, sc, budget, upper)
    if b is None and lowest > 1:
        out["reason"] = f"even batch = {lowest}, the smallest {setup.objective} takes, does not fit"
    return out


def min_gpus(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq: int,
    budget: Budget,
    profile: Profile,
    upper: int = MAX_GPUS_SEARCH,
) -> dict[str, Any]:
    """Fewest cards of this kind that fit with `setup.sharding` (none -> device_map)."""
    card = budget.capacity_bytes

    def fits(n: int) -> bool:
        try:
            peak = peak_bytes(spec, setup, seq, setup.batch, profile, n, card)
            return peak <= budget.usable_bytes
        except EstimatorInputError:  # a --parallel layout that n cards cannot take
            return False

    n = smallest_fitting(fits, upper)
    out: dict[str, Any] = {
        "gpus": n,
        "seq_len": seq,
        "batch": setup.batch,
        "sharding": setup.parallel
        or (setup.sharding if setup.sharding != "none" else "device_map"),
        "usable_bytes": int(budget.usable_bytes),
    }
    if n is not None:
        out["peak_bytes"] = int(peak_bytes(spec, setup, seq, setup.batch, profile, n, card))
        out["margin_bytes"] = int(budget.usable_bytes) - out["peak_bytes"]
        if n > 1:
            out["peak_bytes_one_fewer"] = int(
                peak_bytes(spec, setup, seq, setup.batch, profile, n - 1, card)
            )
    return out


def _answer(
    what: str, value: int | None, step: int, sc: Scenario, budget: Budget, limit: int | None
) -> dict[str, Any]:
    """A solver's answer `what` = `value` (searched in steps of `step`) with the peak there and
    one step further; `sc` holds the model, setup, profile, card count and (for `batch`) the
    sequence length."""
    spec, setup, profile, devices = sc.spec, sc.setup, sc.profile, sc.count
    card = budget.capacity_bytes
    out: dict[str, Any] = {
        what: value,
        "granularity": step,
        "usable_bytes": int(budget.usable_bytes),
        "capacity_bytes": budget.capacity_bytes,
    }
    if value is None:
        out["reason"] = f"even {what} = {step} does not fit"
        return out
    s = value if what == "seq_len" else sc.seq_len
    b = setup.batch
    nxt_s, nxt_b = (s + step, b) if what == "seq_len" else (s, b + step)
    out["peak_bytes"] = int(peak_bytes(spec, setup, s, b, profile, devices, card))
    out["margin_bytes"] = int(budget.usable_bytes) - out["peak_bytes"]
    out["next_peak_bytes"] = int(peak_bytes(spec, setup, nxt_s, nxt_b, profile, devices, card))
    if limit is not None and value + step > limit:
        out["reason"] = f"search limit {limit} reached"
    return out


SETTING_GRID = {
    "checkpointing": ("none", "gpu", "offload"),
    "loss": ("full", "chunked"),
}


def fitting_settings(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq: int,
    budget: Budget,
    profile: Profile,
    devices: int | None = None,
    grid: dict[str, tuple[str, ...]] | None = None,
) -> list[dict[str, Any]]:
    """Every setting of the grid (checkpointing x loss, by default) with its peak and margin,
    fitting ones first by margin... the caller ranks by cost/time."""
    card = budget.capacity_bytes
    grid = grid or SETTING_GRID
    if "loss" in grid:
        grid = {**grid, "loss": losses_for(setup, grid["loss"])}
    rows: list[dict[str, Any]] = []
    keys = list(grid)
    for values in product(*(grid[k] for k in keys)):
        variant = setup.model_copy(update=dict(zip(keys, values, strict=True)))
        peak = peak_bytes(spec, variant, seq, variant.batch, profile, devices, card)
        rows.append(
            {
                **dict(zip(keys, values, strict=True)),
                "peak_bytes": int(peak),
                "fits": peak <= budget.usable_bytes,
                "margin_bytes": int(budget.usable_bytes - peak),
            }
        )
    rows.sort(key=lambda r: (not r["fits"], -r["margin_bytes"]))
    return rows
