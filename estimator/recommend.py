"""The recommendation view: per GPU option, the best setting that fits the sequence length the
data needs, or, when none does, the longest that fits and what the data loses there; with
time and cost, cheapest first (seed 000's "Reading" paragraph, computed)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from typing import Any

from estimator.estimate import GpuOption, devices_for
from estimator.pricing import row_time_and_cost
from estimator.profile import Profile
from estimator.setup import TrainingSetup
from estimator.solvers import Budget, max_seq, peak_bytes
from estimator.spec import ModelSpec
from estimator.tokens import fit_seq_len

GRID = {"checkpointing": ("none", "gpu", "offload"), "loss": ("full", "chunked")}


def _tokens(
    lengths: Sequence[int] | None, tokens: float | None, seq: int, epochs: float, overflow: str
) -> tuple[float | None, dict[str, Any] | None]:
    if lengths is None:
        return (None if tokens is None else tokens * epochs), None
    fit = fit_seq_len(lengths, seq, overflow)  # type: ignore[arg-type]
    return fit.tokens_kept * epochs, fit.as_dict()


def _priced(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq: int,
    option: GpuOption,
    profile: Profile,
    tokens: float | None,
    prices: dict[str, float],
    fits: bool,
) -> dict[str, Any]:
    from estimator.memory import memory_breakdown

    n = devices_for(option, setup)
    host = float(memory_breakdown(spec, setup, [seq], setup.batch, profile, devices=n).host[0])
    return row_time_and_cost(
        spec,
        setup,
        seq,
        setup.batch,
        option.option,
        profile,
        tokens=tokens,
        prices=prices,
        host_bytes=int(host),
        fits=fits,
        gpu=option.gpu,
        count=n,
    )


def recommend_option(
    spec: ModelSpec,
    base: TrainingSetup,
    option: GpuOption,
    profile: Profile,
    usable_fraction: float,
    required_seq: int,
    *,
    lengths: Sequence[int] | None,
    tokens: float | None,
    epochs: float,
    prices: dict[str, float],
    overflow: str = "drop",
    granularity: int = 256,
) -> dict[str, Any]:
    budget = Budget(option.gpu.capacity_bytes, usable_fraction)
    n = devices_for(option, base)
    candidates = []
    for ck, loss in product(GRID["checkpointing"], GRID["loss"]):
        setup = base.model_copy(update={"checkpointing": ck, "loss": loss})
        peak = peak_bytes(spec, setup, required_seq, setup.batch, profile, n)
        candidates.append((setup, peak))
    fitting = [(s, p) for s, p in candidates if p <= budget.usable_bytes]
    if fitting:
        run_tokens, data = _tokens(lengths, tokens, required_seq, epochs, overflow)
        priced = [
            (s, p, _priced(spec, s, required_seq, option, profile, run_tokens, prices, True))
            for s, p in fitting
        ]
        priced.sort(key=lambda x: (x[2]["time"]["step_seconds"] or float("inf"), -x[1]))
        setup, peak, cell = priced[0]
        seq, status = required_seq, "fits"
    else:
        best = None
        for setup, _ in candidates:
            ans = max_seq(spec, setup, budget, profile, granularity, n)
            if ans["seq_len"] and (best is None or ans["seq_len"] > best[1]):
                best = (setup, ans["seq_len"])
        if best is None:
            return {
                "gpu": option.option,
                "status": "no",
                "reason": f"no setting fits even {granularity} tokens",
                "capacity_bytes": option.gpu.capacity_bytes,
            }
        setup, seq = best
        peak = peak_bytes(spec, setup, seq, setup.batch, profile, n)
        run_tokens, data = _tokens(lengths, tokens, seq, epochs, overflow)
        cell = _priced(spec, setup, seq, option, profile, run_tokens, prices, True)
        status = "shorter"
    return {
        "gpu": option.option,
        "status": status,
        "seq_len": seq,
        "required_seq_len": required_seq,
        "checkpointing": setup.checkpointing,
        "loss": setup.loss,
        "devices": n,
        "peak_bytes": int(peak),
        "usable_bytes": int(budget.usable_bytes),
        "margin_bytes": int(budget.usable_bytes - peak),
        "dataset": data,
        "time": cell["time"],
        "cost": cell["cost"],
    }


def recommend(
    spec: ModelSpec,
    base: TrainingSetup,
    options: list[GpuOption],
    profile: Profile,
    usable_fraction: float,
    *,
    required_seq: int | None = None,
    lengths: Sequence[int] | None = None,
    tokens: float | None = None,
    epochs: float = 1.0,
    prices: dict[str, float] | None = None,
    overflow: str = "drop",
) -> dict[str, Any]:
    """One row per GPU option: options that take the required length first, cheapest first
    (then fastest); then those that need a shorter length, cheapest first."""
    from estimator.errors import EstimatorInputError

    if required_seq is None:
        if not lengths:
            raise EstimatorInputError("seq_lens", "give a sequence length or a dataset")
        required_seq = max(lengths)
    rows = [
        recommend_option(
            spec,
            base,
            o,
            profile,
            usable_fraction,
            required_seq,
            lengths=lengths,
            tokens=tokens,
            epochs=epochs,
            prices=prices or {},
            overflow=overflow,
        )
        for o in options
    ]

    def key(r: dict[str, Any]) -> tuple[int, float, float]:
        rank = {"fits": 0, "shorter": 1, "no": 2}[r["status"]]
        usd = (r.get("cost") or {}).get("usd")
        hours = (r.get("time") or {}).get("wall_hours")
        return rank, float("inf") if usd is None else usd, float("inf") if hours is None else hours

    rows.sort(key=key)
    return {
        "model": spec.name,
        "method": base.method,
        "required_seq_len": required_seq,
        "profile": profile.name,
        "usable_fraction": usable_fraction,
        "rows": rows,
    }


def render_recommendation(doc: dict[str, Any], fmt: str = "table") -> str:
    header = [
        "GPU",
        "status",
        "seq",
        "checkpoints",
        "loss",
        "peak GiB",
        "margin GiB",
        "dropped",
        "tokens/s",
        "wall h",
        "USD",
    ]
    body = []
    for r in doc["rows"]:
        if r["status"] == "no":
            body.append([r["gpu"], "no", "-", "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        data = r.get("dataset") or {}
        t, c = r["time"], r["cost"]
        dropped = f"{data.get('dropped')}/{data.get('samples')}" if data else "-"
        body.append(
            [
                r["gpu"],
                r["status"],
                str(r["seq_len"]),
                r["checkpointing"],
                r["loss"],
                f"{r['peak_bytes'] / 2**30:.1f}",
                f"{r['margin_bytes'] / 2**30:.1f}",
                dropped,
                "n/a" if t.get("tokens_per_second") is None else f"{t['tokens_per_second']:,.0f}",
                "n/a" if t.get("wall_hours") is None else f"{t['wall_hours']:.1f}",
                "n/a" if c.get("usd") is None else f"{c['usd']:.0f}",
            ]
        )
    title = (
        f"Recommendation for {doc['model']} ({doc['method']}), data needs "
        f"{doc['required_seq_len']} tokens; profile {doc['profile']}, usable "
        f"{doc['usable_fraction']:.0%}"
    )
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return f"**{title}**\n\n" + "\n".join(lines) + "\n"
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in [header, *body]
    ]
    return title + "\n" + "\n".join(lines) + "\n"
