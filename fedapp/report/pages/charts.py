"""Charts as inline SVG: curves against the round or k, a scatter map, a grid of who answered each round.

SVG keeps a page self-contained, small (a 100-round curve is a few kB) and sharp at any zoom; each point
or cell carries a `<title>`, which browsers show on hover, so no script is needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fedapp.report.pages.html import number, text

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
DASHES = ("", "5 3", "2 2", "8 3 2 3")
WIDTH, HEIGHT = 500, 230
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 58, 14, 28, 36
MARKERS_UP_TO = 40  # points per series drawn as dots too (more: the line alone)


def colour(index: int) -> str:
    """A distinct colour per index: the ten of matplotlib's tab10, then hues around the circle."""
    if index < len(PALETTE):
        return PALETTE[index]
    hue = (index * 137.508) % 360  # the golden angle spreads any number of hues
    return f"hsl({hue:.0f},60%,45%)"


@dataclass
class Series:
    """One curve: its name, x and y (None: no value there, the line breaks)."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]


@dataclass
class Chart:
    """A line chart: title, axis names, curves and vertical marks ((x, label), e.g. the chosen k)."""

    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)

    def points(self) -> list[tuple[float, float]]:
        return [
            (float(x), float(y))
            for s in self.series
            for x, y in zip(s.xs, s.ys, strict=True)
            if _finite(y) and _finite(x)
        ]


def _finite(value: float | None) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round tick values covering [low, high]."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [float(round(first + i * step, 12)) for i in range(int((high - first) / step + 1e-9) + 1)]


class _Scale:
    """Data -> pixel coordinates of a plot area."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], integer_x: bool) -> None:
        self.x0, self.x1 = min(xs), max(xs)
        self.y0, self.y1 = min(ys), max(ys)
        if self.x0 == self.x1:
            self.x0, self.x1 = self.x0 - 1, self.x1 + 1
        if self.y0 == self.y1:
            pad = abs(self.y0) * 0.1 or 1.0
            self.y0, self.y1 = self.y0 - pad, self.y1 + pad
        else:
            pad = (self.y1 - self.y0) * 0.05
            self.y0, self.y1 = self.y0 - pad, self.y1 + pad
        self.integer_x = integer_x
        self.left, self.right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
        self.top, self.bottom = MARGIN_TOP, HEIGHT - MARGIN_BOTTOM

    def x(self, value: float) -> float:
        return self.left + (value - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def y(self, value: float) -> float:
        return self.bottom - (value - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)

    def x_ticks(self) -> list[float]:
        found = ticks(self.x0, self.x1, 6)
        return [t for t in found if t.is_integer()] if self.integer_x else found


def line_chart(chart: Chart, *, integer_x: bool = True) -> str:
    """The chart as an SVG figure ('' without finite points at two x values at least)."""
    points = chart.points()
    if len({x for x, _ in points}) < 2:  # one x (a one-round run): a dot says no more than the tables
        return ""
    scale = _Scale([p[0] for p in points], [p[1] for p in points], integer_x)
    parts = [_axes(scale, chart.x_label, chart.y_label)]
    for x, label in chart.marks:
        px = scale.x(float(x))
        parts.append(
            f'<line x1="{px:.1f}" y1="{scale.top}" x2="{px:.1f}" y2="{scale.bottom}" stroke="#c62828" '
            f'stroke-dasharray="4 3"/><text x="{px + 3:.1f}" y="{scale.top + 10}" fill="#c62828">'
            f"{text(label)}</text>"
        )
    for index, series in enumerate(chart.series):
        parts.append(_curve(series, index, scale))
    legend = _legend([s.name for s in chart.series])
    return _figure(chart.title, "".join(parts), legend)


def _axes(scale: _Scale, x_label: str, y_label: str) -> str:
    parts = [
        f'<rect x="{scale.left}" y="{scale.top}" width="{scale.right - scale.left}" '
        f'height="{scale.bottom - scale.top}" fill="#fff" stroke="#c8ced6"/>'
    ]
    for value in ticks(scale.y0, scale.y1):
        py = scale.y(value)
        parts.append(
            f'<line x1="{scale.left}" y1="{py:.1f}" x2="{scale.right}" y2="{py:.1f}" stroke="#eef0f3"/>'
            f'<text x="{scale.left - 4}" y="{py + 4:.1f}" text-anchor="end">{number(value, 3)}</text>'
        )
    for value in scale.x_ticks():
        px = scale.x(value)
        parts.append(
            f'<line x1="{px:.1f}" y1="{scale.bottom}" x2="{px:.1f}" y2="{scale.bottom + 4}" stroke="#999"/>'
            f'<text x="{px:.1f}" y="{scale.bottom + 15}" text-anchor="middle">{number(value, 4)}</text>'
        )
    middle = (scale.left + scale.right) / 2
    parts.append(f'<text x="{middle:.0f}" y="{HEIGHT - 4}" text-anchor="middle">{text(x_label)}</text>')
    parts.append(
        f'<text x="12" y="{(scale.top + scale.bottom) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {(scale.top + scale.bottom) / 2:.0f})">{text(y_label)}</text>'
    )
    return "".join(parts)


def _curve(series: Series, index: int, scale: _Scale) -> str:
    stroke, dash = colour(index), DASHES[index % len(DASHES)]
    runs: list[list[tuple[float, float, float, float]]] = [[]]  # broken where a value is missing
    for x, y in zip(series.xs, series.ys, strict=True):
        if _finite(y) and _finite(x):
            runs[-1].append((scale.x(float(x)), scale.y(float(y)), float(x), float(y)))  # type: ignore[arg-type]
        elif runs[-1]:
            runs.append([])
    parts = []
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    for run in runs:
        if len(run) > 1:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in run)
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{stroke}" stroke-width="1.6"{dash_attr}/>'
            )
    drawn = [point for run in runs for point in run]
    if len(drawn) <= MARKERS_UP_TO:
        for px, py, x, y in drawn:
            parts.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.6" fill="{stroke}">'
                f"<title>{text(series.name)}: {number(x)} → {number(y)}</title></circle>"
            )
    return "".join(parts)


