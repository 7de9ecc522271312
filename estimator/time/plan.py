"""The time-and-cost plan: the one place that composes the time wing's parts (FLOPs and step
time from `step`, prices from `cost`, tokens from `tokens`) for the estimate document. Pure
functions over plain JSON types (seconds and USD as floats).

- `row_time_and_cost` — one (seq_len, GPU option) cell: step time, tokens/s, hours, USD.
- `training_summary` — per option GPU hours, wall hours, USD; ranked by cost and by time.
- `format_time_cost_table` — the table of seed 000's "Time and cost" section.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from estimator.errors import EstimatorInputError
from estimator.scenario import Scenario
from estimator.time.cost import (
    Price,
    gpu_price,
    normalise_prices,
    rank_options,
    run_cost,
    run_costs,
)
from estimator.time.flops import FlopsTotals, StepFlops, step_flops
from estimator.time.step import OptionRates, _rate, cell, comm_bytes, option_rates, step_cell

if TYPE_CHECKING:
    from estimator.profile import Profile


def row_time_and_cost(
    sc: Scenario,
    *,
    tokens: float | None,
    host_bytes: int,
    fits: bool,
    efficiency: float | None = None,
    efficiency_source: str | None = None,
) -> dict[str, Any]:
    """Time and cost of one (seq_len, GPU option) cell of the estimate: the scenario's
    `seq_len` x `batch` on its GPU option, priced with its `prices`.

    `tokens`: the run's tokens (None: no hours, no cost). `host_bytes`: the memory model's host
    bytes for this row (offloaded checkpoints), moved out and back once per step. `fits`: the
    memory verdict, carried so rankings can leave non-fitting options out. A scenario whose
    `gpu` is set skips the catalog lookup (tests, stand-in GPUs). The estimate document makes
    the same cells with `option_rates` once per option and `cell_time_and_cost` per row."""
    if sc.gpu is None:
        sc = sc.on(sc.option)
    gpu = sc.require_gpu()
    if sc.seq_len < 1 or sc.batch < 1:
        raise EstimatorInputError("seq_len", "sequence length and batch must be positive")
    flops = step_flops(sc.spec, sc.setup, sc.seq_len, sc.batch)
    rates = option_rates(sc, efficiency, efficiency_source)
    price = gpu_price(gpu, normalise_prices(sc.prices) if sc.prices else {})
    time, cost = cell_time_and_cost(rates, flops, sc.seq_len, sc.batch, tokens, host_bytes, price)
    return {"time": time, "cost": cost, "fits": fits}


def cell_time_and_cost(
    rates: OptionRates,
    flops: StepFlops | FlopsTotals,
    seq_len: int,
    batch: int,
    tokens: float | None,
    host_bytes: int,
    price: Price,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `time` and `cost` of one row on one option (`step_time`'s figures, as JSON)."""
    if rates.layout is not None:
        c = cell(rates, flops, seq_len, batch, host_bytes)
        step, peak, compute, offload, comm = (
            c.step_seconds,
            c.peak_flops,
            c.compute_seconds,
            c.offload_seconds,
            c.comm_seconds,
        )
        tokens_per_step, memory = c.tokens_per_step, c.memory_seconds
        inter = c.comm_inter_node_seconds
        efficiency, source, flops_total, model_flops = (
            c.efficiency,
            c.efficiency_source,
            c.flops_total,
            c.model_flops,
        )
        cards, sharding, unknown = c.cards, c.sharding, c.unknown
    else:  # `cell`'s figures without its tuple: `step_cell` and the option's rates
        compute, _, offload, _, comm, step, unknown, _ = step_cell(
            rates, flops.total, seq_len, batch, host_bytes, False
        )
        peak, memory, inter = rates.peak_flops, rates.memory_seconds, None
        tokens_per_step = seq_len * batch * rates.ranks
        efficiency, source = rates.efficiency, rates.efficiency_source
        flops_total, model_flops = flops.total, flops.model_flops
        cards, sharding = rates.count, rates.sharding
    tps = tokens_per_step / step if step else None
    wall = gpu_hours = None
    if tokens is not None and tps is not None:
        wall = tokens / tps / 3600.0
        gpu_hours = wall * cards
    time: dict[str, Any] = {
        "step_seconds": step,
        "tokens_per_second": tps,
        "tokens_per_step": tokens_per_step,
        "compute_seconds": compute,
        "memory_seconds": memory,
        "offload_seconds": offload,
        "comm_seconds": comm,
        "comm_inter_node_seconds": inter,
        "mfu": model_flops / (step * peak) if step and peak else None,
        "efficiency": efficiency,
        "efficiency_source": source,
        "flops_per_step": flops_total,
        "model_flops_per_step": model_flops,
        "gpus": rates.count,
        "sharding": sharding,
        "wall_hours": wall,
        "gpu_hours": gpu_hours,
    }
    if unknown:
        time["unknown"] = unknown
    cost = run_cost(gpu_hours, price, rates.gpu.id)
    if step is None and price.usd_per_gpu_hour is not None:
        cost["reason"] = "; ".join(unknown)
    return time, cost


