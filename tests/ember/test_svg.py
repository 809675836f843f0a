"""The report charts' layout: the roofline's point labels stay inside the plot and apart."""

from __future__ import annotations

import re

from ember.reports.svg import RooflinePoint, roofline


def _label_boxes(svg: str) -> list[tuple[str, float, float, float, float]]:
    """(text, x0, y0, x1, y1) of each point label, at the charts' 11 px font (6.2 px a
    character, generous)."""
    boxes = []
    for attrs, text in re.findall(r'<text ([^>]*fill="#444"[^>]*)>([^<]*)</text>', svg):
        x, y = (float(re.search(rf'{k}="([-\d.]+)"', attrs).group(1)) for k in ("x", "y"))
        width = 6.2 * len(text)
        x0 = x - width if 'text-anchor="end"' in attrs else x
        boxes.append((text, x0, y - 10, x0 + width, y + 2))
    return boxes


def test_roofline_labels_stay_inside_and_do_not_overlap() -> None:
    """A point at the right edge (its label used to run off the chart) and three points on
    one spot (their labels used to print over each other) are all labelled, legibly."""
    points = [RooflinePoint("layer_at_the_right_edge", 95.0, 200.0, "array"),
              RooflinePoint("fc1", 1.0, 13.0, "dram"), RooflinePoint("fc2", 1.0, 12.5, "dram"),
              RooflinePoint("whole program", 1.0, 13.5, "total")]
    width = 640
    svg = roofline(points, 256, 16, width_px=width)
    boxes = _label_boxes(svg)
    assert sorted(text for text, *_ in boxes) == sorted(p.label for p in points)
    for text, x0, y0, x1, y1 in boxes:
        assert 0 <= x0 and x1 <= width - 20, text  # inside the plot's right edge
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not (a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]), (a, b)
