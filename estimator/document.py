"""Where a request becomes a document: the one module front ends call (CLI, REST service,
notebooks). `estimate()` composes the memory rows (`estimator.rows`) with the time wing
(`estimator.time.plan`) into the estimate document of design.md; the check, solver and
recommendation documents are built on the same parts.

    request (estimator.request) -> Scenario -> memory rows + time/cost -> verdicts -> document
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from estimator.dict_display import nested_dict
from estimator.errors import EstimatorInputError
from estimator.gpu_options import GpuOption, check_devices, parse_gpu_options
from estimator.memo import Memo, setup_key
from estimator.memory.weights import check_stored_quantization
from estimator.model_source import resolve_model
from estimator.presets import PRESET_SOURCES, PRESET_TRANSCRIBED, preset_config, preset_ids
from estimator.profile import Profile, load_profile
from estimator.profile import list_profiles as _list_profiles
from estimator.rows import estimate_rows, model_summary
from estimator.scenario import Scenario
from estimator.spec import ModelSpec
from estimator.time.cost import gpu_price, normalise_prices
from estimator.time.flops import step_flops_totals
from estimator.time.plan import CellArgs, CellFn, option_cells, run_summary
from estimator.time.step import option_rates
from estimator.time.tokens import RunTokens, resolve_tokens, seq_len_report

if TYPE_CHECKING:
    from estimator.request import CheckRequest, EstimateRequest, RecommendRequest, SolverRequest
    from estimator.setup import TrainingSetup
    from estimator.time.calibration import Calibration

SCHEMA = "trainfit.estimate/1"
# each GPU option's cells (its rates, `option_cells`) per (spec, profile, GPU) and (setup,
# option, cards, prices, efficiency): seq-independent, so shared by every row and every
# request that asks again
_RATES: Memo[CellFn] = Memo(1024)


def _kept_cells(
    spec: ModelSpec,
    setup: TrainingSetup,
    profile: Profile,
    at: tuple[int, int, Any, int, str, dict[str, float]],
    efficiency: float | None,
    source: str | None,
    prices_by_id: dict[str, float],
) -> CellFn:
    """`option_cells` of one option's `option_rates` (`at`: seq, batch, GPU, cards, option
    text, prices) and price (`prices_by_id`: the normalised prices) on copies of the setup and
    prices: the memo keeps them past the call."""
    seq, batch, gpu, devices, option, prices = at
    sc = Scenario(
        spec,
        setup.model_copy(deep=True),
        profile,
        seq,
        batch,
        gpu=gpu,
        count=devices,
        option=option,
        prices=dict(prices),
    )
    return option_cells(option_rates(sc, efficiency, source), gpu_price(gpu, prices_by_id))


def _tokens_for(spec: ModelSpec, request: EstimateRequest, seq: int) -> float | None:
    """The run's tokens at this maximum sequence length (a dataset loses samples at shorter
    lengths; explicit or Chinchilla budgets do not depend on it)."""
    return resolve_tokens(
        spec,
        tokens=request.tokens,
        target_tokens=request.target_tokens,
        dataset_lengths=request.dataset_lengths,
        epochs=request.epochs,
        max_seq=seq,
        overflow=request.overflow,
    )


def add_time_and_cost(
    spec: ModelSpec,
    request: EstimateRequest,
    rows: list[dict[str, Any]],
    setups: dict[tuple[str, str], tuple[TrainingSetup, tuple[Any, ...]]],
    profile: Profile,
    options: dict[str, GpuOption],
    tokens_at: dict[int, float | None] | None = None,
) -> Calibration | None:
    """FLOPs once per row (they do not depend on the GPU); the rates of each GPU option once
    per setup (`option_cells`); `time` and `cost` per row and option, made option by option
    down each setup's rows (the cells `estimator.time.plan.row_time_and_cost` makes one at a
    time). `setups`: each
    (checkpointing, loss) row key's setup with its `setup_key`."""
    cal = None
    if request.calibration is not None:
        from estimator.time.calibration import calibrate  # loaded only when asked for

        c = request.calibration
        measured = Scenario(
            spec, next(iter(setups.values()))[0], profile, c.seq_len, c.batch, option=c.gpu
        )
        cal = calibrate(
            measured,
            step_seconds=c.step_seconds,
            tokens_per_second=c.tokens_per_second,
            source="calibration in the request",
        )
    prices = normalise_prices(request.prices) if request.prices else {}
    price_key = tuple(sorted(request.prices.items())) if request.prices else ()
    # the cells of each GPU option per setup: once per (setup, option), not per row, and
    # memoised across requests (they do not depend on the length: `option_cells`)
    cells: dict[tuple[str, str], dict[str, CellFn]] = {}
    # each setup's rows and their cells' arguments, filled column by column (option by option)
    columns: dict[tuple[str, str], tuple[list[dict[str, Any]], list[CellArgs]]] = {}
    tokens_at = {} if tokens_at is None else tokens_at  # the run's tokens per length, filled
    for row in rows:
        key = (row["checkpointing"], row["loss"])
        setup, skey = setups[key]
        seq, batch = row["seq_len"], row["batch"]
        if seq < 1 or batch < 1:
            raise EstimatorInputError("seq_len", "sequence length and batch must be positive")
        flops = step_flops_totals(spec, setup, seq, batch, skey)  # once per row
        row["flops_per_step"] = flops.total
        if seq not in tokens_at:
            tokens_at[seq] = _tokens_for(spec, request, seq)
        tokens = tokens_at[seq]
        host = row["host_bytes"] or 0
        column = columns.get(key)
        if column is None:
            column = columns[key] = ([], [])
            by_option = cells[key] = {}
            for option, fit in row["fit"].items():
                efficiency = source = None
                if cal is not None:
                    efficiency = cal.efficiency_on(fit["gpu"], profile)
                    source = f"calibrated: {cal.tokens_per_second:.4g} tokens/s on {cal.gpu_option}"
                o, devices = options[option], fit["devices"]
                at = (seq, batch, o.gpu, devices, option, request.prices)
                by_option[option] = _RATES.call(
                    (spec, profile, o.gpu, skey),  # skey interned: by identity
                    (option, devices, price_key, efficiency, source),
                    _kept_cells,
                    spec,
                    setup,
                    profile,
                    at,
                    efficiency,
                    source,
                    prices,
                )
        column[0].append(row)
        column[1].append((flops, seq, batch, tokens, host))
    for key, (key_rows, args) in columns.items():
        for option, option_cells_of in cells[key].items():
            fits = [r["fit"][option] for r in key_rows]
            option_cells_of(fits, args)
            if cal is not None:
                for fit, (_, seq, batch, _, _) in zip(fits, args, strict=True):
                    fit["time"]["measured"] = cal.is_measured(option, seq, batch)
    return cal