# one row's arguments of a cell: (flops, seq_len, batch, the run's tokens, host bytes)
CellArgs = tuple[StepFlops | FlopsTotals, int, int, float | None, int]
# the cells of one option down a column of rows: sets `time` and `cost` of each row's fit entry
CellFn = Callable[[list[dict[str, Any]], list[CellArgs]], None]


def option_cells(rates: OptionRates, price: Price) -> CellFn:
    """`cell_time_and_cost` of one option over a column of rows: `cells(fits, args)` sets each
    fit entry's `time` and `cost` from its row's `CellArgs`, with what does not depend on the
    row read once (the estimate document calls it once per option and setup, not per cell).
    The arithmetic is `step_cell`'s and `cell_time_and_cost`'s, term for term and in the same
    order (tests/estimator/test_fast_paths.py compares them with `step_time`); a `parallel`
    layout's cells are `cell`'s."""
    if rates.layout is not None:

        def layout_cells(fits: list[dict[str, Any]], args: list[CellArgs]) -> None:
            for fit, (flops, seq_len, batch, tokens, host_bytes) in zip(fits, args, strict=True):
                fit["time"], fit["cost"] = cell_time_and_cost(
                    rates, flops, seq_len, batch, tokens, host_bytes, price
                )

        return layout_cells
    sc, gpu = rates.sc, rates.gpu
    setup, profile = sc.setup, sc.profile
    peak, efficiency, memory = rates.peak_flops, rates.efficiency, rates.memory_seconds
    per_flop = peak * efficiency if peak else None  # `step_cell`'s divisor
    source, ranks, cards, sharding = (
        rates.efficiency_source,
        rates.ranks,
        rates.count,
        rates.sharding,
    )
    option_unknown, gpu_id = rates.unknown, gpu.id
    # `_rate`'s values, and its messages for a row that needs a rate the catalog lacks
    link = _rate(gpu.host_link_bytes_per_s, "host_link_bytes_per_s", gpu_id, [])
    net = _rate(gpu.interconnect_bytes_per_s, "interconnect_bytes_per_s", gpu_id, [])
    link_missing: list[str] = []
    net_missing: list[str] = []
    _rate(None, "host_link_bytes_per_s", gpu_id, link_missing)
    _rate(None, "interconnect_bytes_per_s", gpu_id, net_missing)
    offload_on = setup.checkpointing == "offload"
    fixed_volume = rates.comm_volume
    # the overlap fractions (the option's, else the profile's), read once where a row can
    # need them
    offload_hidden = comm_hidden = 0.0
    if offload_on:
        offload_hidden = _or_profile(rates.offload_hidden, profile, "offload_overlap_fraction")
    if fixed_volume is None or fixed_volume > 0:
        comm_hidden = _or_profile(rates.comm_hidden, profile, "comm_overlap_fraction")
    priced = price.usd_per_gpu_hour is not None

    def cells(fits: list[dict[str, Any]], args: list[CellArgs]) -> None:
        times: list[dict[str, Any]] = []
        hours: list[float | None] = []
        for flops, seq_len, batch, tokens, host_bytes in args:
            flops_total = flops.total
            unknown = list(option_unknown) if option_unknown else None
            compute = flops_total / per_flop if per_flop is not None else None
            offload: float | None = 0.0
            if offload_on and host_bytes > 0:
                if link is None:
                    unknown = [*(unknown or ()), *link_missing]
                    offload = None
                else:
                    offload = (1.0 - offload_hidden) * (2.0 * host_bytes / link)
            comm: float | None = 0.0
            volume = fixed_volume
            if volume is None:  # device_map: the layer-boundary activations, per token
                volume = comm_bytes(sc.spec, setup, profile, sharding, cards, seq_len, batch)
            if volume > 0:
                if net is None:
                    unknown = [*(unknown or ()), *net_missing]
                    comm = None
                else:
                    comm = (1.0 - comm_hidden) * (volume / net)
            step = None
            if (
                compute is not None
                and memory is not None
                and offload is not None
                and comm is not None
            ):
                busy, moved = compute or 0.0, memory or 0.0  # max(busy, moved), as max picks
                step = (moved if moved > busy else busy) + (offload or 0.0) + (comm or 0.0)
            tokens_per_step = seq_len * batch * ranks
            tps = tokens_per_step / step if step else None
            wall = gpu_hours = None
            if tokens is not None and tps is not None:
                wall = tokens / tps / 3600.0
                gpu_hours = wall * cards
            time: dict[str, Any] = {
                "step_seconds": step,
                "tokens_per_second": tps,
                "tokens_per_step": tokens_per_step,
                "compute_seconds": compute,
                "memory_seconds": memory,
                "offload_seconds": offload,
                "comm_seconds": comm,
                "comm_inter_node_seconds": None,
                "mfu": flops.model_flops / (step * peak) if step and peak else None,
                "efficiency": efficiency,
                "efficiency_source": source,
                "flops_per_step": flops_total,
                "model_flops_per_step": flops.model_flops,
                "gpus": cards,
                "sharding": sharding,
                "wall_hours": wall,
                "gpu_hours": gpu_hours,
            }
            if unknown:
                time["unknown"] = unknown
            times.append(time)
            hours.append(gpu_hours)
        costs = run_costs(hours, price, gpu_id)
        for fit, time, cost in zip(fits, times, costs, strict=True):
            if priced and time["step_seconds"] is None:
                cost["reason"] = "; ".join(time.get("unknown") or ())
            fit["time"] = time
            fit["cost"] = cost

    return cells


