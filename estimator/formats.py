"""Render an estimate document: table (GiB, coloured verdicts), markdown (seed-000 shape), csv.
Every number here comes from the document; nothing is computed in the front end but units."""

from __future__ import annotations

import csv
import io
from typing import Any

from estimator.objective import batch_unit

GIB = 2**30
COLOURS = {"fits": "\033[32m", "tight": "\033[33m", "no": "\033[31m"}
RESET = "\033[0m"
CHECKPOINT_LABEL = {
    "gpu": "on the GPU",
    "offload": "CPU offload",
    "none": "none (all saved)",
    "selective": "selective (per op)",
}
LOSS_LABEL = {
    "full": "full logits",
    "chunked": "chunked",
    "liger": "Liger fused CE",
    "cce": "Cut Cross-Entropy",
    "unsloth": "Unsloth fused CE",
}
COMPONENT_LABEL = {
    "weights": "weights",
    "trainable_states": "trainable weights + grads + optimizer",
    "checkpoints": "layer checkpoints",
    "recompute_peak": "recompute peak of one layer",
    "logits": "logits and loss",
    "overhead": "runtime overhead",
}


def gib(value: int | float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value / GIB:.{digits}f}"


def _gpu_header(doc: dict[str, Any], option: str) -> str:
    g = doc["gpus"][option]
    prefix = f"{g['count']}x " if g["count"] > 1 else ""
    return f"{prefix}{g['name']} ({g['capacity_bytes'] / GIB:.1f} GiB)"


def _verdict(v: str, colour: bool) -> str:
    return f"{COLOURS[v]}{v}{RESET}" if colour else v


def _fit_rows(doc: dict[str, Any], colour: bool) -> tuple[list[str], list[list[str]]]:
    options = list(doc["gpus"])
    header = [
        "seq",
        "batch",
        "checkpoints",
        "loss",
        "peak GiB",
        *(_gpu_header(doc, o) for o in options),
    ]
    body = []
    for r in doc["rows"]:
        peak = gib(r["peak_bytes"]) + (" (lower bound)" if r["peak_is_lower_bound"] else "")
        cells = [
            str(r["seq_len"]),
            str(r["batch"]),
            CHECKPOINT_LABEL[r["checkpointing"]],
            LOSS_LABEL[r["loss"]],
            peak,
        ]
        for o in options:
            f = r["fit"][o]
            cell = _verdict(f["verdict"], colour)
            if "components" in f:
                cell += f" ({gib(f['peak_bytes'])}/card)"
            cells.append(cell)
        body.append(cells)
    return header, body


def _component_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["seq", "checkpoints", "loss", *COMPONENT_LABEL.values(), "host GiB"]
    body = []
    for r in doc["rows"]:
        body.append(
            [
                str(r["seq_len"]),
                r["checkpointing"],
                r["loss"],
                *(gib(r["components"][k]) for k in COMPONENT_LABEL),
                gib(r["host_bytes"]),
            ]
        )
    return header, body


def _plain(header: list[str], body: list[list[str]]) -> str:
    import re

    def width(s: str) -> int:
        return len(re.sub(r"\033\[[0-9;]*m", "", s))

    widths = [max(width(c) for c in col) for col in zip(header, *body, strict=True)]
    lines = []
    for row in [header, *body]:
        lines.append("  ".join(c + " " * (w - width(c)) for c, w in zip(row, widths, strict=True)))
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _title(doc: dict[str, Any]) -> str:
    m, s = doc["model"], doc["setup"]
    method = s["method"] + (f" r{s['lora_rank']}" if s["method"] != "full" else "")
    objective = s.get("objective", "sft")
    if objective != "sft":  # a DPO row is a preference pair (estimator/objective.py)
        method += f", {objective} (batch in {batch_unit(objective)})"
    return (
        f"{m['name']} ({m['model_type']}, {m['params_in_weights'] / 1e9:.2f} B params in the "
        f"weights, {m['params_trainable']:,} trainable), {method}, {s['optimizer']}, "
        f"profile {doc['profile']}, usable {doc['usable_fraction']:.0%} of each card"
    )


