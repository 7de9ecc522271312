"""`estimate()`: a request in, the estimate document of design.md out (bytes, per device)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

import gpu_catalog
from estimator.calibration import Calibration, calibrate
from estimator.errors import EstimatorInputError
from estimator.fit import VERDICTS, verdict_codes
from estimator.flops import step_flops
from estimator.memory import memory_breakdown
from estimator.memory.model import COMPONENTS, MemoryBreakdown
from estimator.models import resolve_model
from estimator.pricing import resolve_tokens, row_time_and_cost, training_summary
from estimator.profile import Profile, load_profile
from estimator.request import EstimateRequest
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec
from estimator.tokens import seq_len_report

SCHEMA = "trainfit.estimate/1"


@dataclass(frozen=True)
class GpuOption:
    """A `--gpu` entry: a catalog GPU and how many cards (`2xh200`)."""

    option: str
    gpu: gpu_catalog.GPU
    count: int


CUSTOM_CAPACITY = re.compile(r"^(?:(\d+)x)?(\d+(?:\.\d+)?)gib$")


def custom_gpu(text: str) -> tuple[gpu_catalog.GPU, int] | None:
    """`16gib` (or `2x16gib`): a card known only by its capacity, for "what fits on a 16 GB
    card" questions; it has no rates or price, so time and cost stay unknown."""
    m = CUSTOM_CAPACITY.match(text.strip().lower())
    if not m:
        return None
    gib = float(m.group(2))
    if not 0 < gib <= 100_000:
        return None
    capacity = int(gib * 2**30)
    gpu = gpu_catalog.GPU.model_construct(
        id=f"{m.group(2)}gib",
        name=f"{m.group(2)} GiB card",
        vendor="generic",
        memory_marketed_gb=gib,
        capacity_bytes=capacity,
        bf16_dense_tflops=None,
        fp8_dense_tflops=None,
        fp32_tflops=None,
        mamf_bf16_tflops_measured=None,
        memory_bandwidth_bytes_per_s=None,
        interconnect=None,
        interconnect_bytes_per_s=None,
        host_link=None,
        host_link_bytes_per_s=None,
        price_usd_per_hour=None,
        price_source=None,
        tdp_w=None,
        sources={"capacity_bytes": "given on the command line"},
        notes=None,
    )
    return gpu, int(m.group(1) or 1)


def parse_gpu_options(options: list[str]) -> list[GpuOption]:
    parsed = []
    for i, option in enumerate(options):
        custom = custom_gpu(option)
        if custom is not None:
            parsed.append(GpuOption(option.strip().lower(), custom[0], custom[1]))
            continue
        try:
            gpu, count = gpu_catalog.parse_gpu_option(option)
        except ValueError as err:
            raise EstimatorInputError(f"gpus[{i}]", str(err)) from None
        parsed.append(GpuOption(option.strip().lower(), gpu, count))
    return parsed


def check_devices(spec: ModelSpec, setup: TrainingSetup, options: list[GpuOption]) -> None:
    """Layer splitting (device_map) over more cards than the model has layers puts no layer
    on some cards: an error naming the option, not a silent estimate."""
    for i, option in enumerate(options):
        n = devices_for(option, setup)
        sharding = setup.sharding if setup.sharding != "none" else "device_map"
        if n > 1 and sharding == "device_map" and spec.layers and n > spec.layers:
            raise EstimatorInputError(
                f"gpus[{i}]",
                f"{n} cards split layer by layer but {spec.name} has {spec.layers} layers; "
                "use fewer cards or --sharding fsdp",
            )


def devices_for(option: GpuOption, setup: TrainingSetup) -> int:
    """`2xh200` means 2 cards; a single-card id with `num_gpus` N means N of that card."""
    return option.count if option.count > 1 else setup.num_gpus


def _int(value: Any) -> int | None:
    return None if value is None else int(np.ceil(float(value)))


def _components_at(mem: MemoryBreakdown, i: int) -> dict[str, int | None]:
    return {
        name: _int(None if mem.components[name] is None else mem.components[name][i])
        for name in COMPONENTS
    }


def model_summary(
    spec: ModelSpec, setup: TrainingSetup, mem: MemoryBreakdown, profile: Profile
) -> dict[str, Any]:
    from estimator.memory.weights import counted_params

    trainable = mem.states.trainable_params if mem.states else 0
    return {
        "name": spec.name,
        "model_type": spec.model_type,
        "params_total": spec.params_total,
        "params_active": spec.params_active,
        "params_trainable": trainable,
        "params_in_weights": counted_params(spec, profile),
        "params_extras": {g.name: g.params for g in spec.extras},
        "geometry_known": spec.geometry_known,
        "layers": spec.layers,
        "hidden": spec.hidden,
        "vocab": spec.vocab,
        "layer_types": {t: spec.count_layers(t) for t in sorted(set(spec.layer_types))},
        "notes": list(spec.notes),
    }


