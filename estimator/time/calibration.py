"""Calibration: turn one measured step time (or tokens/s) into an achieved efficiency, then
re-price every other option from it.

The measured step is taken apart with the same model `estimator.time.step` uses to put it
together: step = max(compute, memory) + exposed offload + exposed communication, so
compute = step - offload - communication, and efficiency = executed FLOPs / (compute x peak).
The efficiency is then divided by the profile's per-GPU scale of the measured card and
multiplied by the scale of each other card. Figures for the measured configuration are marked
`measured`; everything else is `extrapolated` (same efficiency assumed on other cards, lengths
and batches).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from estimator.errors import EstimatorInputError
from estimator.profile import Profile
from estimator.scenario import Scenario
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec
from estimator.time.step import step_time


@dataclass(frozen=True)
class Calibration:
    """An efficiency derived from a measurement on one configuration."""

    gpu_option: str
    gpu_id: str
    count: int
    seq_len: int
    batch: int
    method: str
    step_seconds: float
    tokens_per_second: float
    efficiency: float  # achieved on the measured card
    base_efficiency: float  # divided by the profile's per-GPU scale of that card
    source: str

    def efficiency_on(self, gpu_id: str, profile: Profile) -> float:
        """Efficiency assumed on another card: base x that card's per-GPU scale."""
        return self.base_efficiency * _scale(profile, gpu_id)

    def is_measured(self, gpu_option: str, seq_len: int, batch: int) -> bool:
        return (
            _normal_option(gpu_option) == _normal_option(self.gpu_option)
            and seq_len == self.seq_len
            and batch == self.batch
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu_option,
            "seq_len": self.seq_len,
            "batch": self.batch,
            "method": self.method,
            "step_seconds": self.step_seconds,
            "tokens_per_second": self.tokens_per_second,
            "efficiency": self.efficiency,
            "base_efficiency": self.base_efficiency,
            "source": self.source,
        }


def _scale(profile: Profile, gpu_id: str) -> float:
    try:
        scales = profile.get("time", "efficiency_scale_by_gpu")
    except KeyError:
        return 1.0
    return float(scales.get(gpu_id, 1.0))


def _normal_option(option: str) -> str:
    from estimator.gpu_options import resolve_gpu_option

    gpu, count = resolve_gpu_option(option)
    return f"{count}x{gpu.id}"


def calibrate(
    sc: Scenario,
    *,
    step_seconds: float | None = None,
    tokens_per_second: float | None = None,
    host_bytes: int = 0,
    source: str = "measured",
) -> Calibration:
    """Efficiency that reproduces a measured step time (or tokens/s, all cards together) for
    one configuration: the scenario's `seq_len` x `batch` on its GPU `option`. Raises
    EstimatorInputError when the measurement is faster than the model's memory/offload/
    communication floor (nothing left to attribute to compute) or when a rate the inversion
    needs is unknown."""
    from estimator.gpu_options import resolve_gpu_option

    if (step_seconds is None) == (tokens_per_second is None):
        raise EstimatorInputError("calibrate", "give step_seconds or tokens_per_second")
    gpu, count = resolve_gpu_option(sc.option)
    sc = sc.at(gpu=gpu, count=count)
    # any efficiency gives the non-compute terms; they do not depend on it
    probe = step_time(sc, host_bytes=host_bytes, efficiency=1.0, efficiency_source="probe")
    if step_seconds is None:
        assert tokens_per_second is not None
        if tokens_per_second <= 0:
            raise EstimatorInputError("calibrate.tokens_per_second", "must be positive")
        step_seconds = probe.tokens_per_step / tokens_per_second
    if step_seconds <= 0:
        raise EstimatorInputError("calibrate.step_seconds", "must be positive")
    if probe.unknown or probe.peak_flops is None:
        raise EstimatorInputError("calibrate.gpu", "; ".join(probe.unknown) or "unknown peak")
    compute = step_seconds - (probe.offload_seconds or 0.0) - (probe.comm_seconds or 0.0)
    if compute <= 0 or compute <= (probe.memory_seconds or 0.0):
        raise EstimatorInputError(
            "calibrate.step_seconds",
            f"{step_seconds:.4g} s is at or below the modelled memory/offload/communication floor"
            f" ({step_seconds - compute:.4g} s + memory {probe.memory_seconds or 0:.4g} s):"
            " the measurement does not determine a compute efficiency",
        )
    efficiency = probe.flops.total / (compute * probe.peak_flops)
    if efficiency > 1:
        raise EstimatorInputError(
            "calibrate.step_seconds",
            f"{step_seconds:.4g} s implies {efficiency:.0%} of {gpu.id}'s peak: check the "
            "configuration (seq_len, batch, method, GPU) of the measurement",
        )
    return Calibration(
        gpu_option=sc.option,
        gpu_id=gpu.id,
        count=count,
        seq_len=sc.seq_len,
        batch=sc.batch,
        method=sc.setup.method,
        step_seconds=step_seconds,
        tokens_per_second=probe.tokens_per_step / step_seconds,
        efficiency=efficiency,
        base_efficiency=efficiency / _scale(sc.profile, gpu.id),
        source=source,
    )