def _notes(doc: dict[str, Any]) -> list[str]:
    notes = [f"note: {note}" for note in doc["model"].get("notes", [])]
    notes += _evaluation_notes(doc)
    for r in doc["rows"][:1]:
        for comp, why in r["not_computable"].items():
            notes.append(f"not computable: {comp}: {why}")
    return notes


def _evaluation_notes(doc: dict[str, Any]) -> list[str]:
    """What the evaluation pass (setup.eval_batch) adds: where it sets the peak."""
    rows = doc["setup"].get("eval_batch")
    if not rows:
        return []
    at: dict[int, str] = {}
    for r in doc["rows"]:
        if r.get("peak_phase") != "evaluation" or r["seq_len"] in at:
            continue
        totals = {k: sum(v.values()) for k, v in r["phases"].items()}
        step = max(v for k, v in totals.items() if k != "evaluation")
        at[r["seq_len"]] = (
            f"{r['seq_len']:,} ({gib(totals['evaluation'])} GiB allocated, the step {gib(step)})"
        )
    where = (
        "it sets the peak at seq " + ", ".join(at[s] for s in sorted(at))
        if at
        else "below the training step's peak at every length"
    )
    noun = "row" if rows == 1 else "rows"
    return [f"note: evaluation pass of {rows} {noun} per device priced: {where}"]


def _time_cost(doc: dict[str, Any], fmt: str) -> list[str]:
    """Hours and dollars per GPU option (estimator.time.plan), when the run's tokens are known."""
    from estimator.time.plan import format_time_cost_table

    training = doc.get("training")
    if not training or training.get("tokens") is None:
        return []
    parts = ["", format_time_cost_table(training, fmt)]
    if doc.get("calibration"):
        c = doc["calibration"]
        parts.append(
            f"calibrated from {c['tokens_per_second']:.4g} tokens/s measured on "
            f"{c['gpu']} at seq {c['seq_len']}: efficiency {c['efficiency']:.3f}; "
            "other cells are extrapolated"
        )
    return parts


def render_table(doc: dict[str, Any], colour: bool = False) -> str:
    parts = [
        _title(doc),
        "",
        "Memory per device by component (GiB = 2^30 bytes)",
        _plain(*_component_rows(doc)),
        "",
        "Fit by GPU",
        _plain(*_fit_rows(doc, colour)),
    ]
    parts += _notes(doc) + _time_cost(doc, "table")
    return "\n".join(parts) + "\n"


def render_markdown(doc: dict[str, Any]) -> str:
    parts = [
        f"**{_title(doc)}**",
        "",
        "Memory by component (GiB)",
        "",
        _markdown(*_component_rows(doc)),
        "",
        f"Fit by GPU ({doc['usable_fraction']:.0%} of the card counted as usable)",
        "",
        _markdown(*_fit_rows(doc, False)),
    ]
    parts += [f"- {n}" for n in _notes(doc)] + _time_cost(doc, "markdown")
    return "\n".join(parts) + "\n"


def render_csv(doc: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    comps = list(COMPONENT_LABEL)
    writer.writerow(
        [
            "seq_len",
            "batch",
            "checkpointing",
            "loss",
            *[f"{c}_bytes" for c in comps],
            "host_bytes",
            "peak_bytes",
            "gpu",
            "devices",
            "verdict",
            "capacity_bytes",
            "usable_bytes",
            "gpu_peak_bytes",
            "margin_bytes",
        ]
    )
    for r in doc["rows"]:
        for option, f in r["fit"].items():
            writer.writerow(
                [
                    r["seq_len"],
                    r["batch"],
                    r["checkpointing"],
                    r["loss"],
                    *[r["components"][c] for c in comps],
                    r["host_bytes"],
                    r["peak_bytes"],
                    option,
                    f["devices"],
                    f["verdict"],
                    f["capacity_bytes"],
                    f["usable_bytes"],
                    f["peak_bytes"],
                    f["margin_bytes"],
                ]
            )
    return out.getvalue()
