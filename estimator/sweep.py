"""Vectorised sweeps: one memory evaluation per (model, setup) over a grid of sequence lengths
x micro-batches x GPUs, with numpy broadcasting instead of a Python loop per cell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from estimator.fit import verdict_codes
from estimator.memory import memory_breakdown
from estimator.profile import Profile
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec


@dataclass(frozen=True)
class SweepResult:
    """`peak[s, b]` bytes per device; `verdict[s, b, g]` 0 fits / 1 tight / 2 no."""

    seq_lens: np.ndarray
    batches: np.ndarray
    capacities: np.ndarray
    peak: np.ndarray
    verdict: np.ndarray

    @property
    def cells(self) -> int:
        return int(self.verdict.size)


def sweep(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq_lens: Any,
    batches: Any,
    capacities: Any,
    profile: Profile,
    usable_fraction: float = 0.92,
) -> SweepResult:
    seqs = np.asarray(seq_lens, dtype=np.float64)
    bs = np.asarray(batches, dtype=np.float64)
    caps = np.asarray(capacities, dtype=np.float64)
    mem = memory_breakdown(spec, setup, seqs[:, None], bs[None, :], profile)
    peak = np.broadcast_to(mem.peak, (seqs.size, bs.size))
    verdict = verdict_codes(peak[:, :, None], caps[None, None, :], usable_fraction)
    return SweepResult(seqs, bs, caps, peak, verdict)
