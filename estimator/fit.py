"""The verdict rule of design.md: `fits` when peak <= usable (capacity x usable fraction),
`tight` when usable < peak <= capacity, `no` above capacity. Vectorised over numpy arrays."""

from __future__ import annotations

from typing import Any

from estimator import lazy_numpy as np

VERDICTS = ("fits", "tight", "no")


def verdict_codes(peak: Any, capacity: Any, usable_fraction: float) -> Any:
    """0 fits, 1 tight, 2 no (numpy arrays broadcast)."""
    peak = np.asarray(peak, dtype=np.float64)
    usable = np.asarray(capacity, dtype=np.float64) * usable_fraction
    return np.where(peak <= usable, 0, np.where(peak <= capacity, 1, 2))


def verdict_code_list(peaks: list[float], capacity: int, usable_fraction: float) -> list[int]:
    """`verdict_codes` of float peaks on one capacity, without numpy (the same comparisons:
    usable is the float64 product capacity x fraction, computed once; capacities are exact in
    a float64)."""
    usable = float(capacity) * usable_fraction
    return [0 if peak <= usable else 1 if peak <= capacity else 2 for peak in peaks]


def verdict(peak: float, capacity: float, usable_fraction: float) -> str:
    return VERDICTS[int(verdict_codes(peak, capacity, usable_fraction))]