def efficiency_from_throughput(
    sc: Scenario, tokens_per_second: float, *, host_bytes: int = 0
) -> float:
    """The efficiency on the scenario's GPU option that reproduces a published tokens/s (all
    cards)."""
    return calibrate(sc, tokens_per_second=tokens_per_second, host_bytes=host_bytes).efficiency


def _measured_step(steps: Sequence[Any], field: str) -> float:
    """Median step time, the first step dropped when there are more than two (warm-up:
    allocator growth, autotuning, compilation)."""
    values = []
    for i, v in enumerate(steps):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise EstimatorInputError(f"{field}[{i}]", f"{v!r} is not a positive step time")
        values.append(float(v))
    if not values:
        raise EstimatorInputError(field, "no step times")
    import statistics  # (it imports fractions and decimal: only when calibrating)

    return statistics.median(values[1:] if len(values) > 2 else values)


def gpu_from_name(name: str) -> str:
    """Catalog id for a driver's GPU name ("NVIDIA H200", "NVIDIA A100-SXM4-80GB"): the catalog
    entry whose id, alias or name matches best; EstimatorInputError when none does."""
    from gpu_catalog import get_gpu, list_gpus

    text = name.lower().replace("nvidia", "").strip()
    candidates = [text, text.replace(" ", "-"), text.replace(" ", "")]
    for c in candidates:
        try:
            return get_gpu(c).id
        except ValueError:
            pass
    tokens = [t for t in text.replace("-", " ").replace("_", " ").split() if t]
    best: tuple[int, str] | None = None
    for gpu in list_gpus():
        words = set(f"{gpu.id} {gpu.name}".lower().replace("-", " ").split())
        label_mem = f"{round(gpu.memory_marketed_gb)}gb"
        score = sum(1 for t in tokens if t in words or t == label_mem)
        if tokens and tokens[0] in words and (best is None or score > best[0]):
            best = (score, gpu.id)
    if best is None:
        raise EstimatorInputError("environment.gpu_name", f"{name!r} matches no catalog GPU")
    return best[1]