def estimate(
    request: EstimateRequest, variants: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The estimate document. `variants`: setup overrides (e.g. checkpointing x loss) that add
    rows for the same model and GPUs, as seed 000's fit table does."""
    profile = load_profile(request.profile)
    spec = resolve_model(request.model)
    options = parse_gpu_options(request.gpus)
    check_devices(spec, request.setup, options)
    setups = (
        [request.setup] if not variants else [request.setup.model_copy(update=v) for v in variants]
    )
    rows: list[dict[str, Any]] = []
    mem = None
    by_key: dict[tuple[str, str], tuple[TrainingSetup, tuple[Any, ...]]] = {}
    skeys: dict[tuple[str, str], tuple[Any, ...]] = {}  # each setup's key, once
    for setup in setups:
        if variants:
            from estimator.setup import TrainingSetup  # (loaded with the request models)

            TrainingSetup.model_validate(setup.model_dump())  # overrides re-validated
        skey = skeys[(setup.checkpointing, setup.loss)] = setup_key(setup)
        by_key[(setup.checkpointing, setup.loss)] = (setup, skey)
        setup_rows, mem = estimate_rows(
            spec, setup, request.seq_lens, options, request.usable_fraction, profile, skey
        )
        rows += setup_rows
    assert mem is not None
    if len(rows) > 1:
        rows.sort(key=lambda r: r["seq_len"])
    tokens_at: dict[int, float | None] = {}
    cal = add_time_and_cost(
        spec, request, rows, by_key, profile, {o.option: o for o in options}, tokens_at
    )
    longest = max(request.seq_lens)
    base = setups[0]
    base_row = (
        rows[0]  # one length, one setup: the only row
        if len(rows) == 1
        else next(
            r
            for r in rows
            if r["seq_len"] == longest
            and (r["checkpointing"], r["loss"]) == (base.checkpointing, base.loss)
        )
    )
    training = run_summary(  # `training_summary` of the base setup's longest row
        (spec.name, base.method, longest, base.batch),
        [
            (o, f["time"], f["cost"], f["verdict"] == "fits", f["verdict"])
            for o, f in base_row["fit"].items()
        ],
        tokens_at[longest],  # `_tokens_for` at the longest length, as the rows had it
    )
    extra: dict[str, Any] = {"training": training}
    if cal is not None:
        extra["calibration"] = cal.as_dict()
    if request.dataset_lengths is not None:
        extra["dataset"] = seq_len_report(
            request.dataset_lengths, request.seq_lens, request.overflow
        )
    report = request.train_config_report
    if report is not None:
        extra["train_config"] = report
    echo_key = None if variants else skeys[(base.checkpointing, base.loss)]  # base: request.setup
    setup_out = _setup_echo(request.setup, echo_key)
    if report is not None:
        setup_out["ignored"] = report["ignored"]
    return {
        "schema": SCHEMA,
        "model": model_summary(spec, request.setup, mem, profile),
        "setup": setup_out,
        "profile": profile.name,
        "usable_fraction": request.usable_fraction,
        "gpus": {
            o.option: {
                "id": o.gpu.id,
                "name": o.gpu.name,
                "count": o.count,
                "capacity_bytes": o.gpu.capacity_bytes,
                "capacity_source": o.gpu.sources.get("capacity_bytes", ""),
            }
            for o in options
        },
        "rows": rows,
        **extra,
        "assumptions": _assumptions(profile),
    }


def _setup_echo(setup: TrainingSetup, skey: tuple[Any, ...] | None = None) -> dict[str, Any]:
    """`setup.model_dump()`, dumped once per setup value: a fresh dict whose lists and dicts
    are fresh copies. `skey`: `setup_key(setup)` when the caller has it."""
    skey = setup_key(setup) if skey is None else skey
    dump, mutable = _SETUP_DUMPS.call((skey,), None, _dump_of, setup)
    out = dict(dump)
    for k in mutable:
        out[k] = _copied(dump[k])
    return out


def _copied(value: Any) -> Any:
    """`copy.deepcopy` of a dumped field: lists and dicts copied all the way down; their
    leaves (str, int, float, bool, None) are immutable and shared."""
    if type(value) is list:
        return [_copied(v) for v in value]
    if type(value) is dict:
        return {k: _copied(v) for k, v in value.items()}
    return value


def _dump_of(setup: TrainingSetup) -> tuple[dict[str, Any], tuple[str, ...]]:
    dump = setup.model_dump()
    return dump, tuple(k for k, v in dump.items() if isinstance(v, list | dict))


_SETUP_DUMPS: Memo[tuple[dict[str, Any], tuple[str, ...]]] = Memo()


def _assumptions(profile: Profile) -> dict[str, dict[str, dict[str, Any]]]:
    """`profile.as_dict()` (a fresh document part): one compiled dict display of the profile's
    sorted entries (`estimator.dict_display`), built once per profile, filled with the
    entries' values and sources."""
    make, values = _ASSUMPTIONS.call((profile,), None, _assumptions_display, profile)
    return make(values)


def _assumptions_display(
    profile: Profile,
) -> tuple[Callable[[Sequence[Any]], dict[str, Any]], tuple[Any, ...]]:
    values: list[Any] = []
    shape = []
    for section, items in profile.entries.items():
        entries = []
        for key, assumption in sorted(items.items()):
            entries.append((key, (("value", len(values)), ("source", len(values) + 1))))
            values += (assumption.value, assumption.source)
        shape.append((section, tuple(entries)))
    return nested_dict(tuple(shape)), tuple(values)


_ASSUMPTIONS: Memo[tuple[Callable[[Sequence[Any]], dict[str, Any]], tuple[Any, ...]]] = Memo()


estimate_document = estimate  # the front ends' name for it (one call frame fewer, issue 17)


def check_document(req: CheckRequest) -> dict[str, Any]:
    """Does the setup fit the one GPU at every requested length? Reports the worst row."""
    doc = estimate(req.as_estimate_request())
    option = next(iter(doc["gpus"]))
    worst = max(doc["rows"], key=lambda r: r["fit"][option]["peak_bytes"] or 0)
    fit = worst["fit"][option]
    return {
        "fits": fit["verdict"] == "fits",
        "verdict": fit["verdict"],
        "gpu": option,
        "seq_len": worst["seq_len"],
        "peak_bytes": fit["peak_bytes"],
        "usable_bytes": fit["usable_bytes"],
        "capacity_bytes": fit["capacity_bytes"],
        "margin_bytes": fit["margin_bytes"],
        "usable_fraction": req.usable_fraction,
        "peak_is_lower_bound": fit["peak_is_lower_bound"],
        "profile": doc["profile"],
        **({"train_config": doc["train_config"]} if "train_config" in doc else {}),
        "rows": [
            {
                "seq_len": r["seq_len"],
                **{k: r["fit"][option][k] for k in ("verdict", "peak_bytes", "margin_bytes")},
            }
            for r in doc["rows"]
        ],
    }


def list_presets() -> list[dict[str, Any]]:
    from estimator.architectures import spec_from_config

    out = []
    for pid in preset_ids():
        spec = spec_from_config(preset_config(pid), name=pid)
        out.append(
            {
                "id": pid,
                "name": pid,
                "model_type": spec.model_type,
                "params_total": spec.params_total,
                "source": PRESET_SOURCES[pid],
                # where a preset not from shared/reference was read (estimator/presets.py)
                "transcribed_from": PRESET_TRANSCRIBED.get(pid),
            }
        )
    return out


def list_profiles() -> list[str]:
    return _list_profiles()


def compare_memtest(doc: dict[str, Any], profile: str = "default") -> dict[str, Any]:
    """`estimator.compare.compare` (the memory, row by row), plus `speed`: tokens/s measured
    next to the time model's on the card the memtest ran on (`compare_speed`; [] for CPU and
    fake runs, an unknown card, or a setup the time model cannot price)."""
    from estimator.compare import compare

    result = compare(doc, profile)
    result["speed"] = []
    if result["gpu"] is not None:
        with contextlib.suppress(EstimatorInputError, ValueError):
            result["speed"] = compare_speed(doc, result["gpu"], profile)
    return result


def compare_speed(
    doc: dict[str, Any], gpu: str, profile_name: str = "default"
) -> list[dict[str, Any]]:
    """Per measured length: tokens/s measured next to the estimate's for the same setup on `gpu`
    (a catalog id; `gpu_catalog.lookup.card_for_device` names the card a CUDA memtest ran on).
    Error = estimated - measured, in % of measured."""
    from estimator.compare import measured_tokens_per_second, setup_from_memtest
    from estimator.request import EstimateRequest

    ok = [r for r in doc.get("results") or [] if r.get("status") == "ok"]
    if not ok:
        return []
    setup = setup_from_memtest(doc)
    count = int((doc.get("environment") or {}).get("gpu_count") or 1)
    option = gpu if count == 1 else f"{count}x{gpu}"
    model = doc.get("model") or {}
    request = EstimateRequest.model_validate(
        {
            "model": {"config": model.get("config"), "name": model.get("name")},
            "setup": setup.model_dump(),
            "seq_lens": sorted({int(r["seq_len"]) for r in ok}),
            "gpus": [option],
            "profile": profile_name,
        }
    )
    estimated = {
        row["seq_len"]: (row["fit"][option].get("time") or {}).get("tokens_per_second")
        for row in estimate_document(request)["rows"]
    }
    out = []
    for result in ok:
        measured = measured_tokens_per_second(result)
        est = estimated.get(int(result["seq_len"]))
        pct = None if est is None or not measured else 100.0 * (est - measured) / measured
        out.append(
            {
                "seq_len": int(result["seq_len"]),
                "measured_tokens_per_second": measured,
                "estimated_tokens_per_second": est,
                "error_pct": None if pct is None else round(pct, 1),
            }
        )
    return out


def _solver_inputs(req: SolverRequest) -> tuple[Any, Any, Any, Any, int]:
    from estimator.gpu_options import devices_for
    from estimator.solvers import Budget

    spec = resolve_model(req.model)
    check_stored_quantization(spec, req.setup)  # before the solvers skip settings that raise
    option = parse_gpu_options([req.gpu])[0]
    budget = Budget(option.gpu.capacity_bytes, req.usable_fraction)
    return spec, req.setup, budget, load_profile(req.profile), devices_for(option, req.setup)


def _needs_seq(req: SolverRequest) -> int:
    if req.seq_len is None:
        raise EstimatorInputError("seq_len", "required for this question")
    return req.seq_len


def max_seq_document(req: SolverRequest) -> dict[str, Any]:
    from estimator.solvers import max_seq

    spec, setup, budget, profile, devices = _solver_inputs(req)
    return {"gpu": req.gpu, **max_seq(spec, setup, budget, profile, req.granularity, devices)}


def max_batch_document(req: SolverRequest) -> dict[str, Any]:
    from estimator.solvers import max_batch

    spec, setup, budget, profile, devices = _solver_inputs(req)
    return {"gpu": req.gpu, **max_batch(spec, setup, _needs_seq(req), budget, profile, devices)}


def min_gpus_document(req: SolverRequest) -> dict[str, Any]:
    """Fewest cards: with `setup.parallel` auto (or no layout and no sharding) every layout is
    searched (estimator/layout_search.py); otherwise the given layout or sharding."""
    from estimator.solvers import min_gpus

    spec, setup, budget, profile, _ = _solver_inputs(req)
    seq = _needs_seq(req)
    if setup.parallel == "auto" or (not setup.parallel and setup.sharding == "none"):
        from estimator.layout_search import min_gpus_layouts
        from estimator.time.cost import normalise_prices

        option = parse_gpu_options([req.gpu])[0]
        prices = normalise_prices(req.prices) if req.prices else {}
        sc = Scenario(spec, setup, profile, seq, setup.batch, gpu=option.gpu, prices=prices)
        found = min_gpus_layouts(sc, budget.usable_bytes, req.tokens, req.within_days)
        return {"gpu": req.gpu, "seq_len": seq, "batch": setup.batch, "search": True, **found}
    return {"gpu": req.gpu, **min_gpus(spec, setup, seq, budget, profile)}


def recommend_document(req: RecommendRequest) -> dict[str, Any]:
    from estimator.recommend import recommend

    prices = normalise_prices(req.prices) if req.prices else {}
    sc = Scenario(resolve_model(req.model), req.setup, load_profile(req.profile), prices=prices)
    check_stored_quantization(sc.spec, req.setup)  # before the grid skips settings that raise
    run = RunTokens(req.tokens, req.dataset_lengths, req.epochs, req.overflow)
    return recommend(
        sc, parse_gpu_options(req.gpus), req.usable_fraction, required_seq=req.seq_len, run=run
    )
