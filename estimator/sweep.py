"""Vectorised sweeps over a grid of sequence lengths x micro-batches x GPUs, with numpy
broadcasting instead of a Python loop per cell.

- `sweep`: memory only. One memory evaluation per (length, micro-batch) and a verdict per GPU
  capacity: `SweepResult.memory_evaluations` and `.verdicts` count them apart.
- `sweep_full`: memory, verdict, FLOPs, step time, tokens/s and USD per million tokens per
  (length, micro-batch, GPU option), the estimate document's figures for a whole grid. The GPU
  options' rates are `estimator.time.step.option_rates` (once per option) and the step is
  `step_cell`'s formula on arrays; FLOPs are `step_flops` once per length at micro-batch 1,
  scaled by the micro-batch (every FLOP term is linear in it). Unknown rates give NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from estimator.fit import verdict_codes
from estimator.gpu_options import devices_for, parse_gpu_options
from estimator.memory import memory_breakdown
from estimator.memory.model import card_loss_target, loss_depends_on_card, memory_on_card
from estimator.profile import Profile
from estimator.scenario import Scenario
from estimator.spec import ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup


@dataclass(frozen=True)
class SweepResult:
    """`peak[s, b]` bytes per device without a card; `peak_on_card[s, b, g]` on each card
    (the same but where the card's size changes the memory: Unsloth's loss,
    `memory.model.on_card`); `verdict[s, b, g]` 0 fits / 1 tight / 2 no, of `peak_on_card`."""

    seq_lens: np.ndarray
    batches: np.ndarray
    capacities: np.ndarray
    peak: np.ndarray
    verdict: np.ndarray
    peak_on_card: np.ndarray
    evaluations: int

    @property
    def cells(self) -> int:
        """Verdicts (a capacity comparison per GPU): not memory evaluations, no time or cost."""
        return int(self.verdict.size)

    @property
    def memory_evaluations(self) -> int:
        return self.evaluations

    @property
    def verdicts(self) -> int:
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
    on_card = np.broadcast_to(peak[:, :, None], (seqs.size, bs.size, caps.size))
    evaluations = 1
    if loss_depends_on_card(setup):  # Unsloth's loss: each card its own peak (rows.py)
        on_card = on_card.copy()
        by_target: dict[float, Any] = {}
        for g, cap in enumerate(caps.tolist()):
            target = card_loss_target(spec, setup, profile, setup.num_gpus, cap)
            if target is None:
                continue
            if target not in by_target:
                by_target[target] = memory_on_card(
                    spec, setup, seqs[:, None], bs[None, :], profile, None, cap
                ).peak
                evaluations += 1
            on_card[:, :, g] = np.broadcast_to(by_target[target], peak.shape)
    verdict = verdict_codes(on_card, caps[None, None, :], usable_fraction)
    return SweepResult(seqs, bs, caps, peak, verdict, on_card, evaluations * peak.size)


@dataclass(frozen=True)
class FullSweepResult:
    """Per (length s, micro-batch b, GPU option g): `peak` bytes per device, `verdict` (0 fits,
    1 tight, 2 no), `step_seconds`, `tokens_per_second` (all ranks), `usd_per_mtok` (USD per
    million trained tokens, NaN without a price or a rate); `flops[s, b]` executed FLOPs of a
    step on one device."""

    seq_lens: np.ndarray
    batches: np.ndarray
    options: tuple[str, ...]
    peak: np.ndarray
    verdict: np.ndarray
    flops: np.ndarray
    step_seconds: np.ndarray
    tokens_per_second: np.ndarray
    usd_per_mtok: np.ndarray
    memory_evaluations: int

    @property
    def cells(self) -> int:
        """Full cells: memory + verdict + FLOPs + step time + tokens/s + cost each."""
        return int(self.step_seconds.size)

    @property
    def verdicts(self) -> int:
        return int(self.verdict.size)


def _flops_grid(spec: ModelSpec, setup: TrainingSetup, seqs: np.ndarray, bs: np.ndarray) -> Any:
    from estimator.time.flops import step_flops_totals

    one = [step_flops_totals(spec, setup, int(s), 1) for s in seqs]
    total = np.array([f.total for f in one])[:, None] * bs[None, :]
    model = np.array([f.model_flops for f in one])[:, None] * bs[None, :]
    return total, model


def _layout_grid(rates: Any, seqs: Any, bs: Any, host: Any) -> tuple[Any, Any]:
    """(step seconds, tokens/s) of a layout's cells, one `time.step.cell` each (NaN where the
    step is unknown)."""
    from estimator.time.flops import FlopsTotals
    from estimator.time.step import cell

    step = np.full((seqs.size, bs.size), np.nan)
    tps = np.full((seqs.size, bs.size), np.nan)
    none = FlopsTotals(0.0, 0.0)
    for i, seq in enumerate(seqs):
        for j, batch in enumerate(bs):
            c = cell(rates, none, int(seq), int(batch), int(host[i, j]))
            if c.step_seconds is not None:
                step[i, j] = c.step_seconds
                tps[i, j] = c.tokens_per_step / c.step_seconds
    return step, tps


def _step_grid(rates: Any, flops: Any, seqs: Any, bs: Any, host: Any) -> Any:
    """`step_cell` on arrays (NaN where it gives None)."""
    from estimator.time.step import comm_bytes

    sc, gpu = rates.sc, rates.gpu
    setup, profile = sc.setup, sc.profile
    nan = np.nan
    peak = rates.peak_flops
    compute = flops / (peak * rates.efficiency) if peak else np.full(flops.shape, nan)
    mem = nan if rates.memory_seconds is None else rates.memory_seconds
    offload: Any = 0.0
    if setup.checkpointing == "offload":
        link = gpu.host_link_bytes_per_s
        hidden = profile.number("time", "offload_overlap_fraction")
        moved = (1.0 - hidden) * (2.0 * host / float(link)) if link else nan
        offload = np.where(host > 0, moved, 0.0)
    comm: Any = 0.0
    seq_grid = seqs[:, None] * np.ones_like(bs)[None, :]
    volume = comm_bytes(sc.spec, setup, profile, rates.sharding, rates.count, seq_grid, bs[None, :])
    if np.any(np.asarray(volume) > 0):
        net = gpu.interconnect_bytes_per_s
        hidden = profile.number("time", "comm_overlap_fraction")
        comm = (1.0 - hidden) * (volume / float(net)) if net else np.full(flops.shape, nan)
    return np.maximum(compute, mem) + offload + comm


def sweep_full(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq_lens: Any,
    batches: Any,
    gpus: list[str],
    profile: Profile,
    usable_fraction: float = 0.92,
) -> FullSweepResult:
    """Memory, verdict, FLOPs, step time, tokens/s and cost over lengths x micro-batches x GPU
    options (`h200`, `8xh100-80gb`, `24gib`). A `parallel` layout (or a `sharding` alias of
    one) takes its memory on the grid and its step time cell by cell (`_layout_grid`)."""
    from estimator.errors import EstimatorInputError
    from estimator.time.cost import gpu_price
    from estimator.time.step import option_rates

    seqs = np.asarray(seq_lens, dtype=np.float64)
    bs = np.asarray(batches, dtype=np.float64)
    if seqs.ndim != 1 or bs.ndim != 1 or np.any(seqs < 1) or np.any(bs < 1):
        raise EstimatorInputError("seq_lens", "lengths and micro-batches: 1-D, at least 1")
    options = parse_gpu_options(gpus)
    flops, model_flops = _flops_grid(spec, setup, seqs, bs)
    shape = (seqs.size, bs.size, len(options))
    peak, verdict = np.empty(shape), np.empty(shape, dtype=np.int64)
    step, tps, usd = np.empty(shape), np.empty(shape), np.empty(shape)
    by_devices: dict[tuple[int, float | None], Any] = {}  # per card count (and card: rows.py)
    by_card = loss_depends_on_card(setup)
    for g, opt in enumerate(options):
        n = devices_for(opt, setup)
        cap = opt.gpu.capacity_bytes
        target = card_loss_target(spec, setup, profile, n, cap) if by_card else None
        if (n, target) not in by_devices:
            grid = (seqs[:, None], bs[None, :])
            by_devices[(n, target)] = (
                memory_breakdown(spec, setup, *grid, profile, n)
                if target is None
                else memory_on_card(spec, setup, *grid, profile, n, cap)
            )
        mem = by_devices[(n, target)]
        peak[:, :, g] = np.broadcast_to(mem.peak, shape[:2])
        verdict[:, :, g] = verdict_codes(peak[:, :, g], opt.gpu.capacity_bytes, usable_fraction)
        rates = option_rates(
            Scenario(spec, setup, profile, gpu=opt.gpu, count=n, option=opt.option)
        )
        host = np.ceil(np.broadcast_to(mem.host, shape[:2]))  # whole bytes, as the rows
        if rates.layout is not None:
            step[:, :, g], tps[:, :, g] = _layout_grid(rates, seqs, bs, host)
        else:
            step[:, :, g] = _step_grid(rates, flops, seqs, bs, host)
            tps[:, :, g] = seqs[:, None] * bs[None, :] * rates.ranks / step[:, :, g]
        price = gpu_price(opt.gpu, {}).usd_per_gpu_hour
        dollars = np.nan if price is None else price * n
        usd[:, :, g] = dollars / 3600.0 / tps[:, :, g] * 1e6
    memory_evaluations = seqs.size * bs.size * len(by_devices)
    names = tuple(o.option for o in options)
    return FullSweepResult(
        seqs, bs, names, peak, verdict, flops, step, tps, usd, memory_evaluations
    )
