"""Memory rows of the estimate document: per sequence length, the components (bytes, per
device) and a verdict per GPU option; and the model summary at its head."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from estimator import lazy_numpy as np
from estimator.dict_display import row_dict
from estimator.fit import VERDICTS, verdict_code_list
from estimator.gpu_options import GpuOption, devices_for
from estimator.lora import PEFT_DEFAULT, peft_default_targets, peft_model_type, unmatched_targets
from estimator.memo import Memo
from estimator.memory import memory_breakdown
from estimator.memory.model import (
    COMPONENTS,
    MemoryBreakdown,
    card_loss_target,
    loss_depends_on_card,
    memory_on_card,
)
from estimator.profile import Profile
from estimator.spec import ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup


def _ints(values: Any, shape: tuple[int, ...]) -> list[int]:
    """Whole bytes (rounded up) of an array broadcast to `shape`, as Python ints."""
    if type(values) is not np.ndarray or values.ndim == 0:  # one figure for every row
        return [math.ceil(float(values))] * shape[0]
    up = np.ceil(values)
    if up.shape != shape:
        up = np.broadcast_to(up, shape)
    return list(map(int, up.tolist()))


def _int(value: Any) -> int:
    """`_ints` of one row: whole bytes, rounded up, of a scalar."""
    if type(value) is float:  # the one-length case (estimator/lazy_numpy.py)
        return math.ceil(value)
    if type(value) is np.ndarray and value.ndim:
        return _ints(value, (1,))[0]
    return math.ceil(float(value))


class _Columns:
    """One memory breakdown's figures per row, rounded up to whole bytes (`_ints`) once for all
    rows, as plain Python values; each row's phases and its peak phase computed once."""

    def __init__(self, mem: MemoryBreakdown, rows: int) -> None:
        if rows == 1 and type(mem.peak) is not np.ndarray:  # one length: no columns to cut
            self._one(mem)
            return
        shape = (rows,)
        peak = mem.peak
        if type(peak) is not np.ndarray or peak.ndim == 0:
            self.peak = [float(peak)] * rows
        else:
            self.peak = (peak if peak.shape == shape else np.broadcast_to(peak, shape)).tolist()
        if not self._all_at_once(mem, shape):
            self._column_by_column(mem, shape)

    def _all_at_once(self, mem: MemoryBreakdown, shape: tuple[int, ...]) -> bool:
        """`_column_by_column`'s figures from one array of every column rounded up at once
        (`_ints`' values: a whole float64 below 2**53 is the same int either way), each row's
        peak phase from the columns' int64 sums (exact below 2**53 per part; `argmax` takes
        the first of equal sums, as `_peak_phase`). False, nothing set, where a figure is not
        finite or not below 2**53 (then `_ints`' way: int() of it, or its error)."""
        comps = mem.components
        if any(comps[name] is None for name in COMPONENTS) or not mem.phases:
            return False
        values = [mem.allocated, mem.reserved, mem.host, mem.peak]
        values += [comps[name] for name in COMPONENTS]
        spans = []  # each moment's (parts, first row, end row) in `up`
        for parts in mem.phases.values():
            spans.append((tuple(parts), len(values), len(values) + len(parts)))
            values += parts.values()
        up = np.empty((len(values), shape[0]))
        for i, v in enumerate(values):
            up[i] = v  # broadcast: a figure the same for every row is one float
        up = np.ceil(up)
        if not bool((np.abs(up) < 2.0**53).all()):  # NaN and inf fail too
            return False
        ints = up.astype(np.int64)
        self.allocated, self.reserved, self.host, self.peak_bytes = ints[:4].tolist()
        end = 4 + len(COMPONENTS)
        component_dict = row_dict(COMPONENTS)
        self.components = [component_dict(row) for row in ints[4:end].T.tolist()]
        moments = [list(map(row_dict(parts), ints[a:b].T.tolist())) for parts, a, b in spans]
        names = tuple(mem.phases)
        self.phases = list(map(row_dict(names), zip(*moments, strict=True)))
        totals = np.stack([ints[a:b].sum(axis=0) for _, a, b in spans])
        self.peak_phase = [names[i] for i in totals.argmax(axis=0).tolist()]
        return True

    def _column_by_column(self, mem: MemoryBreakdown, shape: tuple[int, ...]) -> None:
        rows = shape[0]
        self.peak_bytes = _ints(mem.peak, shape)
        self.allocated = _ints(mem.allocated, shape)
        self.reserved = _ints(mem.reserved, shape)
        self.host = _ints(mem.host, shape)
        comps = mem.components
        columns = [
            [None] * rows if comps[name] is None else _ints(comps[name], shape)
            for name in COMPONENTS
        ]
        self.components = [
            dict(zip(COMPONENTS, row, strict=True)) for row in zip(*columns, strict=True)
        ]
        # each moment's parts, row by row, then the moments of each row
        moments = [
            [dict(zip(parts, row, strict=True)) for row in _rows_of(parts, shape)]
            for parts in mem.phases.values()
        ]
        names = list(mem.phases)
        self.phases = [dict(zip(names, row, strict=True)) for row in zip(*moments, strict=True)]
        self.peak_phase = [_peak_phase(p) for p in self.phases]

    def _one(self, mem: MemoryBreakdown) -> None:
        """The same figures for one row of scalars (numpy's 0-d arrays included); the peak
        phase found as the phases are rounded (`_peak_phase`'s rule)."""
        self.peak = [float(mem.peak)]
        self.peak_bytes = [_int(mem.peak)]
        self.allocated = [_int(mem.allocated)]
        self.reserved = [_int(mem.reserved)]
        self.host = [_int(mem.host)]
        ceil = math.ceil  # `_int` of a Python float, the usual value (estimator/lazy_numpy.py)
        comps = mem.components
        rounded = [
            v if v is None else ceil(v) if type(v) is float else _int(v)
            for v in map(comps.__getitem__, COMPONENTS)
        ]
        self.components = [_COMPONENT_DICT(rounded)]
        phases: dict[str, dict[str, int]] = {}
        best, top = None, None
        for moment, parts in mem.phases.items():
            whole = {name: ceil(v) if type(v) is float else _int(v) for name, v in parts.items()}
            phases[moment] = whole
            total = sum(whole.values())
            if top is None or total > top:
                best, top = moment, total
        self.phases = [phases]
        self.peak_phase = [best]