def _legend(names: Sequence[str]) -> str:
    return _legend_of([(colour(i), name) for i, name in enumerate(names)])


def _legend_of(entries: Sequence[tuple[str, str]]) -> str:
    return " ".join(
        f'<span><span class="swatch" style="background:{fill}"></span>{text(name)}</span>'
        for fill, name in entries
    )


def _figure(title: str, body: str, legend: str = "", width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<figure><svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{text(title)}">'
        f'<text x="{width / 2:.0f}" y="16" text-anchor="middle" style="font-weight:600">{text(title)}</text>'
        f"{body}</svg><figcaption>{legend}</figcaption></figure>"
    )


def scatter(
    title: str, xs: Sequence[float], ys: Sequence[float], groups: Sequence[int], size: int = 400
) -> str:
    """A square scatter map (equal scales on both axes), one colour per group, e.g. a node's records by
    cluster."""
    if not len(xs):
        return ""
    top, pad = 24, 10
    inner = size - top - 2 * pad
    mid_x, mid_y = (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2
    span = max(max(xs) - min(xs), max(ys) - min(ys)) or 1.0
    centre_x, centre_y = size / 2, top + pad + inner / 2
    dots = "".join(
        f'<circle cx="{centre_x + (x - mid_x) / span * inner:.1f}" '
        f'cy="{centre_y - (y - mid_y) / span * inner:.1f}" r="2.4" fill="{colour(g)}" fill-opacity="0.75"/>'
        for x, y, g in zip(xs, ys, groups, strict=True)
    )
    frame = (
        f'<rect x="1" y="{top - 2}" width="{size - 2}" height="{size - top + 1}" fill="#fff" '
        'stroke="#c8ced6"/>'
    )
    legend = _legend_of([(colour(g), f"cluster {g}") for g in sorted(set(groups))])
    return _figure(title, frame + dots, legend, width=size, height=size)


def dot_rows(title: str, rows: Sequence[tuple[str, Sequence[float], float | None]], x_label: str) -> str:
    """One row of dots per label (e.g. a run's seeds), the mean as a bar and a reference (the paper's
    figure) as a red diamond: the spread of each row at a glance."""
    values = [v for _, seeds, ref in rows for v in (*seeds, ref) if _finite(v)]
    if not values:
        return ""
    label_width, row_h, top = 170, 22, 26
    width, height = WIDTH + 120, top + row_h * len(rows) + 34
    low, high = min(values), max(values)
    if low == high:
        low, high = low - 1, high + 1
    pad = (high - low) * 0.05
    low, high = low - pad, high + pad
    right = width - MARGIN_RIGHT

    def px(value: float) -> float:
        return label_width + (value - low) / (high - low) * (right - label_width)

    parts = []
    for value in ticks(low, high, 6):
        parts.append(
            f'<line x1="{px(value):.1f}" y1="{top}" x2="{px(value):.1f}" y2="{top + row_h * len(rows)}" '
            f'stroke="#eef0f3"/><text x="{px(value):.1f}" y="{top + row_h * len(rows) + 14}" '
            f'text-anchor="middle">{number(value, 4)}</text>'
        )
    for index, (label, seeds, ref) in enumerate(rows):
        y = top + index * row_h + row_h / 2
        parts.append(f'<text x="{label_width - 6}" y="{y + 4:.1f}" text-anchor="end">{text(label)}</text>')
        finite = [v for v in seeds if _finite(v)]
        if finite:
            mean = sum(finite) / len(finite)
            parts.append(
                f'<line x1="{px(mean):.1f}" y1="{y - 7:.1f}" x2="{px(mean):.1f}" y2="{y + 7:.1f}" '
                f'stroke="{PALETTE[0]}" stroke-width="2">'
                f"<title>{text(label)}: mean {number(mean)}</title></line>"
            )
        for value in finite:
            parts.append(
                f'<circle cx="{px(value):.1f}" cy="{y:.1f}" r="3.5" fill="{PALETTE[0]}" fill-opacity="0.6">'
                f"<title>{text(label)}: {number(value)}</title></circle>"
            )
        if _finite(ref):
            x = px(float(ref))  # type: ignore[arg-type]
            parts.append(
                f'<path d="M{x:.1f},{y - 5:.1f} L{x + 5:.1f},{y:.1f} L{x:.1f},{y + 5:.1f} '
                f'L{x - 5:.1f},{y:.1f} Z" '
                f'fill="#c62828"><title>{text(label)}: paper {number(ref)}</title></path>'
            )
    middle = (label_width + right) / 2
    parts.append(f'<text x="{middle:.0f}" y="{height - 4}" text-anchor="middle">{text(x_label)}</text>')
    legend = _legend_of([(PALETTE[0], "a seed (bar: the mean)"), ("#c62828", "the paper")])
    return _figure(title, "".join(parts), legend, width=width, height=height)


@dataclass(frozen=True)
class Cell:
    """One cell of a grid: its colour and what hovering over it says."""

    fill: str
    title: str


def grid(
    title: str, columns: Sequence[str], rows: Sequence[str], cells: Mapping[tuple[int, int], Cell]
) -> str:
    """A grid of small cells (e.g. rounds x clients); `cells[(column, row)]`, missing ones left blank."""
    if not columns or not rows:
        return ""
    label_width, top = 90, 26
    cell_w = max(3.0, min(22.0, (WIDTH + 200 - label_width) / len(columns)))
    cell_h = max(6.0, min(18.0, 360 / len(rows)))
    width = int(label_width + cell_w * len(columns) + 10)
    height = int(top + cell_h * len(rows) + 24)
    parts = []
    for index, name in enumerate(rows):
        y = top + index * cell_h
        if cell_h >= 9:
            parts.append(
                f'<text x="{label_width - 4}" y="{y + cell_h - 3:.1f}" text-anchor="end">{text(name)}</text>'
            )
    step = max(1, math.ceil(len(columns) / 12))
    for index in range(0, len(columns), step):
        x = label_width + index * cell_w + cell_w / 2
        parts.append(
            f'<text x="{x:.1f}" y="{top + cell_h * len(rows) + 14:.1f}" text-anchor="middle">'
            f"{text(columns[index])}</text>"
        )
    for (column, row), cell in cells.items():
        x, y = label_width + column * cell_w, top + row * cell_h
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{cell_w - 1:.1f}" height="{cell_h - 1:.1f}" '
            f'fill="{cell.fill}">'
            f"<title>{text(cell.title)}</title></rect>"
        )
    return _figure(title, "".join(parts), width=width, height=height)


def swatches(entries: Sequence[tuple[str, str]]) -> str:
    """A legend of (colour, meaning)."""
    return _legend_of(entries)
