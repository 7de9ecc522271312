"""Turn estimate documents into what the pages show: the seed-000 fit table, the memory chart
and the time/cost options. Numbers come from the library's documents; this only arranges them
and converts bytes to GiB (2^30) for display."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.services.charts import Bar, ChartSpec, Group, RefLine

GIB = 2**30
COMPONENTS = ("weights", "trainable_states", "checkpoints", "recompute_peak", "logits", "overhead")
CHECKPOINTING_LABELS = {
    "offload": "CPU offload",
    "gpu": "on the GPU",
    "none": "none (all activations kept)",
}
LOSS_LABELS = {"chunked": "chunked", "full": "full logits"}
VERDICT_ORDER = {"fits": 0, "tight": 1, "no": 2}


def gib(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value / GIB:,.{digits}f}"


@dataclass(frozen=True)
class Variant:
    """One estimate request of the page (the form may ask for several checkpointing/loss
    combinations, as the seed's table does) and its document."""

    checkpointing: str
    loss: str
    request: dict[str, Any]
    document: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{CHECKPOINTING_LABELS.get(self.checkpointing, self.checkpointing)}, " + (
            LOSS_LABELS.get(self.loss, self.loss)
        )

    @property
    def request_json(self) -> str:
        return json.dumps(self.request, sort_keys=True)

    @property
    def short_label(self) -> str:
        return f"{self.checkpointing}/{self.loss}"


@dataclass(frozen=True)
class FitCell:
    gpu: str
    verdict: str
    peak_bytes: int | None
    usable_bytes: int | None
    capacity_bytes: int | None
    margin_bytes: int | None


@dataclass(frozen=True)
class FitRow:
    seq_len: int
    checkpointing: str
    loss: str
    peak_bytes: int
    host_bytes: int | None
    cells: list[FitCell]


@dataclass(frozen=True)
class GpuColumn:
    id: str
    capacity_bytes: int | None
    usable_bytes: int | None


@dataclass
class FitTable:
    gpus: list[GpuColumn]
    rows: list[FitRow] = field(default_factory=list)


def gpu_ids(variants: list[Variant]) -> list[str]:
    ids: list[str] = []
    for v in variants:
        for row in v.document.get("rows", []):
            for gpu in row.get("fit", {}):
                if gpu not in ids:
                    ids.append(gpu)
    return ids


def fit_table(variants: list[Variant]) -> FitTable:
    ids = gpu_ids(variants)
    columns: dict[str, GpuColumn] = {}
    for v in variants:
        for row in v.document.get("rows", []):
            for gpu, fit in row.get("fit", {}).items():
                columns.setdefault(
                    gpu, GpuColumn(gpu, fit.get("capacity_bytes"), fit.get("usable_bytes"))
                )
    table = FitTable(gpus=[columns[g] for g in ids])
    seqs = sorted({row["seq_len"] for v in variants for row in v.document.get("rows", [])})
    for seq in seqs:
        for v in variants:
            for row in v.document.get("rows", []):
                if row["seq_len"] != seq:
                    continue
                cells = []
                for gpu in ids:
                    fit = row.get("fit", {}).get(gpu, {})
                    cells.append(
                        FitCell(
                            gpu=gpu,
                            verdict=str(fit.get("verdict", "–")),
                            peak_bytes=fit.get("peak_bytes", row.get("peak_bytes")),
                            usable_bytes=fit.get("usable_bytes"),
                            capacity_bytes=fit.get("capacity_bytes"),
                            margin_bytes=fit.get("margin_bytes"),
                        )
                    )
                table.rows.append(
                    FitRow(
                        seq_len=seq,
                        checkpointing=v.checkpointing,
                        loss=v.loss,
                        peak_bytes=int(row.get("peak_bytes", 0)),
                        host_bytes=row.get("host_bytes"),
                        cells=cells,
                    )
                )
    return table


PHASE_LABELS = {
    "loss": "loss (forward end)",
    "backward": "backward",
    "step": "optimizer step",
    "all": "all components at once",
}


def _phase_bar(label: str, where: dict[str, Any], kind: str) -> Bar:
    """One bar: the peak moment's parts + overhead + allocator slack, which add up to
    `peak_bytes`; the other moments go to the tooltip. Labelled with the peak as the fit table
    prints it."""
    phases: dict[str, dict[str, int]] = where.get("phases") or {}
    peak_phase = where.get("peak_phase")
    comps = where.get("components", {})
    if peak_phase in phases:
        parts = list(phases[peak_phase].items())
    else:  # a document without phases: the components as they are
        parts = [(c, comps.get(c) or 0) for c in COMPONENTS if c != "overhead"]
    parts.append(("overhead", comps.get("overhead") or 0))
    slack = (where.get("reserved_bytes") or 0) - (where.get("allocated_bytes") or 0)
    if slack > 0:
        parts.append(("allocator_slack", slack))
    others = [
        f"{PHASE_LABELS.get(name, name)}: {gib(sum(p.values()) + (comps.get('overhead') or 0))} GiB"
        for name, p in phases.items()
        if name != peak_phase
    ]
    hover = f"peak at {PHASE_LABELS.get(str(peak_phase), peak_phase)}" if peak_phase else ""
    if others:
        hover += "; other moments of the step: " + "; ".join(others)
    return Bar(
        label=label,
        segments=[(name, value / GIB) for name, value in parts],
        value_label=f"{gib(where.get('peak_bytes'))} GiB",
        hover=hover,
        kind=kind,
    )