_COMPONENT_DICT = row_dict(COMPONENTS)


def _rows_of(parts: dict[str, Any], shape: tuple[int, ...]) -> Any:
    """The values of `parts` (name -> bytes over the rows) row by row, whole bytes (`_ints`);
    as many rows as `shape` says even with no parts."""
    if not parts:
        return [()] * shape[0]
    return zip(*(_ints(v, shape) for v in parts.values()), strict=True)


def _fit_entries(
    head: tuple[str, int, str, int, int],
    lower: bool,
    col: _Columns,
    codes: list[int],
    own: bool,
) -> list[dict[str, Any]]:
    """One GPU option's fit entry per row: `head` = (GPU id, devices, sharding, capacity,
    usable bytes), `lower` whether the peak is a lower bound, `col` the rows of its card
    count's breakdown, `codes` its verdicts; `own`: the breakdown's parts too (shared)."""
    gpu_id, devices, sharding, cap, usable = head
    entries = [
        {
            "verdict": VERDICTS[code],
            "gpu": gpu_id,
            "devices": devices,
            "sharding": sharding,
            "capacity_bytes": cap,
            "usable_bytes": usable,
            "peak_bytes": peak_bytes,
            "allocated_bytes": allocated,
            "reserved_bytes": reserved,
            "margin_bytes": usable - peak_bytes,
            "peak_is_lower_bound": lower,
        }
        for code, peak_bytes, allocated, reserved in zip(
            codes, col.peak_bytes, col.allocated, col.reserved, strict=True
        )
    ]
    if own:
        parts = zip(entries, col.components, col.phases, col.peak_phase, strict=True)
        for entry, components, phases, peak_phase in parts:
            entry["components"] = components
            entry["phases"] = phases
            entry["peak_phase"] = peak_phase
    return entries


def _peak_phase(phases: dict[str, dict[str, int]]) -> str | None:
    """The first moment with the largest sum (max's rule on ties)."""
    best, top = None, None
    for moment, parts in phases.items():
        total = sum(parts.values())
        if top is None or total > top:
            best, top = moment, total
    return best


def model_summary(
    spec: ModelSpec, setup: TrainingSetup, mem: MemoryBreakdown, profile: Profile
) -> dict[str, Any]:
    trainable = mem.states.trainable_params if mem.states else 0
    fixed = _SUMMARIES.call((spec, profile), None, _spec_summary, spec, profile)
    return {  # `fixed`'s key order, `params_trainable` in its place; containers copied
        **fixed,
        "params_trainable": trainable,
        "params_extras": dict(fixed["params_extras"]),
        "layer_types": dict(fixed["layer_types"]),
        "notes": [*fixed["notes"], *_target_notes(spec, setup)],
    }


def _target_notes(spec: ModelSpec, setup: TrainingSetup) -> list[str]:
    """What `peft-default` resolved to for this model (estimator.lora.peft_default_targets),
    so the document names the modules it priced; target names the model lacks, which peft
    leaves out (estimator.lora.unmatched_targets)."""
    if not setup.is_adapter:
        return []
    if setup.lora_targets != [PEFT_DEFAULT]:
        unmatched = unmatched_targets(spec, setup)
        if not unmatched:
            return []
        return [
            f"lora_targets {', '.join(unmatched)}: no such module in {spec.model_type}; peft "
            "leaves them out while another target matches (peft 0.22.0 "
            "tuners/tuners_utils.py:1100-1120), and so does this estimate"
        ]
    names = ", ".join(peft_default_targets(spec))
    model_type = peft_model_type(spec)
    return [f"lora_targets peft-default: {names} (peft's targets for model_type {model_type!r})"]


