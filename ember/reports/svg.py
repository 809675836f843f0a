"""Small deterministic inline-SVG charts for the HTML reports (no plotting dependency)."""

from __future__ import annotations

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
