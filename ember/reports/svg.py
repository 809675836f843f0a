"""Small deterministic inline-SVG charts for the HTML reports (no plotting dependency)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Mapping, Sequence

_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756")


def bar_chart(labels: Sequence[str], series: Mapping[str, Sequence[float]], unit: str = "",
              title: str = "", bar_px: int = 14, width_px: int = 640) -> str:
    """Horizontal grouped bars, one group per label; values below zero are drawn at zero."""
    names = list(series)
    top = max([max(values, default=0.0) for values in series.values()] + [1e-9])
    label_px, pad = 220, 6
    group_px = bar_px * len(names) + pad
    height = 40 + group_px * len(labels) + 20
    plot_px = width_px - label_px - 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width_px}" height="{height}" '
             f'font-family="sans-serif" font-size="11" role="img">',
             f'<text x="4" y="16" font-size="13">{escape(title)}</text>']
    for j, name in enumerate(names):
        parts.append(f'<rect x="{label_px + 90 * j}" y="24" width="10" height="10" '
                     f'fill="{_COLOURS[j % 4]}"/><text x="{label_px + 14 + 90 * j}" '
                     f'y="33">{escape(name)}</text>')
    for i, label in enumerate(labels):
        y0 = 40 + i * group_px
        parts.append(f'<text x="{label_px - 4}" y="{y0 + group_px / 2 + 3:.0f}" '
                     f'text-anchor="end">{escape(label[:34])}</text>')
        for j, name in enumerate(names):
            value = series[name][i]
            w = max(0.0, value) / top * plot_px
            y = y0 + j * bar_px
            parts.append(f'<rect x="{label_px}" y="{y}" width="{w:.1f}" height="{bar_px - 2}" '
                         f'fill="{_COLOURS[j % 4]}"><title>{escape(label)} {escape(name)}: '
                         f'{value:.2f} {escape(unit)}</title></rect>')
            parts.append(f'<text x="{label_px + w + 3:.1f}" y="{y + bar_px - 4}">'
                         f'{value:.1f}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


# Colours by what bounds a layer or which unit works, shared by the performance report's charts.
BOUND_COLOURS = {"array": "#4c78a8", "dram": "#f58518", "vector": "#54a24b", "host": "#b279a2",
                 "dma": "#9d755d"}
UNIT_COLOURS = {"load": "#f58518", "array": "#4c78a8", "vector": "#54a24b", "store": "#e45756",
                "host": "#b279a2"}


def _svg_open(width: int, height: int, title: str) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="11" role="img">',
            f'<text x="4" y="16" font-size="13">{escape(title)}</text>']


def _legend(items: Sequence[tuple[str, str]], x: float, y: float) -> list[str]:
    parts = []
    for name, colour in items:
        parts.append(f'<rect x="{x:.0f}" y="{y - 9:.0f}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14:.0f}" y="{y:.0f}">{escape(name)}</text>')
        x += 22 + 6.5 * len(name)
    return parts


def _decades(lo: float, hi: float) -> tuple[int, int]:
    """Powers of ten that bracket [lo, hi] with a little margin (lo, hi > 0)."""
    low = math.floor(math.log10(lo * 0.8))
    high = math.ceil(math.log10(hi * 1.25))
    return low, max(high, low + 1)


def _tick(power: int) -> str:
    value = 10.0 ** power
    if value >= 1000:
        return f"{value / 1000:g}k" if value < 1e6 else f"{value:.0e}"
    return f"{value:g}"


@dataclass(frozen=True)
class RooflinePoint:
    label: str
    intensity: float  # MACs per DRAM byte
    macs_per_cycle: float
    kind: str  # a key of BOUND_COLOURS: what bounds it; "total" for the whole program
    note: str = ""


def roofline(points: Sequence[RooflinePoint], peak_macs_per_cycle: float,
             dram_bytes_per_cycle: float, title: str = "", width_px: int = 640,
             height_px: int = 420) -> str:
    """Log-log roofline: achieved MACs/cycle against MACs per DRAM byte, under the roof
    min(peak, intensity × bandwidth). One circle per point (class "point"; the whole program's is
    a diamond, class "total"), named on hover by its <title>."""
    ridge = peak_macs_per_cycle / dram_bytes_per_cycle
    xs = [p.intensity for p in points] + [ridge]
    ys = [p.macs_per_cycle for p in points] + [peak_macs_per_cycle]
    x0, x1 = _decades(min(xs), max(xs))
    y0, y1 = _decades(min(ys), max(ys))
    left, right, top, bottom = 60, 20, 50, 45
    plot_w, plot_h = width_px - left - right, height_px - top - bottom

    def px(x: float) -> float:
        return left + (math.log10(x) - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (math.log10(y) - y0) / (y1 - y0) * plot_h

    parts = _svg_open(width_px, height_px, title)
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
                 f'stroke="#999"/>')
    for k in range(x0, x1 + 1):
        x = px(10.0 ** k)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" '
                     f'stroke="#eee"/><text x="{x:.1f}" y="{top + plot_h + 14}" '
                     f'text-anchor="middle">{_tick(k)}</text>')
    for k in range(y0, y1 + 1):
        y = py(10.0 ** k)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                     f'stroke="#eee"/><text x="{left - 4}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{_tick(k)}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.0f}" y="{height_px - 8}" text-anchor="middle">'
                 f'arithmetic intensity (MACs per DRAM byte)</text>')
    parts.append(f'<text x="14" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">MACs per cycle</text>')
    # The roof: the DRAM slope from the left edge (or where it enters the plot) to the ridge,
    # then the array's peak.
    x_start = max(10.0 ** x0, 10.0 ** y0 / dram_bytes_per_cycle)
    roof = [(x_start, x_start * dram_bytes_per_cycle), (ridge, peak_macs_per_cycle),
            (10.0 ** x1, peak_macs_per_cycle)]
    path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in roof)
    parts.append(f'<polyline class="roof" points="{path}" fill="none" stroke="#333" '
                 f'stroke-width="2"><title>roof: min({peak_macs_per_cycle:g} MACs/cycle, '
                 f'intensity × {dram_bytes_per_cycle:g} B/cycle); ridge at {ridge:.3g} MACs/B'
                 f'</title></polyline>')
    peak_text = f"array peak {peak_macs_per_cycle:g} MACs/cycle"
    parts.append(f'<text x="{left + plot_w - 4}" y="{py(peak_macs_per_cycle) - 5:.1f}" '
                 f'text-anchor="end">{escape(peak_text)}</text>')
    labels = _Labels((left, top, left + plot_w, top + plot_h))
    labels.taken.append((left + plot_w - 4 - _text_px(peak_text), py(peak_macs_per_cycle) - 16,
                         left + plot_w - 4, py(peak_macs_per_cycle) - 2))
    for p in points:
        x, y = px(p.intensity), py(p.macs_per_cycle)
        labels.taken.append((x - 7, y - 7, x + 7, y + 7))
    # The whole program's label first: it is the one a reader looks for. Beyond a dozen
    # points, labels would crowd the plot: the layers are then named on hover only.
    label_all = len(points) <= 12
    for p in sorted(points, key=lambda p: p.kind != "total"):
        if label_all or p.kind == "total":
            parts += labels.place(p.label[:24], px(p.intensity), py(p.macs_per_cycle))
    for p in points:
        x, y = px(p.intensity), py(p.macs_per_cycle)
        tip = f"<title>{escape(p.label)}: {p.intensity:.3g} MACs/B, {p.macs_per_cycle:.3g} " \
              f"MACs/cycle{escape(p.note)}</title>"
        if p.kind == "total":
            parts.append(f'<path class="total" d="M{x:.1f},{y - 7:.1f} l7,7 l-7,7 l-7,-7 z" '
                         f'fill="#222">{tip}</path>')
        else:
            colour = BOUND_COLOURS.get(p.kind, "#666")
            parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="5" '
                         f'fill="{colour}" fill-opacity="0.85" stroke="#fff">{tip}</circle>')
    parts += _legend([(f"bound by {k}", BOUND_COLOURS[k]) for k in ("array", "dram", "vector")]
                     + [("whole program", "#222")], left + 4, 38)
    parts.append("</svg>")
    return "\n".join(parts)


def _text_px(text: str) -> float:
    """A generous width of `text` at the charts' 11 px sans-serif (about 0.55 em a character)."""
    return 6.2 * len(text)


