"""Time and cost for `estimate()`: the functions the estimate document, the CLI and the REST
service call. Pure functions over plain JSON types (seconds and USD as floats).

- `row_time_and_cost` — one (seq_len, GPU option) cell: step time, tokens/s, hours, USD.
- `resolve_tokens` / `resolve_stages` — how many tokens the run trains on.
- `training_summary` — per option GPU hours, wall hours, USD; ranked by cost and by time.
- `format_time_cost_table` — the table of seed 000's "Time and cost" section.
- `parse_price_option` / `parse_calibrate_option` — the CLI's `--price` and `--calibrate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from estimator.cost import gpu_price, rank_options, run_cost
from estimator.errors import EstimatorInputError
from estimator.profile import Profile
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec
from estimator.timing import GPULike, step_time
from estimator.tokens import Overflow, Stage, chinchilla_for, fit_seq_len, run_tokens

TARGETS = ("chinchilla",)


def resolve_gpu_option(option: str, setup: TrainingSetup | None = None) -> tuple[Any, int]:
    """`h200` / `2xh200` -> (catalog GPU, cards). A one-card id with `setup.num_gpus` N means N
    cards (as `estimator.estimate.devices_for`). Bad ids -> EstimatorInputError('gpus')."""
    from gpu_catalog import parse_gpu_option

    try:
        gpu, count = parse_gpu_option(option)
    except ValueError as exc:
        raise EstimatorInputError("gpus", str(exc)) from None
    if count == 1 and setup is not None and setup.num_gpus > 1:
        count = setup.num_gpus
    return gpu, count


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
                gpu_id = resolve_gpu_option(key)[0].id
            except EstimatorInputError:
                raise EstimatorInputError(f"prices.{key}", f"unknown GPU {key!r}") from None
        out[gpu_id] = float(value)
    return out


def row_time_and_cost(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq_len: int,
    batch: int,
    gpu_option: str,
    profile: Profile,
    *,
    tokens: float | None,
    prices: Mapping[str, float],
    host_bytes: int,
    fits: bool,
    efficiency: float | None = None,
    efficiency_source: str | None = None,
    gpu: GPULike | None = None,
    count: int | None = None,
) -> dict[str, Any]:
    """Time and cost of one (seq_len, GPU option) cell of the estimate.

    `tokens`: the run's tokens (None: no hours, no cost). `host_bytes`: the memory model's host
    bytes for this row (offloaded checkpoints), moved out and back once per step. `fits`: the
    memory verdict, carried so rankings can leave non-fitting options out. `gpu`/`count` skip the
    catalog lookup (tests, stand-in GPUs)."""
    if gpu is None or count is None:
        gpu, count = resolve_gpu_option(gpu_option, setup)
    st = step_time(
        spec,
        setup,
        seq_len,
        batch,
        gpu,
        count,
        profile,
        host_bytes=host_bytes,
        efficiency=efficiency,
        efficiency_source=efficiency_source,
    )
    wall, gpu_hours = st.hours(tokens)
    time: dict[str, Any] = {
        "step_seconds": st.step_seconds,
        "tokens_per_second": st.tokens_per_second,
        "tokens_per_step": st.tokens_per_step,
        "compute_seconds": st.compute_seconds,
        "memory_seconds": st.memory_seconds,
        "offload_seconds": st.offload_seconds,
        "comm_seconds": st.comm_seconds,
        "mfu": st.mfu,
        "efficiency": st.efficiency,
        "efficiency_source": st.efficiency_source,
        "flops_per_step": st.flops.total,
        "model_flops_per_step": st.flops.model_flops,
        "gpus": count,
        "sharding": st.sharding,
        "wall_hours": wall,
        "gpu_hours": gpu_hours,
    }
    if st.unknown:
        time["unknown"] = list(st.unknown)
    price = gpu_price(gpu, normalise_prices(prices) if prices else {})
    cost = run_cost(gpu_hours, price, gpu.id)
    if st.step_seconds is None and price.usd_per_gpu_hour is not None:
        cost["reason"] = "; ".join(st.unknown)
    return {"time": time, "cost": cost, "fits": fits}


def resolve_tokens(
    spec: ModelSpec,
    *,
    tokens: float | None,
    target_tokens: str | None,
    dataset_lengths: Sequence[int] | None,
    epochs: float = 1.0,
    max_seq: int | None = None,
    overflow: Overflow = "drop",
) -> float | None:
    """The run's tokens from exactly one of: `tokens` (--tokens), `target_tokens="chinchilla"`
    (20 per parameter, Hoffmann et al. 2022), or a dataset's sample lengths (--dataset) kept at
    `max_seq` (longer samples dropped or truncated) times `epochs`. None when none is given."""
    given = [
        n
        for n, v in (
            ("tokens", tokens),
            ("target_tokens", target_tokens),
            ("dataset", dataset_lengths),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise EstimatorInputError(
            given[1], f"give one of tokens, target_tokens, dataset; got {given}"
        )
    if not 0 < epochs <= 1e6:
        raise EstimatorInputError("epochs", f"{epochs} is not in (0, 1e6]")
    if tokens is not None:
        if not 0 < tokens <= 1e16:
            raise EstimatorInputError("tokens", f"{tokens} is not in (0, 1e16]")
        return float(tokens) * epochs
    if target_tokens is not None:
        if target_tokens.lower() not in TARGETS:
            raise EstimatorInputError("target_tokens", f"{target_tokens!r}; known: {TARGETS}")
        return chinchilla_for(spec) * epochs
    if dataset_lengths is not None:
        seq = max_seq if max_seq is not None else max(dataset_lengths)
        return float(fit_seq_len(dataset_lengths, seq, overflow).tokens_kept) * epochs
    return None


def resolve_stages(
    stages: Sequence[Mapping[str, Any]], max_seq: int | None, overflow: Overflow = "drop"
) -> dict[str, Any]:
    """A multi-stage run: each stage {"name", "epochs", and "tokens" or "lengths"}.
    Returns {"tokens": total, "stages": [...per stage tokens and fit...]}."""
    parsed = []
    for i, raw in enumerate(stages):
        name = str(raw.get("name") or f"stage{i + 1}")
        lengths = raw.get("lengths")
        parsed.append(
            Stage(
                name=name,
                epochs=float(raw.get("epochs", 1.0)),
                tokens=None if raw.get("tokens") is None else float(raw["tokens"]),
                lengths=None if lengths is None else tuple(int(n) for n in lengths),
            )
        )
    return run_tokens(parsed, max_seq, overflow)


def training_summary(
    spec: ModelSpec,
    setup: TrainingSetup,
    rows_by_gpu: Mapping[str, Mapping[str, Any]],
    tokens: float | None,
    *,
    seq_len: int,
    batch: int,
    verdicts: Mapping[str, str] | None = None,
    stages: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run as a whole, at one sequence length: per GPU option (rows from
    `row_time_and_cost`) GPU hours, wall hours and USD, ranked by cost and by wall time among
    the options that fit, and the options that do not. `flops_total` = executed FLOPs per step
    x steps (tokens / tokens per step); `model_flops_total` the same without recompute (6*N*D
    for a dense model trained in full)."""
    options: dict[str, dict[str, Any]] = {}
    flops_total = model_flops_total = None
    for option, row in rows_by_gpu.items():
        t, c = row["time"], row["cost"]
        verdict = (verdicts or {}).get(option, "fits" if row.get("fits") else "no")
        options[option] = {
            "fits": bool(row.get("fits")),
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
    return {
        "model": spec.name,
        "method": setup.method,
        "seq_len": seq_len,
        "batch": batch,
        "tokens": tokens,
        "stages": None if stages is None else stages.get("stages"),
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


def parse_calibrate_option(value: str) -> dict[str, Any]:
    """`--calibrate gpu=a100-80gb,seq=6750,batch=1,tokens_per_second=221` (or
    `step_seconds=30.5`) -> keyword arguments of `estimator.calibration.calibrate`; a path
    ending in .json means a memtest document (`{"memtest": path}`)."""
    if value.strip().lower().endswith(".json"):
        return {"memtest": value.strip()}
    fields: dict[str, Any] = {}
    aliases = {"seq": "seq_len", "tps": "tokens_per_second", "step": "step_seconds"}
    for item in value.split(","):
        key, sep, raw = item.partition("=")
        key = aliases.get(key.strip(), key.strip())
        if not sep or key not in ("gpu", "seq_len", "batch", "tokens_per_second", "step_seconds"):
            raise EstimatorInputError(
                "calibrate",
                f"{item!r}: expected gpu=ID,seq=N,batch=N,tokens_per_second=X "
                "(or step_seconds=X), or a memtest .json",
            )
        fields[key] = raw.strip()
    for k, kind in (
        ("seq_len", int),
        ("batch", int),
        ("tokens_per_second", float),
        ("step_seconds", float),
    ):
        if k in fields:
            try:
                fields[k] = kind(fields[k])
            except ValueError:
                raise EstimatorInputError(
                    f"calibrate.{k}", f"{fields[k]!r} is not a number"
                ) from None
    missing = [k for k in ("gpu", "seq_len") if k not in fields]
    if missing or ("tokens_per_second" in fields) == ("step_seconds" in fields):
        raise EstimatorInputError(
            "calibrate", "needs gpu, seq and one of tokens_per_second / step_seconds"
        )
    fields.setdefault("batch", 1)
    return fields