def _spec_summary(spec: ModelSpec, profile: Profile) -> dict[str, Any]:
    """What the model summary says that depends on the spec and the profile alone."""
    from estimator.memory.weights import counted_params

    return {
        "name": spec.name,
        "model_type": spec.model_type,
        "params_total": spec.params_total,
        "params_active": spec.params_active,
        "params_trainable": None,
        "params_in_weights": counted_params(spec, profile),
        "params_extras": {g.name: g.params for g in spec.extras},
        "geometry_known": spec.geometry_known,
        "layers": spec.layers,
        "hidden": spec.hidden,
        "vocab": spec.vocab,
        "layer_types": {t: spec.count_layers(t) for t in sorted(set(spec.layer_types))},
        "notes": list(spec.notes),
    }


_SUMMARIES: Memo[dict[str, Any]] = Memo()


def estimate_rows(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq_lens: list[int],
    options: list[GpuOption],
    usable_fraction: float,
    profile: Profile,
    skey: tuple[Any, ...] | None = None,
) -> tuple[list[dict[str, Any]], MemoryBreakdown]:
    """`skey`: `setup_key(setup)` when the caller has it."""
    # one length: numpy scalars, several times faster than one-element arrays (same values)
    seqs: Any = np.asarray(seq_lens, dtype=np.float64) if len(seq_lens) > 1 else float(seq_lens[0])
    # a --parallel layout needs its card count: the first option's (estimator/parallel/)
    first = devices_for(options[0], setup) if options and setup.parallel else None
    mem = memory_breakdown(spec, setup, seqs, setup.batch, profile, first, skey)
    # one evaluation per card count, not per option; and per card size where the memory
    # depends on it (Unsloth's loss: `loss_depends_on_card`), the rows' own figures then
    # those without a card
    by_card = loss_depends_on_card(setup)
    by_devices: dict[tuple[int, float | None], MemoryBreakdown] = {(mem.devices, None): mem}
    per_option: dict[str, MemoryBreakdown] = {}
    for opt in options:
        n = devices_for(opt, setup)
        cap = opt.gpu.capacity_bytes
        target = card_loss_target(spec, setup, profile, n, cap, skey) if by_card else None
        if (n, target) not in by_devices:
            by_devices[(n, target)] = (
                memory_breakdown(spec, setup, seqs, setup.batch, profile, n, skey)
                if target is None
                else memory_on_card(spec, setup, seqs, setup.batch, profile, n, cap)
            )
        per_option[opt.option] = by_devices[(n, target)]
    size = len(seq_lens)
    columns = {id(m): _Columns(m, size) for m in by_devices.values()}
    base = columns[id(mem)]
    # each option's fit entry per row, made option by option from its `_Columns`; an option on
    # another card count than the row's (or on a card small enough to change Unsloth's loss)
    # carries that breakdown's parts: the row's dicts of its `_Columns`, one set per breakdown,
    # shared by the options of it (equal figures; the document is read, not edited, by its
    # consumers)
    per = []
    for opt in options:
        m = per_option[opt.option]
        cap = opt.gpu.capacity_bytes
        head = (opt.gpu.id, m.devices, m.sharding, cap, int(cap * usable_fraction))
        col = columns[id(m)]
        codes = verdict_code_list(col.peak, cap, usable_fraction)
        per.append(
            (opt.option, _fit_entries(head, m.peak_is_lower_bound, col, codes, m is not mem))
        )
    batch, checkpointing, loss = setup.batch, setup.checkpointing, setup.loss
    lower_bound = mem.peak_is_lower_bound
    rows = []
    for i, seq in enumerate(seq_lens):
        fit = {option: entries[i] for option, entries in per}
        seq = int(seq)
        rows.append(
            {
                "seq_len": seq,
                "batch": batch,
                "tokens": seq * batch,
                "checkpointing": checkpointing,
                "loss": loss,
                "components": base.components[i],  # built for this row alone (_Columns)
                "phases": base.phases[i],
                "peak_phase": base.peak_phase[i],
                "host_bytes": base.host[i],
                "peak_bytes": base.peak_bytes[i],
                "allocated_bytes": base.allocated[i],
                "reserved_bytes": base.reserved[i],
                "peak_is_lower_bound": lower_bound,
                "not_computable": dict(mem.not_computable),
                "devices": mem.devices,
                "sharding": mem.sharding,
                "flops_per_step": None,
                "fit": fit,
            }
        )
    return rows, mem