class _Labels:
    """Point labels placed where they neither leave the plot nor cover another label or point:
    beside the point, else above or below it, else further out with a leader line; a label
    that fits nowhere is left out (its point is still named on hover)."""

    # (dx, dy) of the label's anchor from the point, and whether the text ends there.
    _SPOTS = [(8, 4, False), (-8, 4, True), (6, -8, False), (6, 15, False), (-6, -8, True),
              (-6, 15, True)] + [(dx * k, dy * k, dx < 0) for k in (2, 3, 4)
                                 for dx, dy in ((10, -9), (10, 11), (-10, -9), (-10, 11))]

    def __init__(self, plot: tuple[float, float, float, float]):
        self.plot = plot
        self.taken: list[tuple[float, float, float, float]] = []  # boxes: x0, y0, x1, y1

    def place(self, text: str, x: float, y: float) -> list[str]:
        width = _text_px(text)
        x0, y0, x1, y1 = self.plot
        for dx, dy, ends in self._SPOTS:
            ax, ay = x + dx, y + dy
            box = (ax - width if ends else ax, ay - 10, ax if ends else ax + width, ay + 2)
            if box[0] < x0 + 2 or box[2] > x1 - 2 or box[1] < y0 + 2 or box[3] > y1 - 2:
                continue
            if any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3]
                   for t in self.taken):
                continue
            self.taken.append(box)
            parts = []
            if abs(dx) > 8:
                parts.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{ax:.1f}" y2="{ay - 4:.1f}" '
                             f'stroke="#bbb"/>')
            anchor = ' text-anchor="end"' if ends else ""
            parts.append(f'<text x="{ax:.1f}" y="{ay:.1f}"{anchor} fill="#444">'
                         f'{escape(text)}</text>')
            return parts
        return []