def _or_profile(value: float | None, profile: Profile, key: str) -> float:
    """`value`, or without one the profile's `time` figure `key`."""
    return profile.number("time", key) if value is None else value


def training_summary(
    sc: Scenario,
    rows_by_gpu: Mapping[str, Mapping[str, Any]],
    tokens: float | None,
    *,
    verdicts: Mapping[str, str] | None = None,
    stages: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run as a whole, at the scenario's sequence length: per GPU option (rows from
    `row_time_and_cost`) GPU hours, wall hours and USD, ranked by cost and by wall time among
    the options that fit, and the options that do not. `flops_total` = executed FLOPs per step
    x steps (tokens / tokens per step); `model_flops_total` the same without recompute (6*N*D
    for a dense model trained in full)."""
    verdicts = verdicts or {}
    entries = []
    for option, row in rows_by_gpu.items():
        fits = bool(row.get("fits"))
        verdict = verdicts.get(option, "fits" if fits else "no")
        entries.append((option, row["time"], row["cost"], fits, verdict))
    return run_summary(
        (sc.spec.name, sc.setup.method, sc.seq_len, sc.batch),
        entries,
        tokens,
        None if stages is None else stages.get("stages"),
    )


def run_summary(
    run: tuple[str, str, int, int],
    entries: Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any], bool, str]],
    tokens: float | None,
    stages: Any = None,
) -> dict[str, Any]:
    """`training_summary` from `run` = (model name, method, sequence length, batch) and each
    option's (option, time, cost, fits, verdict), in the options' order."""
    options: dict[str, dict[str, Any]] = {}
    flops_total = model_flops_total = None
    for option, t, c, fits, verdict in entries:
        options[option] = {
            "fits": fits,
            "verdict": verdict,
            "gpus": t.get("gpus"),
            "tokens_per_second": t.get("tokens_per_second"),
            "step_seconds": t.get("step_seconds"),
            "mfu": t.get("mfu"),
            "efficiency": t.get("efficiency"),
            "wall_hours": t.get("wall_hours"),
            "gpu_hours": t.get("gpu_hours"),
            "usd_per_gpu_hour": c.get("usd_per_gpu_hour"),
            "cost_usd": c.get("usd"),
            "price_source": c.get("price_source"),
            "reason": c.get("reason"),
        }
        if tokens is not None and flops_total is None and t.get("tokens_per_step"):
            per_gpu_steps = tokens / float(t["tokens_per_step"]) * _ranks(t)
            flops_total = float(t["flops_per_step"]) * per_gpu_steps
            model_flops_total = float(t["model_flops_per_step"]) * per_gpu_steps
    ranked = rank_options(options)
    model, method, seq_len, batch = run
    return {
        "model": model,
        "method": method,
        "seq_len": seq_len,
        "batch": batch,
        "tokens": tokens,
        "stages": stages,
        "flops_total": flops_total,
        "model_flops_total": model_flops_total,
        "options": options,
        **ranked,
    }


def _ranks(time: Mapping[str, Any]) -> int:
    """Data-parallel ranks that each ran `flops_per_step` (device_map: one pipeline)."""
    return (
        int(time.get("gpus") or 1)
        if time.get("sharding") in ("fsdp", "zero1", "zero2", "zero3")
        else 1
    )


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def format_time_cost_table(summary: Mapping[str, Any], fmt: str = "table") -> str:
    """Hours and dollars per GPU option, cheapest fitting option first, then the others:
    `table` (aligned text) or `markdown`."""
    if fmt not in ("table", "markdown"):
        raise EstimatorInputError("format", f"{fmt!r}: use table or markdown")
    tokens = summary.get("tokens")
    head = ["GPU", "fits", "tokens/s", "wall h", "GPU h", "USD/GPU-h", "USD", "note"]
    order = list(summary.get("by_cost", []))
    order += [k for k in summary["options"] if k not in order]
    body = []
    for k in order:
        o = summary["options"][k]
        note = o.get("reason") or ""
        body.append(
            [
                k,
                o["verdict"],
                _num(o["tokens_per_second"], ",.0f"),
                _num(o["wall_hours"], ".1f"),
                _num(o["gpu_hours"], ".1f"),
                _num(o["usd_per_gpu_hour"], ".2f"),
                _num(o["cost_usd"], ",.0f"),
                note,
            ]
        )
    title = (
        f"Time and cost: {_tokens_label(tokens)} tokens, {summary.get('method')} "
        f"{summary.get('model')}, seq {summary.get('seq_len')} x batch {summary.get('batch')}"
    )
    if summary.get("flops_total"):
        title += f", {summary['flops_total']:.3g} FLOPs"
    lines = [title, ""]
    if fmt == "markdown":
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join("---" for _ in head) + "|")
        lines += ["| " + " | ".join(r) + " |" for r in body]
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
        lines += [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body
        ]
    if summary.get("by_cost"):
        lines += ["", f"cheapest: {summary['by_cost'][0]}; fastest: {summary['by_time'][0]}"]
    if summary.get("not_fitting"):
        lines.append("does not fit: " + ", ".join(n["gpu"] for n in summary["not_fitting"]))
    return "\n".join(lines) + "\n"


def _tokens_label(tokens: float | None) -> str:
    if tokens is None:
        return "unknown"
    for scale, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k")):
        if tokens >= scale:
            return f"{tokens / scale:.3g}{suffix}"
    return f"{tokens:.0f}"
