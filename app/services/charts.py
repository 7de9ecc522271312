"""Server-side SVG charts (no JavaScript, nothing fetched from the internet).

`stacked_bars` draws groups of bars (one group per sequence length, one bar per variant), each
bar a stack of named segments, plus horizontal reference lines (a GPU's usable memory). Values
are in GiB; the caller converts bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from markupsafe import Markup, escape

PALETTE = {
    "weights": "#4c72b0",
    "trainable_states": "#dd8452",
    "checkpoints": "#55a868",
    "recompute_peak": "#c44e52",
    "logits": "#8172b3",
    "overhead": "#937860",
    "estimated": "#4c72b0",
    "measured": "#dd8452",
    "reserved": "#f2c29b",
}
LINE_COLOURS = ["#111111", "#b8860b", "#2f4f4f", "#8b008b", "#006400", "#8b0000", "#00008b"]


@dataclass(frozen=True)
class Bar:
    label: str
    segments: list[tuple[str, float]]  # (series name, GiB), bottom to top

    @property
    def total(self) -> float:
        return sum(v for _, v in self.segments)


@dataclass(frozen=True)
class Group:
    label: str
    bars: list[Bar]


@dataclass(frozen=True)
class RefLine:
    label: str
    value: float  # GiB


@dataclass
class ChartSpec:
    title: str
    groups: list[Group]
    lines: list[RefLine] = field(default_factory=list)
    y_label: str = "GiB (2^30 bytes)"


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000):
        if value / step <= 8:
            return step * (int(value / step) + 1)
    return value * 1.1


def stacked_bars(spec: ChartSpec, *, width: int = 860, height: int = 420) -> Markup:
    left, right, top, bottom = 64, 180, 36, 96
    plot_w, plot_h = width - left - right, height - top - bottom
    highest = max(
        [b.total for g in spec.groups for b in g.bars] + [ln.value for ln in spec.lines] + [0.0]
    )
    y_max = _nice_max(highest)

    def y(v: float) -> float:
        return top + plot_h - plot_h * v / y_max

    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {width} {height}" width="100%" aria-label="{escape(spec.title)}">',
        f"<title>{escape(spec.title)}</title>",
        f'<text x="{left}" y="20" class="chart-title">{escape(spec.title)}</text>',
    ]
    step = y_max / 5
    for i in range(6):
        v = step * i
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
            f'stroke="#ddd"/><text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" '
            f'class="tick">{v:g}</text>'
        )
    parts.append(
        f'<text x="14" y="{top + plot_h / 2:.0f}" transform="rotate(-90 14 {top + plot_h / 2:.0f})"'
        f' text-anchor="middle" class="axis">{escape(spec.y_label)}</text>'
    )
    n_groups = max(len(spec.groups), 1)
    group_w = plot_w / n_groups
    series: list[str] = []
    for gi, group in enumerate(spec.groups):
        n_bars = max(len(group.bars), 1)
        bar_w = min(48.0, group_w * 0.8 / n_bars)
        x0 = left + gi * group_w + (group_w - bar_w * n_bars) / 2
        for bi, bar in enumerate(group.bars):
            x = x0 + bi * bar_w
            base = 0.0
            for name, value in bar.segments:
                if name not in series:
                    series.append(name)
                if value <= 0:
                    continue
                colour = PALETTE.get(name, "#999")
                parts.append(
                    f'<rect x="{x:.1f}" y="{y(base + value):.1f}" width="{bar_w - 2:.1f}" '
                    f'height="{y(base) - y(base + value):.1f}" fill="{colour}">'
                    f"<title>{escape(bar.label)} {escape(name)}: {value:.1f} GiB</title></rect>"
                )
                base += value
            parts.append(
                f'<text x="{x + bar_w / 2 - 1:.1f}" y="{y(base) - 3:.1f}" text-anchor="middle" '
                f'class="value">{base:.0f}</text>'
            )
            if n_bars > 1:
                lx, ly = x + bar_w / 2, top + plot_h + 10
                parts.append(
                    f'<text x="{lx:.1f}" y="{ly}" transform="rotate(-35 {lx:.1f} {ly})" '
                    f'text-anchor="end" class="bar-label">{escape(bar.label)}</text>'
                )
        parts.append(
            f'<text x="{left + gi * group_w + group_w / 2:.1f}" y="{top + plot_h + 84}" '
            f'text-anchor="middle" class="group-label">{escape(group.label)}</text>'
        )
    for li, line in enumerate(spec.lines):
        colour = LINE_COLOURS[li % len(LINE_COLOURS)]
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(line.value):.1f}" '
            f'y2="{y(line.value):.1f}" stroke="{colour}" stroke-dasharray="6 3" '
            f'stroke-width="1.5" class="ref-line"><title>{escape(line.label)}: '
            f"{line.value:.1f} GiB</title></line>"
        )
    legend_x, legend_y = left + plot_w + 16, top
    for si, name in enumerate(series):
        parts.append(
            f'<rect x="{legend_x}" y="{legend_y + si * 18}" width="12" height="12" '
            f'fill="{PALETTE.get(name, "#999")}"/><text x="{legend_x + 18}" '
            f'y="{legend_y + si * 18 + 10}" class="legend">{escape(name)}</text>'
        )
    offset = legend_y + len(series) * 18 + 12
    for li, line in enumerate(spec.lines):
        colour = LINE_COLOURS[li % len(LINE_COLOURS)]
        yy = offset + li * 18
        parts.append(
            f'<line x1="{legend_x}" x2="{legend_x + 12}" y1="{yy + 6}" y2="{yy + 6}" '
            f'stroke="{colour}" stroke-dasharray="4 2" stroke-width="2"/>'
            f'<text x="{legend_x + 18}" y="{yy + 10}" class="legend">'
            f"{escape(line.label)} {line.value:.0f}</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))
