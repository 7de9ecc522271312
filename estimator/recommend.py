"""The recommendation view: per GPU option, the best setting that fits the sequence length the
data needs, or, when none does, the longest that fits and what the data loses there; with
time and cost, cheapest first (seed 000's "Reading" paragraph, computed)."""

from __future__ import annotations

from itertools import product
from typing import Any

from estimator.errors import EstimatorInputError
from estimator.gpu_options import GpuOption, devices_for
from estimator.layout_search import candidates
from estimator.objective import losses_for
from estimator.scenario import Scenario
from estimator.solvers import Budget, max_seq, peak_bytes
from estimator.time.plan import row_time_and_cost
from estimator.time.tokens import RunTokens

GRID = {"checkpointing": ("none", "gpu", "offload"), "loss": ("full", "chunked")}


def _priced(sc: Scenario, option: GpuOption, tokens: float | None) -> dict[str, Any]:
    """Time and cost of a fitting setting: the scenario's setup at its `seq_len` on `option`."""
    from estimator.memory import memory_breakdown

    setup, seq = sc.setup, sc.seq_len
    n = devices_for(option, setup)
    host = float(
        memory_breakdown(sc.spec, setup, [seq], setup.batch, sc.profile, devices=n).host[0]
    )
    on = sc.at(batch=setup.batch, gpu=option.gpu, count=n, option=option.option)
    return row_time_and_cost(on, tokens=tokens, host_bytes=int(host), fits=True)


def _layout_variants(sc: Scenario, n: int) -> list[dict[str, Any]]:
    """Setup changes to try on `n` cards: every candidate layout (estimator/layout_search.py)
    when the setup names none (or `parallel: auto`), else the setup as given."""
    base = sc.setup
    if n <= 1 or not (base.parallel == "auto" or (not base.parallel and base.sharding == "none")):
        return [{}]
    per_node = getattr(sc.require_gpu(), "gpus_per_node", None) or n
    return [
        {"parallel": c["parallel"] or None, "offload": c["offload"], "num_gpus": n}
        for c in candidates(sc, n, per_node)
    ]


def _layout_name(setup: Any, n: int) -> str:
    if n <= 1:
        return "single"
    if setup.parallel:
        text = str(setup.parallel)
        return text if setup.offload == "none" else f"{text} +offload {setup.offload}"
    return str(setup.sharding if setup.sharding != "none" else "device_map")


def recommend_option(
    sc: Scenario,
    option: GpuOption,
    usable_fraction: float,
    required_seq: int,
    *,
    run: RunTokens,
    granularity: int = 256,
) -> dict[str, Any]:
    """The best setting for `option`: the fastest of the grid that takes `required_seq`, or the
    one that reaches the longest sequence when none does. `sc.setup` is the base setting."""
    spec, base, profile = sc.spec, sc.setup, sc.profile
    budget = Budget(option.gpu.capacity_bytes, usable_fraction)
    card = budget.capacity_bytes
    n = devices_for(option, base)
    candidates = []
    variants = _layout_variants(sc.at(seq_len=required_seq, gpu=option.gpu), n)
    for ck, loss in product(GRID["checkpointing"], losses_for(base, GRID["loss"])):
        for variant in variants:
            setup = base.model_copy(update={"checkpointing": ck, "loss": loss, **variant})
            try:
                peak = peak_bytes(spec, setup, required_seq, setup.batch, profile, n, card)
            except EstimatorInputError:  # a layout this model or card count cannot take
                continue
            candidates.append((setup, peak))
    fitting = [(s, p) for s, p in candidates if p <= budget.usable_bytes]
    if fitting:
        run_tokens, data = run.at(required_seq)
        priced = [
            (s, p, _priced(sc.at(setup=s, seq_len=required_seq), option, run_tokens))
            for s, p in fitting
        ]
        # fastest first: most tokens per second on the option's cards (layouts differ in
        # tokens per step, so step seconds alone do not rank them)
        # (to 3 digits: a tie keeps the simpler layout, DDP before ZeRO-1)
        priced.sort(
            key=lambda x: (-float(f"{x[2]['time']['tokens_per_second'] or 0.0:.3g}"), -x[1])
        )
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
        peak = peak_bytes(spec, setup, seq, setup.batch, profile, n, card)
        run_tokens, data = run.at(seq)
        cell = _priced(sc.at(setup=setup, seq_len=seq), option, run_tokens)
        status = "shorter"
    return {
        "gpu": option.option,
        "status": status,
        "seq_len": seq,
        "required_seq_len": required_seq,
        "checkpointing": setup.checkpointing,
        "loss": setup.loss,
        "devices": n,
        "parallel": _layout_name(setup, n),
        "peak_bytes": int(peak),
        "usable_bytes": int(budget.usable_bytes),
        "margin_bytes": int(budget.usable_bytes - peak),
        "dataset": data,
        "time": cell["time"],
        "cost": cell["cost"],
    }


def recommend(
    sc: Scenario,
    options: list[GpuOption],
    usable_fraction: float,
    *,
    required_seq: int | None = None,
    run: RunTokens | None = None,
) -> dict[str, Any]:
    """One row per GPU option: options that take the required length first, cheapest first
    (then fastest); then those that need a shorter length, cheapest first. `sc` holds the model,
    the base setup, the profile and the prices; `run` the tokens or the dataset's lengths."""
    from estimator.errors import EstimatorInputError

    run = run or RunTokens()
    if required_seq is None:
        if not run.lengths:
            raise EstimatorInputError("seq_lens", "give a sequence length or a dataset")
        required_seq = max(run.lengths)
    rows = [recommend_option(sc, o, usable_fraction, required_seq, run=run) for o in options]

    def key(r: dict[str, Any]) -> tuple[int, float, float]:
        rank = {"fits": 0, "shorter": 1, "no": 2}[r["status"]]
        usd = (r.get("cost") or {}).get("usd")
        hours = (r.get("time") or {}).get("wall_hours")
        return rank, float("inf") if usd is None else usd, float("inf") if hours is None else hours

    rows.sort(key=key)
    return {
        "model": sc.spec.name,
        "method": sc.setup.method,
        "required_seq_len": required_seq,
        "profile": sc.profile.name,
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
    if any((r.get("devices") or 1) > 1 for r in doc["rows"]):  # several cards: which layout
        header.insert(1, "layout")
        for row, r in zip(body, doc["rows"], strict=True):
            row.insert(1, r.get("parallel") or "-")
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
