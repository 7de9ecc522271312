"""Server-side SVG charts: horizontal bars, no JavaScript, nothing fetched from anywhere.

Why hand-written SVG and not a charting library: the pages must work offline and under a CSP
without inline scripts or styles, the charts are static (no zoom or pan to offer), and a
library would add a JavaScript bundle to vendor and keep up to date. Why horizontal bars:
they read on a phone. The SVG has no viewBox: x positions are percentages of the figure's
width and text is sized in CSS pixels, so labels stay 12 px at 390 px as at 1366 px, and
each bar gets its own row (the chart grows downwards, never sideways).

`bar_chart` draws groups of bars (e.g. one group per sequence length, one bar per option),
each bar a stack of named segments with its value printed at its end, plus vertical
reference lines (a GPU's usable memory dashed, its capacity solid, one colour per GPU).
The caller converts units (GiB for memory) and writes the hover texts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from markupsafe import Markup, escape

PALETTE = {
    "weights": "#4c72b0",
    "trainable_states": "#dd8452",
    "checkpoints": "#55a868",
    "gradients": "#8c613c",
    "recompute_peak": "#c44e52",
    "logits": "#8172b3",
    "optimizer_step": "#da8bc3",
    "cublas_workspaces": "#6d904f",
    "overhead": "#937860",
    "allocator_slack": "#b8b8b8",
    "host": "#64b5cd",
    "estimated": "#4c72b0",
    "measured": "#dd8452",
    "reserved": "#f2c29b",
    "tokens": "#55a868",
}
LINE_COLOURS = ["#111111", "#b8860b", "#2f4f4f", "#8b008b", "#006400", "#8b0000", "#00008b"]

LABEL_H = 15  # px: the bar's label line
BAR_H = 16  # px: the bar
ROW_GAP = 8  # px between bars
GROUP_H = 22  # px: a group's heading
PLOT_LEFT = 0.5  # % of the width
PLOT_WIDTH = 82.0  # % of the width; the rest holds the value printed after the longest bar


@dataclass(frozen=True)
class Bar:
    label: str
    segments: list[tuple[str, float]]  # (series name, value), left to right
    value_label: str = ""  # printed at the bar's end (default: the sum, one decimal)
    hover: str = ""  # extra text in the bar's tooltip
    kind: str = ""  # a CSS class (e.g. the option it shows)

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
    value: float
    key: str = ""  # lines with one key share a colour (a GPU's usable and capacity)
    dashed: bool = True


@dataclass
class ChartSpec:
    title: str
    groups: list[Group]
    lines: list[RefLine] = field(default_factory=list)
    unit: str = "GiB"


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** (len(str(int(value))) - 1) if value >= 1 else 1
    for step in (1, 1.2, 1.6, 2, 2.5, 3, 4, 5, 6, 8, 10):
        top = step * magnitude
        if top >= value * 1.02:
            return float(top)
    return value * 1.1


def _line_colours(lines: list[RefLine]) -> dict[str, str]:
    keys = list(dict.fromkeys(line.key or line.label for line in lines))
    return {k: LINE_COLOURS[i % len(LINE_COLOURS)] for i, k in enumerate(keys)}


def _x(value: float, x_max: float) -> float:
    return PLOT_LEFT + PLOT_WIDTH * max(value, 0.0) / x_max


def bar_chart(spec: ChartSpec) -> Markup:
    """A <figure>-ready block: the SVG, then an HTML legend (wraps on small screens)."""
    highest = max(
        [b.total for g in spec.groups for b in g.bars] + [ln.value for ln in spec.lines] + [0.0]
    )
    x_max = _nice_max(highest)
    colours = _line_colours(spec.lines)
    body: list[str] = []
    series: list[str] = []
    y = 4
    for group in spec.groups:
        if group.label:
            y += GROUP_H
            body.append(f'<text x="0" y="{y - 6}" class="group-label">{escape(group.label)}</text>')
        for bar in group.bars:
            body.append(_bar(bar, y, x_max, series))
            y += LABEL_H + BAR_H + ROW_GAP
    plot_top, plot_bottom = 4, y
    axis_y = y + 14
    ticks = []
    for i in range(5):
        v = x_max * i / 4
        ticks.append(
            f'<line x1="{_x(v, x_max):.2f}%" x2="{_x(v, x_max):.2f}%" y1="{plot_top}" '
            f'y2="{plot_bottom}" class="grid"/>'
            f'<text x="{_x(v, x_max):.2f}%" y="{axis_y}" text-anchor="middle" class="tick">'
            f"{v:,.4g}</text>"
        )
    refs = []
    for line in spec.lines:
        x = f"{_x(line.value, x_max):.2f}%"
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        refs.append(
            f'<line x1="{x}" x2="{x}" y1="{plot_top}" y2="{plot_bottom}" '
            f'stroke="{colours[line.key or line.label]}" stroke-width="2"{dash} '
            f'class="ref-line"><title>{escape(line.label)}: {line.value:,.1f} {spec.unit}'
            "</title></line>"
        )
    height = axis_y + 6
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="100%" '
        f'height="{height}" aria-label="{escape(spec.title)}"><title>{escape(spec.title)}'
        f"</title>{''.join(ticks)}{''.join(body)}{''.join(refs)}</svg>"
    )
    return Markup(svg + _legend(spec, series, colours))


def _bar(bar: Bar, y: int, x_max: float, series: list[str]) -> str:
    top = y + LABEL_H
    parts = [
        f'<g class="bar {escape(bar.kind)}">',
        f"<title>{escape(bar.label)}: {escape(bar.value_label or f'{bar.total:,.1f}')}"
        + "".join(f"\n{escape(n)}: {v:,.1f}" for n, v in bar.segments if v > 0)
        + (f"\n{escape(bar.hover)}" if bar.hover else "")
        + "</title>",
        f'<text x="0" y="{y + LABEL_H - 4}" class="bar-label">{escape(bar.label)}</text>',
    ]
    base = 0.0
    for name, value in bar.segments:
        if name not in series:
            series.append(name)
        if value <= 0:
            continue
        x0, x1 = _x(base, x_max), _x(base + value, x_max)
        parts.append(
            f'<rect x="{x0:.2f}%" y="{top}" width="{max(x1 - x0, 0.05):.2f}%" '
            f'height="{BAR_H}" fill="{PALETTE.get(name, "#999")}" class="seg {escape(name)}"/>'
        )
        base += value
    label = bar.value_label or f"{bar.total:,.1f}"
    parts.append(
        f'<text x="{_x(base, x_max):.2f}%" dx="4" y="{top + BAR_H - 4}" '
        f'class="bar-value">{escape(label)}</text></g>'
    )
    return "".join(parts)


def _swatch(colour: str, dashed: bool | None = None) -> str:
    if dashed is None:
        shape = f'<rect width="12" height="12" fill="{colour}"/>'
    else:
        dash = ' stroke-dasharray="4 2"' if dashed else ""
        shape = f'<line x1="0" x2="16" y1="6" y2="6" stroke="{colour}" stroke-width="2"{dash}/>'
    return f'<svg width="16" height="12" aria-hidden="true">{shape}</svg>'


def _legend(spec: ChartSpec, series: list[str], colours: dict[str, str]) -> str:
    items = [
        f"<li>{_swatch(PALETTE.get(name, '#999'))} {escape(name.replace('_', ' '))}</li>"
        for name in series
    ]
    items += [
        f"<li>{_swatch(colours[line.key or line.label], line.dashed)} {escape(line.label)} "
        f"{line.value:,.1f}</li>"
        for line in spec.lines
    ]
    return f'<ul class="chart-legend">{"".join(items)}</ul>'
