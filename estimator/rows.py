"""Memory rows of the estimate document: per sequence length, the components (bytes, per
device) and a verdict per GPU option; and the model summary at its head."""

from __future__ import annotations

from typing import Any

import numpy as np

from estimator.fit import VERDICTS, verdict_codes
from estimator.gpu_options import GpuOption, devices_for
from estimator.memory import memory_breakdown
from estimator.memory.model import COMPONENTS, MemoryBreakdown
from estimator.profile import Profile
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec


def _int(value: Any) -> int | None:
    return None if value is None else int(np.ceil(float(value)))


def _components_at(mem: MemoryBreakdown, i: int) -> dict[str, int | None]:
    return {
        name: _int(None if mem.components[name] is None else mem.components[name][i])
        for name in COMPONENTS
    }


def _phases_at(mem: MemoryBreakdown, i: int) -> dict[str, dict[str, int]]:
    """Each moment of the step (memory/model.py `_phases`) by part, bytes without the overhead
    and the allocator's slack; the largest is `peak_phase`."""
    out: dict[str, dict[str, int]] = {}
    for moment, parts in mem.phases.items():
        out[moment] = {
            name: int(np.ceil(float(np.broadcast_to(v, np.shape(mem.peak))[i])))
            for name, v in parts.items()
        }
    return out


def _peak_phase(phases: dict[str, dict[str, int]]) -> str | None:
    return max(phases, key=lambda m: sum(phases[m].values())) if phases else None


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
    # a --parallel layout needs its card count: the first option's (estimator/parallel/)
    first = devices_for(options[0], setup) if options and setup.parallel else None
    mem = memory_breakdown(spec, setup, seqs, setup.batch, profile, devices=first)
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
        phases = _phases_at(mem, i)
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
                phases_here = _phases_at(m, i)
                fit[opt.option]["phases"] = phases_here
                fit[opt.option]["peak_phase"] = _peak_phase(phases_here)
        rows.append(
            {
                "seq_len": int(seq),
                "batch": setup.batch,
                "tokens": int(seq) * setup.batch,
                "checkpointing": setup.checkpointing,
                "loss": setup.loss,
                "components": _components_at(mem, i),
                "phases": phases,
                "peak_phase": _peak_phase(phases),
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
