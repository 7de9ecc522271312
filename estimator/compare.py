"""Estimate vs a measured memtest (`trainfit.memtest/1`), row by row.

The measured figure is `peak_allocated_bytes` (torch's allocator, or the storage tracker on
CPU/fake), which excludes the CUDA context; so the estimate compared is the allocated figure
(`MemoryBreakdown.allocated`), less cuBLAS's workspaces when the memtest ran on a CPU or
traced fake tensors (no cuBLAS there: estimator/memory/workspaces.py). A memtest's setup
without a `stack` is the probe's own loop.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.memory.model import COMPONENTS, memory_on_card
from estimator.memory.workspaces import workspaces_in
from estimator.model_source import resolve_model
from estimator.profile import Profile, load_profile
from estimator.request import ModelInput
from estimator.rows import model_summary
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec


def setup_from_memtest(doc: dict[str, Any]) -> TrainingSetup:
    raw = doc.get("setup")
    if not isinstance(raw, dict):
        raise EstimatorInputError("memtest.setup", "missing or not an object")
    # the probe measures training steps, not an evaluation pass: its results compare with the
    # step's moments (an `eval_batch` a memtest carries does not add its own)
    known = {k: v for k, v in raw.items() if k in TrainingSetup.model_fields and k != "eval_batch"}
    known.setdefault("stack", "probe")  # a memtest measures the probe's own loop
    if known.get("stack") == "hf" and known.get("loss") == "liger":
        # the probe's Trainer ran use_liger_kernel=True (probe/hf_stack.py), which applies
        # Liger's RMSNorm, SwiGLU and RoPE too (estimator/memory/liger.py)
        known.setdefault("liger_kernels", True)
    try:
        return TrainingSetup.model_validate(known)
    except ValueError as err:
        raise EstimatorInputError("memtest.setup", str(err).splitlines()[0]) from None


def _pct(estimated: float, measured: float) -> float | None:
    return None if not measured else round(100.0 * (estimated - measured) / measured, 2)


def _first(value: Any) -> float:
    return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])


def _parts_at_peak(
    mem: Any, comps: dict[str, float | None], devices: int, workspaces: float
) -> dict[str, float]:
    """The estimate in the probe's kinds at the estimated peak moment (probe/tracker.py
    `components_at_peak`: params, grads, optimizer, activations = every other device storage,
    host): gradients count only when alive at that moment (memory/model.py `_phases`), and
    activations are the rest of the allocated peak. Sharded states are split evenly over
    `devices` (as the estimate's per-device figures)."""
    st = mem.states
    n = max(devices, 1)
    params = (comps["weights"] or 0) + st.weights / n
    optimizer = (st.optimizer + st.masters) / n
    grads = st.grads / n
    phases: dict[str, dict[str, Any]] = mem.phases or {}
    if phases:
        moment = max(phases, key=lambda m: sum(_first(v) for v in phases[m].values()))
        parts = phases[moment]
        # `trainable_states` holds the gradients only when they are alive at that moment
        held = _first(parts.get("trainable_states", 0.0)) - (comps["trainable_states"] or 0)
        grads = max(grads + held, 0.0) + _first(parts.get("gradients", 0.0))
    # the tracker counts tensor storages: cuBLAS's `workspaces` are none (memory/workspaces.py)
    allocated = float(mem.allocated[0]) - workspaces
    return {
        "params": params,
        "grads": grads,
        "optimizer": optimizer,
        "activations": max(allocated - params - grads - optimizer, 0.0),
        "host": float(mem.host[0]),
    }


def _outside_allocator(result: dict[str, Any]) -> int | None:
    """Device memory held outside torch's caching allocator (the CUDA context, cuBLAS/cuDNN
    handles, other libraries' own cudaMalloc) after a length on a GPU: CUDA's total - its free
    (`torch.cuda.mem_get_info` after the length) - the reserved peak. At least that much: the
    allocator can hold less than its peak by then (an out-of-memory retry frees cached blocks)."""
    device = result.get("device_memory")
    reserved = result.get("peak_reserved_bytes")
    if not isinstance(device, dict) or reserved is None:
        return None
    total, free_after = device.get("total_bytes"), device.get("free_after_bytes")
    if total is None or free_after is None:
        return None
    return int(total) - int(free_after) - int(reserved)


def compare(doc: dict[str, Any], profile_name: str = "default") -> dict[str, Any]:
    profile = load_profile(profile_name)
    model = doc.get("model") or {}
    config = model.get("config") if isinstance(model, dict) else None
    if not isinstance(config, dict):
        raise EstimatorInputError("memtest.model.config", "missing or not an object")
    spec = resolve_model(ModelInput(config=config, name=model.get("name")))
    setup = setup_from_memtest(doc)
    env = doc.get("environment") or {}
    devices = int(env.get("gpu_count") or 1)
    # the card's total memory, which Unsloth's loss sizes its chunks by (memory.model.on_card)
    total = env.get("total_memory_bytes")
    card = total if env.get("device") == "cuda" and type(total) is int and total > 0 else None
    rows = []
    for result in doc.get("results") or []:
        seq, batch = int(result["seq_len"]), int(result.get("batch") or setup.batch)
        mem = (
            memory_breakdown(spec, setup, [seq], batch, profile, devices=devices)
            if card is None
            else memory_on_card(spec, setup, [seq], batch, profile, devices, card)
        )
        comps = {
            k: (None if mem.components[k] is None else float(mem.components[k][0]))
            for k in COMPONENTS
        }
        # a CPU or fake run has no cuBLAS workspaces to measure (memory/workspaces.py)
        workspaces = workspaces_in(mem.phases)
        no_cublas = 0.0 if env.get("device") == "cuda" else workspaces
        estimated = float(mem.allocated[0]) - no_cublas
        measured = result.get("peak_allocated_bytes")
        row: dict[str, Any] = {
            "seq_len": seq,
            "batch": batch,
            "status": result.get("status"),
            "measured_peak_bytes": measured,
            "measured_reserved_bytes": result.get("peak_reserved_bytes"),
            "estimated_peak_bytes": int(estimated),
            "estimated_components": {k: None if v is None else int(v) for k, v in comps.items()},
            "error_bytes": None if measured is None else int(estimated - measured),
            "error_pct": None if measured is None else _pct(estimated, measured),
        }
        row["estimated_reserved_bytes"] = int(float(mem.reserved[0]) - no_cublas)
        reserved = result.get("peak_reserved_bytes")
        row["reserved_error_pct"] = (
            None if reserved is None else _pct(row["estimated_reserved_bytes"], reserved)
        )
        simulated = result.get("simulated_reserved_bytes")  # cpu/fake, probe --simulate-reserved
        row["simulated_reserved_bytes"] = simulated
        row["simulated_reserved_error_pct"] = (
            None if simulated is None else _pct(row["estimated_reserved_bytes"], simulated)
        )
        row["measured_outside_allocator_bytes"] = _outside_allocator(result)
        row["estimated_outside_allocator_bytes"] = int(comps["overhead"] or 0)
        # in the allocated estimate, outside every component a memtest counts (tensor storages)
        row["estimated_cublas_workspace_bytes"] = int(workspaces - no_cublas)
        # of `logits`, the bytes that are not vocab-wide tensors, by the kind a memtest's
        # component maxima count them as (memory/model.py `MemoryBreakdown.logits_other`)
        row["estimated_logits_other"] = {k: int(_first(v)) for k, v in mem.logits_other.items()}
        if mem.loss_logits is not None:  # the vocab-wide tensors at their own most
            row["estimated_loss_logits"] = int(_first(mem.loss_logits))
        row["estimated_host_bytes"] = int(float(mem.host[0]))
        measured_parts = result.get("components")
        if isinstance(measured_parts, dict) and mem.states is not None:
            est_parts = _parts_at_peak(mem, comps, devices, workspaces)
            row["components_vs_measured"] = {
                k: {
                    "estimated": int(v),
                    "measured": measured_parts.get(k),
                    "error_pct": _pct(v, measured_parts.get(k) or 0),
                }
                for k, v in est_parts.items()
            }
        evaluation = result.get("evaluation")
        if isinstance(evaluation, dict):
            cuda = env.get("device") == "cuda"
            row["evaluation"] = _evaluation_row(
                spec, setup, (seq, devices, cuda), evaluation, profile
            )
        rows.append(row)
    errors = [
        abs(r["error_pct"]) for r in rows if r["error_pct"] is not None and r["status"] == "ok"
    ]
    gpu = card_of(env)
    return {
        "model": model_summary(
            spec, setup, mem if rows else memory_breakdown(spec, setup, [1], 1, profile), profile
        ),
        "profile": profile.name,
        "device": env.get("device"),
        "gpu_name": env.get("gpu_name"),
        "gpu": gpu,
        "rows": rows,
        "median_abs_error_pct": sorted(errors)[len(errors) // 2] if errors else None,
        "max_abs_error_pct": max(errors) if errors else None,
    }


def _evaluation_row(
    spec: ModelSpec,
    setup: TrainingSetup,
    where: tuple[int, int, bool],
    measured: dict[str, Any],
    profile: Profile,
) -> dict[str, Any]:
    """The probe's `Trainer.evaluate()` peak (`results[i].evaluation`, counters reset before
    it) against the estimate's evaluation moment at its rows (memory/evaluation.py), whole:
    weights, states, buckets and the pass's working set (cuBLAS workspaces only on CUDA)."""
    seq, devices, cuda = where
    rows = int(measured["rows"])
    with_eval = setup.model_copy(update={"eval_batch": rows})
    mem = memory_breakdown(spec, with_eval, [seq], setup.batch, profile, devices=devices)
    moment = mem.phases["evaluation"]
    estimated = float(sum(_first(v) for v in moment.values()))
    if not cuda:  # no cuBLAS workspaces on the CPU (memory/workspaces.py)
        estimated -= workspaces_in(mem.phases)
    peak = measured.get("peak_allocated_bytes")
    return {
        "rows": rows,
        "status": measured.get("status"),
        "measured_peak_bytes": peak,
        "estimated_peak_bytes": int(estimated),
        "estimated_working_set_bytes": int(_first(moment["evaluation"])),
        "error_pct": None if peak is None else _pct(estimated, peak),
    }


def card_of(env: dict[str, Any]) -> str | None:
    """The catalog card a CUDA memtest ran on (None for CPU and fake runs, or no match)."""
    from gpu_catalog.lookup import card_for_device

    total = env.get("total_memory_bytes")
    if env.get("device") != "cuda" or not isinstance(total, int):
        return None
    return card_for_device(str(env.get("gpu_name") or ""), total)


def measured_tokens_per_second(result: dict[str, Any]) -> float | None:
    """A length's tokens/s as the probe measured it (its own figure leaves out the warm-up step),
    else from the median step time."""
    tps = result.get("tokens_per_second")
    if isinstance(tps, int | float) and tps > 0:
        return float(tps)
    seconds = [s for s in result.get("step_seconds") or [] if isinstance(s, int | float) and s]
    if not seconds:
        return None
    return int(result["seq_len"]) * int(result.get("batch") or 1) / statistics.median(seconds)
