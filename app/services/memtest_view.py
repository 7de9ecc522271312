"""A memtest next to its estimate, arranged for the page: peaks (allocated and reserved), the
probe's components at the peak, and tokens/s. Every estimated figure comes from the library
(`estimator.compare`, `estimator.document`); this only arranges, converts and picks units.

Error = estimated - measured (positive: the estimate is above what was measured)."""

from __future__ import annotations

from typing import Any

from app.services.charts import Bar, ChartSpec, Group, RefLine

GIB = 2**30
MIB = 2**20
KINDS = ("params", "grads", "optimizer", "activations", "host")


def _error(estimated: float | None, measured: float | None) -> tuple[int | None, float | None]:
    if estimated is None or measured is None:
        return None, None
    diff = int(estimated - measured)
    return diff, (round(100.0 * diff / measured, 1) if measured else None)


def peak_rows(doc: dict[str, Any], comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """Per sequence length: measured and estimated allocated and reserved peaks, errors."""
    by_seq = {int(r["seq_len"]): r for r in comparison.get("rows", [])}
    out = []
    for result in doc.get("results", []):
        seq = int(result["seq_len"])
        c = by_seq.get(seq, {})
        measured, estimated = result.get("peak_allocated_bytes"), c.get("estimated_peak_bytes")
        m_res, e_res = result.get("peak_reserved_bytes"), c.get("estimated_reserved_bytes")
        simulated = m_res is None and result.get("simulated_reserved_bytes") is not None
        if simulated:  # cpu/fake with --simulate-reserved: the allocator model's figure
            m_res = result["simulated_reserved_bytes"]
        err, pct = _error(estimated, measured)
        err_res, pct_res = _error(e_res, m_res)
        out.append(
            {
                "seq_len": seq,
                "status": str(result.get("status", "")),
                "measured": measured,
                "estimated": estimated,
                "error": err,
                "error_pct": pct,
                "measured_reserved": m_res,
                "reserved_simulated": simulated,
                "estimated_reserved": e_res,
                "error_reserved": err_res,
                "error_reserved_pct": pct_res,
                # CUDA's total - free - reserved after the length, and the profile's context
                "measured_outside": c.get("measured_outside_allocator_bytes"),
                "estimated_outside": c.get("estimated_outside_allocator_bytes"),
            }
        )
    return out


def component_rows(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """Per sequence length and kind (the probe's: params, grads, optimizer, activations, host):
    estimated and measured bytes at the peak, when the memtest recorded its components."""
    out = []
    for row in comparison.get("rows", []):
        parts = row.get("components_vs_measured")
        if not parts:
            continue
        for kind in KINDS:
            if kind not in parts:
                continue
            estimated, measured = parts[kind].get("estimated"), parts[kind].get("measured")
            err, pct = _error(estimated, measured)
            out.append(
                {
                    "seq_len": row["seq_len"],
                    "kind": kind,
                    "estimated": estimated,
                    "measured": measured,
                    "error": err,
                    "error_pct": pct,
                }
            )
    return out


def unit_for(peaks: list[dict[str, Any]]) -> str:
    """MiB when every figure is under a GiB (runs on the CPU or tiny models), else GiB."""
    figures = [
        abs(v)
        for p in peaks
        for k in ("measured", "estimated", "measured_reserved", "estimated_reserved")
        if isinstance(v := p.get(k), int | float)
    ]
    return "MiB" if figures and max(figures) < GIB else "GiB"


def in_unit(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    return f"{value / (MIB if unit == 'MiB' else GIB):,.1f}"


def comparison_chart(peaks: list[dict[str, Any]], total: int | None, unit: str) -> ChartSpec:
    scale = MIB if unit == "MiB" else GIB

    def bar(label: str, value: int | None, series: str) -> Bar:
        return Bar(
            label,
            [(series, (value or 0) / scale)],
            value_label=f"{in_unit(value, unit)} {unit}" if value is not None else "not measured",
        )

    groups = [
        Group(
            label=f"{p['seq_len']:,} tokens ({p['status']})",
            bars=[
                bar("estimated allocated", p["estimated"], "estimated"),
                bar("measured allocated", p["measured"], "measured"),
                bar("estimated reserved", p["estimated_reserved"], "estimated"),
                bar(
                    "simulated reserved" if p["reserved_simulated"] else "measured reserved",
                    p["measured_reserved"],
                    "reserved",
                ),
            ],
        )
        for p in peaks
    ]
    lines = [RefLine("GPU total memory", total / scale, "total", False)] if total else []
    return ChartSpec(
        title=f"Peak memory: estimated vs measured ({unit})", groups=groups, lines=lines, unit=unit
    )