def calibrate_from_memtest(
    doc: Mapping[str, Any],
    profile: Profile,
    *,
    spec: ModelSpec | None = None,
    setup: TrainingSetup | None = None,
    gpu_option: str | None = None,
    host_bytes_by_seq: Mapping[int, int] | None = None,
) -> list[Calibration]:
    """One Calibration per `ok` result of a `trainfit.memtest/1` document (seq_len, batch,
    median of `step_seconds`). The model comes from `model.config`, the setup from `setup`,
    the GPU from `environment.gpu_name` (times `environment.gpu_count`), unless given."""
    from estimator.architectures import spec_from_config

    if doc.get("schema") != "trainfit.memtest/1":
        raise EstimatorInputError(
            "memtest.schema", f"expected 'trainfit.memtest/1', got {doc.get('schema')!r}"
        )
    env = doc.get("environment") or {}
    if env.get("device") not in (None, "cuda"):
        raise EstimatorInputError(
            "memtest.environment.device",
            f"a {env.get('device')!r} run has no GPU step times to calibrate from",
        )
    if spec is None:
        config = (doc.get("model") or {}).get("config")
        if not isinstance(config, dict):
            raise EstimatorInputError("memtest.model.config", "missing: pass the spec")
        spec = spec_from_config(config)
    if setup is None:
        raw = doc.get("setup") or {}
        try:
            setup = TrainingSetup.model_validate(raw)
        except ValueError as exc:
            raise EstimatorInputError("memtest.setup", str(exc)) from None
    if gpu_option is None:
        name = env.get("gpu_name")
        if not isinstance(name, str):
            raise EstimatorInputError("memtest.environment.gpu_name", "missing: pass the GPU")
        count = env.get("gpu_count") or 1
        gpu_option = f"{int(count)}x{gpu_from_name(name)}"
    out: list[Calibration] = []
    for i, result in enumerate(doc.get("results") or []):
        if result.get("status") != "ok" or not result.get("step_seconds"):
            continue
        seq, batch = int(result["seq_len"]), int(result.get("batch") or setup.batch)
        step = _measured_step(result["step_seconds"], f"memtest.results[{i}].step_seconds")
        host = (host_bytes_by_seq or {}).get(seq, 0)
        out.append(
            calibrate(
                Scenario(spec, setup, profile, seq_len=seq, batch=batch, option=gpu_option),
                step_seconds=step,
                host_bytes=host,
                source=f"memtest results[{i}]",
            )
        )
    if not out:
        raise EstimatorInputError("memtest.results", "no result with status 'ok' and step times")
    return out


def recalibrated_rows(
    sc: Scenario,
    options: Sequence[str],
    seq_lens: Sequence[int],
    *,
    tokens: float | None = None,
    host_bytes_by_seq: Mapping[int, int] | None = None,
    fits: Mapping[tuple[str, int], bool] | None = None,
) -> list[dict[str, Any]]:
    """Every (option, seq_len) re-priced with the scenario's calibrated efficiency, each row
    marked `measured` (the calibrated configuration) or `extrapolated`."""
    from estimator.time.plan import row_time_and_cost

    calibration = sc.calibration
    if calibration is None:
        raise EstimatorInputError("calibration", "recalibrated rows need a calibration")
    rows = []
    for option in options:
        on = sc.on(option)
        eff = calibration.efficiency_on(on.require_gpu().id, sc.profile)
        for seq in seq_lens:
            row = row_time_and_cost(
                on.at(seq_len=seq),
                tokens=tokens,
                host_bytes=(host_bytes_by_seq or {}).get(seq, 0),
                fits=(fits or {}).get((option, seq), True),
                efficiency=eff,
                efficiency_source=(
                    f"calibrated: {calibration.source} on {calibration.gpu_option} at seq "
                    f"{calibration.seq_len} ({calibration.tokens_per_second:.4g} tokens/s)"
                ),
            )
            measured = calibration.is_measured(option, seq, sc.batch)
            row.update(
                {"gpu": option, "seq_len": seq, "basis": "measured" if measured else "extrapolated"}
            )
            rows.append(row)
    return rows


def parse_calibrate_option(value: str) -> dict[str, Any]:
    """`--calibrate gpu=a100-80gb,seq=6750,batch=1,tokens_per_second=221` (or
    `step_seconds=30.5`) -> keyword arguments of `estimator.time.calibration.calibrate`; a path
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


__all__ = [
    "Calibration",
    "calibrate",
    "calibrate_from_memtest",
    "efficiency_from_throughput",
    "gpu_from_name",
    "recalibrated_rows",
]