@dataclass(frozen=True)
class StackedBar:
    label: str
    segments: tuple[tuple[str, float, str], ...]  # (name, value, colour), drawn left to right
    note: str = ""  # printed after the bar


def stacked_bars(bars: Sequence[StackedBar], legend: Sequence[tuple[str, str]], unit: str = "",
                 title: str = "", bar_px: int = 14, width_px: int = 640) -> str:
    """Horizontal stacked bars on one shared scale, one row per bar, each segment named on hover."""
    top = max([sum(v for _, v, _ in b.segments) for b in bars] + [1e-9])
    label_px, note_px = 160, 110
    plot_px = width_px - label_px - note_px
    height = 44 + (bar_px + 4) * len(bars) + 10
    parts = _svg_open(width_px, height, title)
    parts += _legend(legend, 4, 34)
    for i, bar in enumerate(bars):
        y = 44 + i * (bar_px + 4)
        parts.append(f'<text x="{label_px - 4}" y="{y + bar_px - 3}" text-anchor="end">'
                     f'{escape(bar.label[:26])}</text>')
        x = float(label_px)
        for name, value, colour in bar.segments:
            w = max(0.0, value) / top * plot_px
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_px}" '
                         f'fill="{colour}"><title>{escape(bar.label)}: {escape(name)} '
                         f'{value:,.0f} {escape(unit)}</title></rect>')
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + bar_px - 3}">{escape(bar.note)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


@dataclass(frozen=True)
class TimelineRow:
    label: str
    spans: tuple[tuple[str, int, int, str], ...]  # (lane, start, end, hover text); lane names a
    # key of UNIT_COLOURS


def timeline(rows: Sequence[TimelineRow], total_cycles: int, lanes: Sequence[str],
             title: str = "", width_px: int = 640) -> str:
    """One row per layer with one thin lane per unit: the span from the first to the last of
    the layer's instructions on that unit (the busy share is in the hover text)."""
    lane_px = 4
    row_px = lane_px * len(lanes) + 6
    label_px, right = 160, 20
    plot_px = width_px - label_px - right
    height = 44 + row_px * len(rows) + 24
    scale = plot_px / max(total_cycles, 1)
    parts = _svg_open(width_px, height, title)
    parts += _legend([(lane, UNIT_COLOURS.get(lane, "#666")) for lane in lanes], label_px, 34)
    for i, row in enumerate(rows):
        y0 = 44 + i * row_px
        parts.append(f'<text x="{label_px - 4}" y="{y0 + row_px / 2 + 3:.0f}" '
                     f'text-anchor="end">{escape(row.label[:26])}</text>')
        for lane, start, end, text in row.spans:
            y = y0 + lanes.index(lane) * lane_px if lane in lanes else y0
            h = lane_px if lane in lanes else lane_px * len(lanes)
            parts.append(f'<rect x="{label_px + start * scale:.1f}" y="{y}" '
                         f'width="{max((end - start) * scale, 0.5):.1f}" height="{h}" '
                         f'fill="{UNIT_COLOURS.get(lane, "#666")}"><title>{escape(text)}'
                         f'</title></rect>')
    axis_y = 44 + row_px * len(rows) + 4
    parts.append(f'<line x1="{label_px}" y1="{axis_y}" x2="{label_px + plot_px}" y2="{axis_y}" '
                 f'stroke="#999"/><text x="{label_px}" y="{axis_y + 14}">0</text>'
                 f'<text x="{label_px + plot_px}" y="{axis_y + 14}" text-anchor="end">'
                 f'{total_cycles:,} cycles</text>')
    parts.append("</svg>")
    return "\n".join(parts)


