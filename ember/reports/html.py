"""Self-contained HTML pages from jinja2 templates: inline CSS and SVG, autoescaped."""

from __future__ import annotations

from typing import Any

import jinja2
from markupsafe import Markup

from ember.reports.metrics import SQNR_CAP_DB

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("ember.reports", "templates"),
                          autoescape=True, trim_blocks=True, lstrip_blocks=True)
_ENV.filters["pct"] = lambda v: "—" if v is None else f"{v:.2%}"
_ENV.filters["num"] = lambda v, fmt=".2f": "—" if v is None else format(v, fmt)
# An SQNR, "exact" at the cap (a kernel that only moves codes, say).
_ENV.filters["db"] = lambda v: "—" if v is None else "exact" if v >= SQNR_CAP_DB else f"{v:.2f}"


def render_page(template: str, chart: str = "", **context: Any) -> str:
    """Render a report template; `chart` is SVG built by ember.reports.svg (already escaped)."""
    return _ENV.get_template(template).render(chart=Markup(chart), **context)
