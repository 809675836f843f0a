"""The sweep's HTML page: the Pareto plots of cycles against area and against energy, the best
point per objective, the fronts, every point and the failed ones with their reasons."""

from __future__ import annotations

from markupsafe import Markup

from ember.reports.html import render_page
from ember.reports.svg import ScatterPoint, scatter

OBJECTIVE_NAMES = {"cycles": "fewest cycles", "energy_uj": "least energy",
                   "area_mm2": "smallest area"}


def render_sweep(doc: dict) -> str:
    ok = [p for p in doc["points"] if p["status"] == "ok"]
    keys = list(doc["space"]["axes"])
    by_index = {p["index"]: p for p in doc["points"]}
    plots = {}
    for name, (x, x_label) in {"cycles_area": ("area_mm2", "area (mm²)"),
                               "cycles_energy": ("energy_uj", "energy (µJ)")}.items():
        front = set(doc["pareto"][name])
        plots[name] = Markup(scatter(
            [ScatterPoint(f"#{p['index']}", p[x], p["cycles"], p["index"] in front,
                          _describe(p, keys)) for p in ok],
            x_label, "cycles", f"cycles against {x_label}")) if ok else ""
    best = [(OBJECTIVE_NAMES[objective], by_index[index])
            for objective, index in doc["best"].items()]
    fronts = {name: [by_index[i] for i in indices] for name, indices in doc["pareto"].items()}
    failed = [p for p in doc["points"] if p["status"] != "ok"]
    return render_page("sweep.html.j2", doc=doc, keys=keys, plots=plots, best=best,
                       fronts=fronts, ok=sorted(ok, key=lambda p: (p["cycles"], p["index"])),
                       failed=failed,
                       on_front={i for indices in doc["pareto"].values() for i in indices})


def _describe(point: dict, keys: list[str]) -> str:
    config = ", ".join(f"{k} = {point['config'][k]}" for k in keys)
    return (f"{config}; {point['cycles']:,} cycles, {point['energy_uj']:.3f} µJ, "
            f"{point['area_mm2']:.3f} mm²")
