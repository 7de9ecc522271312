"""Which `--parallel` layouts a run can use on N cards of a kind, and which is cheapest and
fastest: every candidate is evaluated on the same memory and time model as `estimate`, and a
rejected layout keeps its reason (does not divide the model, or its peak is over the budget).

Candidates on N cards (p per node): dp (DDP), fsdp, hsdp (N > p), zero1, zero2, zero3, zero2 and
zero3 with optimizer offload, zero3 and fsdp with parameter offload, fsdp + tp (2, 4, 8 up to a
node, with sequence parallelism), fsdp + pp (2, 4, 8), fsdp + cp (2, 4, 8, for sequences of 16k
and more), fsdp + ep (MoE). Cheapest: least USD (GPU-seconds per token when there are no
tokens or prices); fastest: most tokens per second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.objective import splits_the_model_ok
from estimator.parallel import check_model
from estimator.parallel.layout import model_splits, parse_parallel
from estimator.parallel.of_setup import layout_of
from estimator.scenario import Scenario
from estimator.time.plan import row_time_and_cost

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

CP_FROM_SEQ = 16_384
DEGREES = (2, 4, 8)


def candidates(sc: Scenario, gpus: int, per_node: int) -> list[dict[str, str]]:
    """Layout settings (`parallel`, `offload`) worth trying on `gpus` cards."""
    if gpus == 1:
        return [{"parallel": "", "offload": "none"}]
    out = [{"parallel": p, "offload": "none"} for p in ("dp", "fsdp", "zero1", "zero2", "zero3")]
    out += [
        {"parallel": "zero2", "offload": "optimizer"},
        {"parallel": "zero3", "offload": "optimizer"},
        {"parallel": "zero3", "offload": "params"},
        {"parallel": "fsdp", "offload": "params"},
    ]
    if gpus > per_node and gpus % per_node == 0:
        out.append({"parallel": "hsdp", "offload": "none"})
    for t in DEGREES:
        if t <= per_node and gpus % t == 0:
            text = f"tp={t},sp" if gpus == t else f"fsdp,tp={t},sp"
            out.append({"parallel": text, "offload": "none"})
    for p in DEGREES:
        if gpus % p == 0:
            out.append({"parallel": f"pp={p}" if gpus == p else f"fsdp,pp={p}", "offload": "none"})
    if sc.seq_len >= CP_FROM_SEQ:
        for c in DEGREES:
            if gpus % c == 0:
                out.append(
                    {"parallel": f"cp={c}" if gpus == c else f"fsdp,cp={c}", "offload": "none"}
                )
    if sc.spec.moe:
        for e in DEGREES:
            if gpus % e == 0 and sc.spec.moe.num_experts % e == 0:
                out.append({"parallel": f"fsdp,ep={e}", "offload": "none"})
    if not splits_the_model_ok(sc.setup):
        out = [c for c in out if not model_splits(parse_parallel(c["parallel"]))]
    return out


def _setup_for(base: TrainingSetup, choice: dict[str, str], gpus: int) -> TrainingSetup:
    update: dict[str, Any] = {"num_gpus": gpus, "offload": choice["offload"]}
    update["parallel"] = choice["parallel"] or None
    if choice["parallel"]:
        update["sharding"] = "none"
    return base.model_copy(update=update)


def evaluate(
    sc: Scenario, choice: dict[str, str], gpus: int, usable: float, tokens: float | None
) -> dict[str, Any]:
    """One layout on `gpus` cards of `sc.gpu` at `sc.seq_len` x `sc.setup.batch`: its peak and
    verdict, and for a fitting one its time and cost; or the reason it cannot run."""
    gpu = sc.require_gpu()
    setup = _setup_for(sc.setup, choice, gpus)
    row: dict[str, Any] = {"parallel": choice["parallel"] or "single", "offload": choice["offload"]}
    try:
        layout = layout_of(setup, gpus, getattr(gpu, "gpus_per_node", None))
        if layout is not None:
            check_model(layout, sc.spec)
            row["parallel"] = layout.text
        mem = memory_breakdown(sc.spec, setup, [sc.seq_len], setup.batch, sc.profile, gpus)
    except EstimatorInputError as err:
        return {**row, "fits": False, "reason": err.message}
    peak = float(mem.peak[0])
    row.update({"peak_bytes": int(peak), "usable_bytes": int(usable), "fits": peak <= usable})
    if not row["fits"]:
        row["reason"] = f"needs {peak / 2**30:.1f} GiB per card, {usable / 2**30:.1f} usable"
        return row
    on = sc.at(setup=setup, gpu=gpu, count=gpus)
    cell = row_time_and_cost(on, tokens=tokens, host_bytes=int(float(mem.host[0])), fits=True)
    row.update({"time": cell["time"], "cost": cell["cost"]})
    return row


def _cost_key(row: dict[str, Any], gpus: int) -> float:
    usd = (row.get("cost") or {}).get("usd")
    if usd is not None:
        return float(usd)
    tps = (row.get("time") or {}).get("tokens_per_second")
    return gpus / tps if tps else float("inf")


def _speed_key(row: dict[str, Any]) -> float:
    tps = (row.get("time") or {}).get("tokens_per_second")
    return -float(tps) if tps else float("inf")


def search(sc: Scenario, gpus: int, usable: float, tokens: float | None = None) -> dict[str, Any]:
    """Every candidate on `gpus` cards; the cheapest and the fastest that fit."""
    per_node = getattr(sc.require_gpu(), "gpus_per_node", None) or gpus
    rows = [evaluate(sc, c, gpus, usable, tokens) for c in candidates(sc, gpus, per_node)]
    fitting = [r for r in rows if r["fits"]]
    out: dict[str, Any] = {
        "gpus": gpus,
        "layouts": rows,
        "cheapest": min(fitting, key=lambda r: _cost_key(r, gpus)) if fitting else None,
        "fastest": min(fitting, key=_speed_key) if fitting else None,
    }
    return out


def fits_somehow(sc: Scenario, gpus: int, usable: float) -> bool:
    """Memory only: does any candidate fit on `gpus` cards (no time, no cost)."""
    per_node = getattr(sc.require_gpu(), "gpus_per_node", None) or gpus
    for choice in candidates(sc, gpus, per_node):
        setup = _setup_for(sc.setup, choice, gpus)
        try:
            layout = layout_of(setup, gpus, per_node)
            if layout is not None:
                check_model(layout, sc.spec)
            mem = memory_breakdown(sc.spec, setup, [sc.seq_len], setup.batch, sc.profile, gpus)
        except EstimatorInputError:
            continue
        if float(mem.peak[0]) <= usable:
            return True
    return False


def gpu_counts(per_node: int, upper: int) -> list[int]:
    """Counts tried by min-gpus: 1, 2, 4, ... up to a node, then whole nodes."""
    counts = [n for n in (1, 2, 4, 8) if n < per_node] + [per_node]
    k = 2
    while k * per_node <= upper:
        counts.append(k * per_node)
        k += 1 if k < 8 else k // 2
    return [c for c in counts if c <= upper]


def _in_time(found: dict[str, Any], days: float | None) -> bool:
    if days is None:
        return True
    fast = found["fastest"] or {}
    wall = (fast.get("time") or {}).get("wall_hours")
    return wall is not None and wall / 24 <= days


def min_gpus_layouts(
    sc: Scenario,
    usable: float,
    tokens: float | None = None,
    within_days: float | None = None,
    upper: int = 4096,
) -> dict[str, Any]:
    """The fewest cards on which some layout fits (and, with `within_days` and tokens, whose
    fastest layout finishes the run in that many days), with every layout's verdict there, the
    cheapest and the fastest; and the count before it with its reasons."""
    if within_days is not None and tokens is None:
        raise EstimatorInputError("within_days", "needs the run's tokens (--tokens)")
    per_node = getattr(sc.require_gpu(), "gpus_per_node", None) or 8
    counts = gpu_counts(per_node, upper)
    previous = None
    for n in counts:
        if fits_somehow(sc, n, usable):
            found = search(sc, n, usable, tokens)
            if not _in_time(found, within_days):
                previous = n
                continue
            if previous is not None:
                found["fewer"] = search(sc, previous, usable, tokens)
            found["within_days"] = within_days
            return found
        previous = n
    return {
        "gpus": None,
        "layouts": [],
        "cheapest": None,
        "fastest": None,
        "reason": f"nothing fits on up to {counts[-1]} cards",
    }