def estimate_rows(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq_lens: list[int],
    options: list[GpuOption],
    usable_fraction: float,
    profile: Profile,
) -> tuple[list[dict[str, Any]], MemoryBreakdown]:
    seqs = np.asarray(seq_lens, dtype=np.float64)
    mem = memory_breakdown(spec, setup, seqs, setup.batch, profile)
    per_option: dict[str, MemoryBreakdown] = {}
    for opt in options:
        n = devices_for(opt, setup)
        per_option[opt.option] = (
            mem
            if n == mem.devices
            else memory_breakdown(spec, setup, seqs, setup.batch, profile, devices=n)
        )
    rows = []
    for i, seq in enumerate(seq_lens):
        fit = {}
        for opt in options:
            m = per_option[opt.option]
            peak = float(m.peak[i])
            cap = opt.gpu.capacity_bytes
            code = int(verdict_codes(peak, cap, usable_fraction))
            usable = int(cap * usable_fraction)
            fit[opt.option] = {
                "verdict": VERDICTS[code],
                "gpu": opt.gpu.id,
                "devices": m.devices,
                "sharding": m.sharding,
                "capacity_bytes": cap,
                "usable_bytes": usable,
                "peak_bytes": _int(peak),
                "allocated_bytes": _int(m.allocated[i]),
                "reserved_bytes": _int(m.reserved[i]),
                "margin_bytes": usable - int(np.ceil(peak)),
                "peak_is_lower_bound": m.peak_is_lower_bound,
            }
            if m is not mem:
                fit[opt.option]["components"] = _components_at(m, i)
        rows.append(
            {
                "seq_len": int(seq),
                "batch": setup.batch,
                "tokens": int(seq) * setup.batch,
                "checkpointing": setup.checkpointing,
                "loss": setup.loss,
                "components": _components_at(mem, i),
                "host_bytes": _int(mem.host[i]),
                "peak_bytes": _int(mem.peak[i]),
                "allocated_bytes": _int(mem.allocated[i]),
                "reserved_bytes": _int(mem.reserved[i]),
                "peak_is_lower_bound": mem.peak_is_lower_bound,
                "not_computable": dict(mem.not_computable),
                "devices": mem.devices,
                "sharding": mem.sharding,
                "flops_per_step": None,
                "fit": fit,
            }
        )
    return rows, mem


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
    setups: dict[tuple[str, str], TrainingSetup],
    profile: Profile,
    options: dict[str, GpuOption],
) -> Calibration | None:
    """FLOPs per row; `time` and `cost` per row and GPU option (estimator.pricing)."""
    cal = None
    if request.calibration is not None:
        c = request.calibration
        cal = calibrate(
            spec,
            next(iter(setups.values())),
            c.gpu,
            c.seq_len,
            c.batch,
            profile,
            step_seconds=c.step_seconds,
            tokens_per_second=c.tokens_per_second,
            source="calibration in the request",
        )
    for row in rows:
        setup = setups[(row["checkpointing"], row["loss"])]
        row["flops_per_step"] = step_flops(spec, setup, row["seq_len"], row["batch"]).total
        tokens = _tokens_for(spec, request, row["seq_len"])
        for option, fit in row["fit"].items():
            efficiency = source = None
            if cal is not None:
                efficiency = cal.efficiency_on(fit["gpu"], profile)
                source = f"calibrated: {cal.tokens_per_second:.4g} tokens/s on {cal.gpu_option}"
            cell = row_time_and_cost(
                spec,
                setup,
                row["seq_len"],
                row["batch"],
                option,
                profile,
                tokens=tokens,
                prices=request.prices,
                host_bytes=row["host_bytes"] or 0,
                fits=fit["verdict"] == "fits",
                efficiency=efficiency,
                efficiency_source=source,
                gpu=options[option].gpu,
                count=fit["devices"],
            )
            fit["time"], fit["cost"] = cell["time"], cell["cost"]
            if cal is not None:
                fit["time"]["measured"] = cal.is_measured(option, row["seq_len"], row["batch"])
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
    by_key: dict[tuple[str, str], TrainingSetup] = {}
    for setup in setups:
        TrainingSetup.model_validate(setup.model_dump())  # overrides re-validated
        by_key[(setup.checkpointing, setup.loss)] = setup
        setup_rows, mem = estimate_rows(
            spec, setup, request.seq_lens, options, request.usable_fraction, profile
        )
        rows += setup_rows
    assert mem is not None
    rows.sort(key=lambda r: r["seq_len"])
    cal = add_time_and_cost(spec, request, rows, by_key, profile, {o.option: o for o in options})
    longest = max(request.seq_lens)
    base = setups[0]
    base_row = next(
        r
        for r in rows
        if r["seq_len"] == longest
        and (r["checkpointing"], r["loss"]) == (base.checkpointing, base.loss)
    )
    training = training_summary(
        spec,
        base,
        {o: {**f, "fits": f["verdict"] == "fits"} for o, f in base_row["fit"].items()},
        _tokens_for(spec, request, longest),
        seq_len=longest,
        batch=base.batch,
        verdicts={o: f["verdict"] for o, f in base_row["fit"].items()},
    )
    extra: dict[str, Any] = {"training": training}
    if cal is not None:
        extra["calibration"] = cal.as_dict()
    if request.dataset_lengths is not None:
        extra["dataset"] = seq_len_report(
            request.dataset_lengths, request.seq_lens, request.overflow
        )
    return {
        "schema": SCHEMA,
        "model": model_summary(spec, request.setup, mem, profile),
        "setup": request.setup.model_dump(),
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
        "assumptions": profile.as_dict(),
    }