def memory_chart(variants: list[Variant]) -> ChartSpec:
    """One bar per option (checkpointing x loss, and per multi-GPU option whose per-card
    memory differs), grouped by sequence length; usable (dashed) and capacity (solid) lines
    per GPU."""
    seqs = sorted({row["seq_len"] for v in variants for row in v.document.get("rows", [])})
    groups = []
    for seq in seqs:
        bars = []
        for v in variants:
            for row in v.document.get("rows", []):
                if row["seq_len"] != seq:
                    continue
                phase = row.get("peak_phase")
                suffix = f" (peak: {PHASE_LABELS.get(phase, phase)})" if phase else ""
                bars.append(_phase_bar(v.label + suffix, row, "option"))
                for gpu, fit in row.get("fit", {}).items():
                    if "components" in fit:
                        where = {**fit, "components": fit["components"]}
                        bars.append(
                            _phase_bar(f"{v.label}, {gpu}: per card", where, "option per-card")
                        )
        groups.append(Group(label=f"{seq:,} tokens", bars=bars))
    lines: list[RefLine] = []
    for col in fit_table(variants).gpus:
        if col.usable_bytes:
            lines.append(RefLine(f"{col.id} usable", col.usable_bytes / GIB, col.id, True))
        if col.capacity_bytes:
            lines.append(RefLine(f"{col.id} capacity", col.capacity_bytes / GIB, col.id, False))
    return ChartSpec(
        title="Estimated peak memory per device (GiB), each bar split into what is alive at "
        "the peak",
        groups=groups,
        lines=_distinct_lines(lines),
    )


def _distinct_lines(lines: list[RefLine]) -> list[RefLine]:
    """2xh200 and h200 share a card: keep one pair of lines per (value, dashed)."""
    seen: set[tuple[float, bool]] = set()
    out = []
    for line in lines:
        key = (round(line.value, 3), line.dashed)
        if key not in seen:
            seen.add(key)
            out.append(line)
    return out


@dataclass(frozen=True)
class Option:
    """One (variant, GPU) choice with its worst verdict and, when the estimate has them, the
    training time and cost."""

    variant: str
    gpu: str
    verdict: str
    worst_peak_bytes: int | None
    hours: float | None
    cost_usd: float | None
    price_usd_per_hour: float | None


def _number(d: Any, *keys: str) -> float | None:
    if not isinstance(d, dict):
        return None
    for k in keys:
        value = d.get(k)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _training_for(document: dict[str, Any], gpu: str) -> dict[str, Any]:
    training = document.get("training")
    if not isinstance(training, dict):
        return {}
    for container in (training.get("options"), training.get("gpus"), training):
        if isinstance(container, dict) and isinstance(container.get(gpu), dict):
            return dict(container[gpu])
    if isinstance(training.get("options"), list):
        for item in training["options"]:
            if isinstance(item, dict) and item.get("gpu") == gpu:
                return item
    return {}


def options(variants: list[Variant]) -> list[Option]:
    """Cheapest fitting first, then by verdict; options without a cost after those with one."""
    out: list[Option] = []
    for v in variants:
        rows = v.document.get("rows", [])
        for gpu in gpu_ids([v]):
            fits = [r.get("fit", {}).get(gpu, {}) for r in rows]
            verdict = max(
                (str(f.get("verdict", "no")) for f in fits),
                key=lambda s: VERDICT_ORDER.get(s, 3),
                default="no",
            )
            peaks = [f.get("peak_bytes") for f in fits if f.get("peak_bytes") is not None]
            training = _training_for(v.document, gpu)
            out.append(
                Option(
                    variant=v.label,
                    gpu=gpu,
                    verdict=verdict,
                    worst_peak_bytes=max(peaks) if peaks else None,
                    hours=_number(training, "hours", "time_hours", "wall_hours")
                    or _seconds_to_hours(_number(training, "seconds", "time_seconds")),
                    cost_usd=_number(training, "cost_usd", "usd", "cost"),
                    price_usd_per_hour=_number(training, "usd_per_gpu_hour", "price_usd_per_hour"),
                )
            )

    def key(o: Option) -> tuple[int, int, float, str]:
        return (
            0 if o.verdict == "fits" else 1,
            VERDICT_ORDER.get(o.verdict, 3),
            o.cost_usd if o.cost_usd is not None else float("inf"),
            o.gpu,
        )

    return sorted(out, key=key)


def _seconds_to_hours(seconds: float | None) -> float | None:
    return seconds / 3600 if seconds is not None else None


def has_costs(opts: list[Option]) -> bool:
    return any(o.cost_usd is not None or o.hours is not None for o in opts)


@dataclass(frozen=True)
class ComparisonRow:
    seq_len: int
    status: str
    measured_peak_bytes: int | None
    estimated_peak_bytes: int | None
    error_bytes: int | None
    error_pct: float | None


def comparison_rows(comparison: dict[str, Any]) -> list[ComparisonRow]:
    return [
        ComparisonRow(
            seq_len=int(r["seq_len"]),
            status=str(r.get("status", "")),
            measured_peak_bytes=r.get("measured_peak_bytes"),
            estimated_peak_bytes=r.get("estimated_peak_bytes"),
            error_bytes=r.get("error_bytes"),
            error_pct=r.get("error_pct"),
        )
        for r in comparison.get("rows", [])
    ]


def comparison_chart(rows: list[ComparisonRow], total_memory_bytes: int | None) -> ChartSpec:
    groups = [
        Group(
            label=f"{r.seq_len:,} tokens ({r.status})",
            bars=[
                Bar("estimated", [("estimated", (r.estimated_peak_bytes or 0) / GIB)]),
                Bar("measured", [("measured", (r.measured_peak_bytes or 0) / GIB)]),
            ],
        )
        for r in rows
    ]
    lines = [RefLine("GPU total memory", total_memory_bytes / GIB)] if total_memory_bytes else []
    return ChartSpec(title="Peak memory: estimated vs measured (GiB)", groups=groups, lines=lines)