@dataclass(frozen=True)
class ScatterPoint:
    label: str  # printed beside front points
    x: float
    y: float
    on_front: bool
    note: str = ""  # hover text


def _nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) that cover [lo, hi]."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int(math.ceil((hi - first) / step)) + 1)]


def _tick_text(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:.4g}"


def scatter(points: Sequence[ScatterPoint], x_label: str, y_label: str, title: str = "",
            width_px: int = 640, height_px: int = 420) -> str:
    """Every point as a grey dot (class "point"), the Pareto front's as larger coloured dots
    (class "front") joined by the staircase that bounds what can be reached; linear axes from
    zero-rounded ticks. Points are named on hover."""
    xs = _nice_ticks(min(p.x for p in points), max(p.x for p in points))
    ys = _nice_ticks(min(p.y for p in points), max(p.y for p in points))
    left, right, top, bottom = 70, 20, 50, 45
    plot_w, plot_h = width_px - left - right, height_px - top - bottom

    def px(x: float) -> float:
        return left + (x - xs[0]) / (xs[-1] - xs[0]) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - ys[0]) / (ys[-1] - ys[0]) * plot_h

    parts = _svg_open(width_px, height_px, title)
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
                 f'stroke="#999"/>')
    for x in xs:
        parts.append(f'<line x1="{px(x):.1f}" y1="{top}" x2="{px(x):.1f}" y2="{top + plot_h}" '
                     f'stroke="#eee"/><text x="{px(x):.1f}" y="{top + plot_h + 14}" '
                     f'text-anchor="middle">{_tick_text(x)}</text>')
    for y in ys:
        parts.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + plot_w}" y2="{py(y):.1f}" '
                     f'stroke="#eee"/><text x="{left - 4}" y="{py(y) + 4:.1f}" '
                     f'text-anchor="end">{_tick_text(y)}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.0f}" y="{height_px - 8}" text-anchor="middle">'
                 f'{escape(x_label)}</text>')
    parts.append(f'<text x="14" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">{escape(y_label)}</text>')
    front = sorted((p for p in points if p.on_front), key=lambda p: (p.x, p.y))
    if len(front) > 1:  # the staircase: each front point holds until the next one is reached
        steps = [(front[0].x, front[0].y)]
        for p in front[1:]:
            steps += [(p.x, steps[-1][1]), (p.x, p.y)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in steps)
        parts.append(f'<polyline class="staircase" points="{path}" fill="none" '
                     f'stroke="{_COLOURS[1]}" stroke-width="1.5"/>')
    for p in sorted(points, key=lambda p: p.on_front):
        tip = f"<title>{escape(p.label)}: {escape(p.note)}</title>"
        if p.on_front:
            parts.append(f'<circle class="front" cx="{px(p.x):.1f}" cy="{py(p.y):.1f}" r="5" '
                         f'fill="{_COLOURS[1]}" stroke="#fff">{tip}</circle>')
        else:
            parts.append(f'<circle class="point" cx="{px(p.x):.1f}" cy="{py(p.y):.1f}" r="3.5" '
                         f'fill="#999" fill-opacity="0.7">{tip}</circle>')
    labels = _Labels((left, top, left + plot_w, top + plot_h))
    for p in points:
        labels.taken.append((px(p.x) - 5, py(p.y) - 5, px(p.x) + 5, py(p.y) + 5))
    if len(front) <= 16:
        for p in front:
            parts += labels.place(p.label, px(p.x), py(p.y))
    parts += _legend([("Pareto front", _COLOURS[1]), ("other points", "#999")], left + 4, 38)
    parts.append("</svg>")
    return "\n".join(parts)
