"""Turn estimate documents into what the pages show: the seed-000 fit table, the memory chart
and the time/cost options. Numbers come from the library's documents; this only arranges them
and converts bytes to GiB (2^30) for display."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.services.charts import Bar, ChartSpec, Group, RefLine
from estimator.objective import batch_unit

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
    "evaluation": "evaluation pass",
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
    """One (variant, GPU option) choice at the longest length with its worst verdict and, when
    the estimate has them, the training time and cost; `missing` says why a figure is not
    there."""

    variant: str
    variant_index: int
    gpu: str
    cards: int
    verdict: str
    worst_peak_bytes: int | None
    seq_len: int | None
    tokens_per_second: float | None
    hours: float | None
    gpu_hours: float | None
    cost_usd: float | None
    price_usd_per_hour: float | None
    price_source: str
    missing: str | None

    @property
    def override(self) -> bool:
        return self.price_source.startswith("override")

    @property
    def key(self) -> str:
        return f"{self.variant_index}:{self.gpu}"


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
    options = training.get("options")
    if isinstance(options, dict) and isinstance(options.get(gpu), dict):
        return dict(options[gpu])
    return {}


def missing_reason(verdict: str, training: dict[str, Any], gpu: str) -> str | None:
    """Why hours or USD are not shown, in the form's words."""
    if verdict != "fits":
        return "not priced: it does not fit" if verdict == "no" else "not priced: tight"
    if training.get("wall_hours") is None:
        return "no hours: give training tokens or a dataset lengths file"
    if training.get("usd_per_gpu_hour") is None:
        card = gpu.split("x", 1)[-1] if gpu[:1].isdigit() and "x" in gpu else gpu
        return f"no catalog price for {card}: add {card}=USD/hour under price overrides"
    if training.get("cost_usd") is None:
        return str(training.get("reason") or "no cost")
    return None


def options(variants: list[Variant]) -> list[Option]:
    """Cheapest fitting first, then by verdict; options without a cost after those with one."""
    out: list[Option] = []
    for index, v in enumerate(variants):
        rows = v.document.get("rows", [])
        training = v.document.get("training") or {}
        for gpu in gpu_ids([v]):
            fits = [r.get("fit", {}).get(gpu, {}) for r in rows]
            verdict = max(
                (str(f.get("verdict", "no")) for f in fits),
                key=lambda s: VERDICT_ORDER.get(s, 3),
                default="no",
            )
            peaks = [f.get("peak_bytes") for f in fits if f.get("peak_bytes") is not None]
            t = _training_for(v.document, gpu)
            priced = verdict == "fits"
            out.append(
                Option(
                    variant=v.label,
                    variant_index=index,
                    gpu=gpu,
                    cards=int(t.get("gpus") or 1),
                    verdict=verdict,
                    worst_peak_bytes=max(peaks) if peaks else None,
                    seq_len=training.get("seq_len"),
                    tokens_per_second=_number(t, "tokens_per_second"),
                    hours=_number(t, "wall_hours") if priced else None,
                    gpu_hours=_number(t, "gpu_hours") if priced else None,
                    cost_usd=_number(t, "cost_usd") if priced else None,
                    price_usd_per_hour=_number(t, "usd_per_gpu_hour"),
                    price_source=str(t.get("price_source") or "none"),
                    missing=missing_reason(verdict, t, gpu),
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


def has_costs(opts: list[Option]) -> bool:
    return any(o.cost_usd is not None or o.hours is not None for o in opts)


def max_context_chart(answers: list[dict[str, Any]], seq_lens: list[int]) -> ChartSpec:
    """The longest sequence per GPU option (a group) and setting (a bar), from the solver; the
    longest requested length as a line."""
    groups: dict[str, list[Bar]] = {}
    for a in answers:
        seq = a.get("seq_len")
        groups.setdefault(a["gpu"], []).append(
            Bar(
                label=a["variant"],
                segments=[("tokens", float(seq or 0))],
                value_label=f"{seq:,} tokens" if seq else "does not fit at any length",
                kind="max-seq",
            )
        )
    longest = max(seq_lens) if seq_lens else 0
    return ChartSpec(
        title="Longest sequence that fits the usable memory, per GPU and setting (tokens)",
        groups=[Group(label=gpu, bars=bars) for gpu, bars in groups.items()],
        lines=[RefLine(f"longest requested ({longest:,})", float(longest), "requested")]
        if longest
        else [],
        unit="tokens",
    )


# the policy-only preference objectives (estimator/objective.py), as the summary names them
PREFERENCE_TRAINERS = {
    "kto": "KTO (TRL's KTOTrainer: reference and KL forwards each step)",
    "orpo": "ORPO (TRL's ORPOTrainer, no reference)",
    "cpo": "CPO (TRL's CPOTrainer with its NLL term, no reference)",
    "simpo": "SimPO (TRL's CPOTrainer, cpo_alpha 0, no reference)",
}


def setup_summary(setup: dict[str, Any]) -> str:
    parts = [f"stack {setup.get('stack', 'hf')}", str(setup.get("method", "?"))]
    objective = setup.get("objective", "sft")
    if objective == "dpo":
        parts.append("DPO (a reference forward each step)")
    elif objective == "dpo-precomputed":
        parts.append("DPO (reference log-probabilities precomputed)")
    elif objective in PREFERENCE_TRAINERS:
        parts.append(PREFERENCE_TRAINERS[objective])
    if setup.get("method") in ("lora", "qlora"):
        parts.append(f"rank {setup.get('lora_rank')} on {', '.join(setup.get('lora_targets', []))}")
    parts += [
        f"optimizer {setup.get('optimizer')}",
        f"precision {setup.get('precision')}",
        f"batch {setup.get('batch')}"
        + (f" {batch_unit(objective)}" if objective != "sft" else "")
        + (" (padded rows)" if setup.get("padded_batches") else ""),
    ]
    if (setup.get("grad_accum") or 1) > 1:
        parts.append(f"gradient accumulation {setup.get('grad_accum')}")
    if setup.get("eval_batch"):
        parts.append(f"evaluation batch {setup.get('eval_batch')}")
    if setup.get("parallel"):
        parts.append(f"layout {setup.get('parallel')}")
    elif (setup.get("num_gpus") or 1) > 1 or setup.get("sharding", "none") != "none":
        parts.append(f"{setup.get('num_gpus')} GPUs, {setup.get('sharding')}")
    return " · ".join(str(p) for p in parts)
