"""The performance report: one object built from the simulator's JSON report (`ember simulate
--report`), rendered as a terminal table, JSON and a self-contained HTML page.

Every figure comes from the simulator's report; this module only derives ratios from it:
a layer's exclusive cycles and share of the run (`LayerPerf.exclusive_cycles`), its array
utilization (MACs / (peak × its span)), its arithmetic intensity (MACs per DRAM byte) and achieved MACs per cycle for the roofline, the whole run
against its roofline bound and its DRAM traffic against the compulsory bytes. "MACs" are those
issued to the array (`macs`), zero blocks of grouped convolutions included; the bound counts
the model's (`model_macs`), which the totals show beside them. Host segments (a
program's nodes that run on the host CPU) are shown, when the report has them, beside the
accelerator's layers with what they cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup
from rich import box
from rich.console import Console
from rich.table import Table

from ember.errors import EmberError
from ember.reports.html import render_page
from ember.reports.svg import (BOUND_COLOURS, RooflinePoint, StackedBar, TimelineRow, bar_chart,
                               roofline, stacked_bars, timeline)
from simulator.stats import REPORT_VERSION

UNITS = ("load", "array", "vector", "store")
# Keys the report cannot be drawn without; the rest default (older reports, hand-made ones).
REQUIRED = ("report_version", "arch", "clock_mhz", "cycles", "bound_cycles", "macs", "layers",
            "peak_macs_per_cycle", "dram_bytes_per_cycle")


@dataclass(frozen=True)
class LayerPerf:
    """One layer (a source node of the program) or host segment, with the derived figures."""

    name: str
    kind: str  # array | vector | dma (data movement only) | host
    cycles: int  # its span: first instruction's start to last one's end (spans overlap)
    # What it adds to the run: its end minus the latest end of the layers before it in program
    # order (0 when it ends inside them), the first counting from cycle 0. These sum to the run.
    exclusive_cycles: int
    start_cycle: int | None
    macs: int
    dram_bytes: int
    bound_cycles: int
    bound_by: str  # array | dram | vector | host
    busy_cycles: dict
    unit_spans: dict
    share: float  # exclusive cycles / the run's cycles: the shares sum to 100%
    array_utilization: float  # MACs / (peak MACs per cycle × cycles)
    macs_per_cycle: float
    intensity: float | None  # MACs per DRAM byte; None without DRAM traffic

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "cycles": self.cycles,
                "exclusive_cycles": self.exclusive_cycles, "start_cycle": self.start_cycle,
                "share": self.share, "macs": self.macs,
                "array_utilization": self.array_utilization,
                "macs_per_cycle": self.macs_per_cycle,
                "intensity_macs_per_byte": self.intensity, "dram_bytes": self.dram_bytes,
                "bound_cycles": self.bound_cycles, "bound_by": self.bound_by,
                "busy_cycles": self.busy_cycles, "unit_spans": self.unit_spans}


@dataclass(frozen=True)
class PerformanceReport:
    doc: dict  # the simulator's report, as `ember simulate --report` writes it
    layers: tuple[LayerPerf, ...]
    host_segments: tuple[dict, ...]

    @classmethod
    def from_report(cls, doc: dict, source: str = "") -> "PerformanceReport":
        where = source or "report"
        if not isinstance(doc, dict):
            raise EmberError(f"{where}: not an ember performance report (expected a JSON object)")
        missing = [key for key in REQUIRED if key not in doc]
        if missing:
            raise EmberError(f"{where}: not an ember performance report, or one from an older "
                             f"ember: no {', '.join(missing)} (rerun `ember simulate --report`)")
        if type(doc["report_version"]) is not int or doc["report_version"] != REPORT_VERSION:
            raise EmberError(f"{where}: report version {doc['report_version']!r}, but this ember "
                             f"reads version {REPORT_VERSION} (rerun `ember simulate --report`)")
        _check(doc, _REPORT, where, "")
        for i, layer in enumerate(doc["layers"]):
            _check(layer, _LAYER, where, f"layers[{i}].")
        for i, segment in enumerate(doc.get("host_segments", ())):
            _check(segment, _SEGMENT, where, f"host_segments[{i}].")
        try:
            total = max(int(doc["cycles"]), 1)
            peak = int(doc["peak_macs_per_cycle"])
            layers, latest_end = [], 0
            for raw in doc["layers"]:
                layers.append(_layer(raw, latest_end, total, peak, where))
                latest_end += layers[-1].exclusive_cycles
            segments = tuple(dict(s) for s in doc.get("host_segments") or ())
        except (TypeError, ValueError, AttributeError) as err:
            raise EmberError(f"{where}: malformed performance report: {err}") from None
        return cls(doc, tuple(layers), segments)

    # Derived totals.
    @property
    def cycles(self) -> int:
        return int(self.doc["cycles"])

    @property
    def bound_ratio(self) -> float:
        return self.doc["bound_cycles"] / self.cycles if self.cycles else 0.0

    @property
    def dram_bytes(self) -> int:
        return int(self.doc.get("dram_bytes_read", 0)) + int(self.doc.get("dram_bytes_written", 0))

    @property
    def host_cycles(self) -> int:
        if "host_cycles" in self.doc:
            return int(self.doc["host_cycles"])
        return sum(int(s.get("cycles", 0)) for s in self.host_segments)

    def to_json(self) -> dict[str, Any]:
        """The simulator's report, every key kept, plus the derived figures (see --help)."""
        doc = dict(self.doc)
        compulsory = doc.get("compulsory_dram_bytes")
        doc.update({
            "bound_ratio": self.bound_ratio,
            "dram_bytes": self.dram_bytes,
            "dram_traffic_ratio": self.dram_bytes / compulsory if compulsory else None,
            "host_cycles": self.host_cycles,
            "host_share": self.host_cycles / self.cycles if self.cycles else 0.0,
            "host_segments": list(self.host_segments),
            "layers": [{**raw, **layer.to_json()}  # the simulator's keys, plus the derived
                       for raw, layer in zip(self.doc["layers"], self.layers)],
        })
        return doc

    # Terminal.
    def print(self, console: Console) -> None:
        doc = self.doc
        title = f"ember report: {doc['arch']} at {doc['clock_mhz']:g} MHz"
        program = doc.get("run", {}).get("program", {}).get("path")
        table = Table(title=f"{title}, {program}" if program else title, box=box.SIMPLE_HEAD)
        table.add_column("total", no_wrap=True)
        table.add_column("value")
        table.add_row("cycles", f"{self.cycles:,}  ({doc.get('time_ms', 0.0):.4f} ms at "
                                f"{doc['clock_mhz']:g} MHz)")
        table.add_row("roofline bound", f"{doc['bound_cycles']:,} cycles  "
                                        f"({self.bound_ratio:.0%} of actual)")
        if self.host_cycles:
            table.add_row("host segments", f"{self.host_cycles:,} cycles  "
                                           f"({self.host_cycles / max(self.cycles, 1):.0%})")
        peak = doc["peak_macs_per_cycle"]
        table.add_row("MACs issued to the array", f"{doc['macs']:,}  ("
                      f"{doc.get('mac_utilization', 0.0):.1%} of peak {peak}/cycle)")
        if "model_macs" in doc:  # reports before it counted only the issued MACs
            table.add_row("model MACs", f"{doc['model_macs']:,}  ("
                          f"{doc['model_macs'] / max(peak * self.cycles, 1):.1%} of peak; the "
                          f"roofline bound counts these)")
        table.add_row("unit busy", "  ".join(f"{unit} {value:.0%}" for unit, value
                                             in self.utilization.items()))
        compulsory = doc.get("compulsory_dram_bytes")
        traffic = f"{self.dram_bytes:,} B  (read {doc.get('dram_bytes_read', 0):,}, " \
                  f"written {doc.get('dram_bytes_written', 0):,})"
        table.add_row("DRAM traffic", traffic)
        if compulsory:
            table.add_row("compulsory DRAM", f"{compulsory:,} B  (traffic is "
                                             f"{self.dram_bytes / compulsory:.2f}×)")
        table.add_row("energy", f"{doc.get('energy_uj', 0.0):.3f} µJ")
        console.print(table)
        if self.layers:
            console.print(self._layer_table())
            console.print(self._span_table())
        if self.host_segments:
            console.print(self._host_table())

    def _layer_table(self) -> Table:
        table = Table(title="per layer (cycles: what it adds to the run past the layers before "
                            "it, exclusive, so they sum to the total, and their share; MACs: "
                            "issued to the array; util: of the array's peak over its span; "
                            "bound: its own roofline and what sets it)", box=box.SIMPLE_HEAD)
        table.add_column("layer", overflow="fold")
        for column in ("unit", "cycles", "share", "MACs", "util", "bound", "DRAM B"):
            table.add_column(column, justify="left" if column == "unit" else "right",
                             no_wrap=True)
        for layer in self.layers:
            table.add_row(layer.name, layer.kind, f"{layer.exclusive_cycles:,}",
                          f"{layer.share:.0%}", f"{layer.macs:,}",
                          f"{layer.array_utilization:.0%}",
                          f"{layer.bound_cycles:,} {layer.bound_by}", f"{layer.dram_bytes:,}")
        return table

    def _span_table(self) -> Table:
        table = Table(title="per layer spans (its first instruction's start to its last one's "
                            "end; overlap: the cycles of the span before the layers ahead of it "
                            "had ended, such as its weights loading while they compute)",
                      box=box.SIMPLE_HEAD)
        table.add_column("layer", overflow="fold")
        for column in ("start", "end", "span", "overlap"):
            table.add_column(column, justify="right", no_wrap=True)
        for layer in self.layers:
            start = "—" if layer.start_cycle is None else f"{layer.start_cycle:,}"
            end = "—" if layer.start_cycle is None else f"{layer.start_cycle + layer.cycles:,}"
            table.add_row(layer.name, start, end, f"{layer.cycles:,}",
                          f"{layer.cycles - layer.exclusive_cycles:,}")
        return table

    def _host_table(self) -> Table:
        table = Table(title="host segments (run on the host CPU; transfer: cycles not computing)",
                      box=box.SIMPLE_HEAD)
        table.add_column("segment", overflow="fold")
        for column in ("cycles", "share", "compute", "transfer", "read B", "written B"):
            table.add_column(column, justify="right", no_wrap=True)
        for s in self.host_segments:
            cycles, compute = int(s.get("cycles", 0)), int(s.get("compute_cycles", 0))
            table.add_row(str(s.get("name", "")), f"{cycles:,}",
                          f"{cycles / max(self.cycles, 1):.0%}", f"{compute:,}",
                          f"{cycles - compute:,}", f"{int(s.get('read_bytes', 0)):,}",
                          f"{int(s.get('write_bytes', 0)):,}")
        table.caption = "; ".join(f"{s.get('name', '')}: {', '.join(map(str, s.get('nodes', ())))}"
                                  for s in self.host_segments)
        return table

    # HTML.
    def html(self) -> str:
        return render_page("performance.html.j2", report=self, doc=self.doc,
                           roofline=Markup(self.roofline_svg()),
                           cycles=Markup(self.cycles_svg()),
                           utilization=Markup(self.utilization_svg()),
                           timeline=Markup(self.timeline_svg()),
                           off_roofline=[layer for layer in self.layers
                                         if layer not in self.roofline_layers()])

    def roofline_layers(self) -> list[LayerPerf]:
        """Layers that have a place on the roofline: accelerator layers with MACs and traffic."""
        return [layer for layer in self.layers if layer.kind != "host" and layer.macs > 0
                and layer.intensity and layer.cycles > 0]

    def roofline_svg(self) -> str:
        peak, bandwidth = self.doc["peak_macs_per_cycle"], self.doc["dram_bytes_per_cycle"]
        points = []
        for layer in self.roofline_layers():
            roof = min(peak, layer.intensity * bandwidth)
            points.append(RooflinePoint(
                layer.name, layer.intensity, layer.macs_per_cycle, layer.bound_by,
                f" ({layer.macs_per_cycle / roof:.0%} of the roof), {layer.cycles:,} cycles, "
                f"bound by {layer.bound_by}"))
        accelerator_cycles = self.cycles - self.host_cycles
        if self.doc["macs"] and self.dram_bytes and accelerator_cycles > 0:
            points.append(RooflinePoint(
                "whole program", self.doc["macs"] / self.dram_bytes,
                self.doc["macs"] / accelerator_cycles, "total",
                f", {self.bound_ratio:.0%} of its roofline bound"))
        if not points:
            return ""
        return roofline(points, peak, bandwidth,
                        title=f"Roofline of {self.doc['arch']}: {peak} MACs/cycle, "
                              f"{bandwidth} B/cycle DRAM (MACs issued to the array)")

    def cycles_svg(self) -> str:
        bars = []
        segments = {s.get("name"): s for s in self.host_segments}
        for layer in self.layers:
            if layer.kind == "host":
                compute = segments.get(layer.name, {}).get("compute_cycles")
                bars.append(_host_bar(layer.name, layer.cycles, compute, self.cycles))
                continue
            bound = min(layer.bound_cycles, layer.cycles)
            bars.append(StackedBar(layer.name, (
                (f"bound by {layer.bound_by}", bound, BOUND_COLOURS.get(layer.bound_by, "#666")),
                ("above the bound (latency, token waits, overlap)", layer.cycles - bound,
                 "#c8c8c8")), f"{layer.cycles:,} (adds {layer.share:.0%})"))
        named = {layer.name for layer in self.layers}
        for name, segment in segments.items():
            if name not in named:
                bars.append(_host_bar(str(name), int(segment.get("cycles", 0)),
                                      segment.get("compute_cycles"), self.cycles))
        if not bars:
            return ""
        legend = [(f"{k}-bound", BOUND_COLOURS[k]) for k in ("array", "dram", "vector")]
        legend.append(("above the bound", "#c8c8c8"))
        if self.host_cycles or any(layer.kind == "host" for layer in self.layers):
            legend += [("host compute", BOUND_COLOURS["host"]), ("host transfers", "#dcc6d6")]
        return stacked_bars(bars, legend, unit="cycles",
                            title="Where the cycles go: each layer's span against its own bound")

    @property
    def utilization(self) -> dict:
        """Busy share per unit; the host's only when the program has host segments."""
        utilization = dict(self.doc.get("utilization", {}))
        utilization.pop("host", None)
        if self.host_cycles:
            utilization["host"] = self.host_cycles / max(self.cycles, 1)
        return utilization

    def utilization_svg(self) -> str:
        utilization = self.utilization
        if not utilization:
            return ""
        return bar_chart(list(utilization), {"busy": [100 * v for v in utilization.values()]},
                         unit="%", title="Unit utilization: busy cycles / total cycles (%)")

    def timeline_svg(self) -> str:
        rows = []
        for layer in self.layers:
            spans = []
            if layer.kind == "host" and "host" not in layer.unit_spans \
                    and layer.start_cycle is not None:
                spans.append(("host", layer.start_cycle, layer.start_cycle + layer.cycles,
                              f"{layer.name} on the host: {layer.cycles:,} cycles"))
            for unit, (start, end) in layer.unit_spans.items():
                busy = layer.busy_cycles.get(unit, 0)
                spans.append((unit, start, end,
                              f"{layer.name} {unit}: cycles {start:,}–{end:,}, busy {busy:,} "
                              f"({busy / max(end - start, 1):.0%})"))
            if spans:
                rows.append(TimelineRow(layer.name, tuple(spans)))
        if not rows:
            return ""
        return timeline(rows, self.cycles, UNITS + (("host",) if any(
            layer.kind == "host" for layer in self.layers) else ()),
            title="Timeline: each layer's span on each unit (the full timeline is the "
                  "Perfetto trace)")


def _is_count(v) -> bool:
    return type(v) is int and 0 <= v < 1 << 63


def _is_number(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _is_span(v) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(map(_is_count, v)) and v[0] <= v[1]


def _each(check):
    return lambda v: isinstance(v, dict) and all(check(x) for x in v.values())


def _all(check):
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _is_run(v) -> bool:
    """The run record as the HTML page reads it (`simulate.performance_doc` writes it)."""
    parts = ("tool", "program", "inputs", "options")
    if not isinstance(v, dict) or not all(isinstance(v.get(k, {}), dict) for k in parts):
        return False
    texts = [v.get(part, {}).get(key, "") for part, key in (
        ("tool", "name"), ("tool", "version"), ("program", "path"), ("program", "sha256"),
        ("inputs", "path"))]
    return all(isinstance(text, str) for text in texts)


_COUNT = (_is_count, "a non-negative integer")
_POSITIVE = (lambda v: _is_number(v) and v > 0, "a positive, finite number")
_NUMBER = (_is_number, "a finite number")
_TEXT = (lambda v: isinstance(v, str), "a string")
_COUNTS = (_each(_is_count), "an object of non-negative integers")
_OBJECTS = (_all(lambda x: isinstance(x, dict)), "a list of objects")
# Every key the renderings read and what it must hold, so that a hand-edited or damaged report
# is one line naming the key (keys absent from older reports default, beside REQUIRED).
_REPORT = {
    "report_version": _COUNT, "arch": _TEXT, "clock_mhz": _POSITIVE, "cycles": _COUNT,
    "time_ms": _NUMBER, "bound_cycles": _COUNT, "instructions": _COUNT, "macs": _COUNT,
    "model_macs": _COUNT, "peak_macs_per_cycle": (lambda v: _is_count(v) and v > 0,
                                                  "a positive integer"),
    "dram_bytes_per_cycle": _POSITIVE, "mac_utilization": _NUMBER,
    "utilization": (_each(_is_number), "an object of finite numbers"), "busy_cycles": _COUNTS,
    "stall_cycles": _COUNTS, "dram_bytes_read": _COUNT, "dram_bytes_written": _COUNT,
    "compulsory_dram_bytes": _COUNT, "peak_local_bytes": _COUNTS, "energy_uj": _NUMBER,
    "host_cycles": _COUNT, "host_segments": _OBJECTS, "layers": _OBJECTS,
    "run": (_is_run, ("an object of objects tool, program, inputs and options, whose names, "
                      "versions, paths and digests are strings")),
}
_LAYER = {
    "name": _TEXT, "cycles": _COUNT, "start_cycle": (lambda v: v is None or _is_count(v),
                                                     "a non-negative integer or null"),
    "macs": _COUNT, "dram_bytes": _COUNT, "bound_cycles": _COUNT, "bound_by": _TEXT,
    "busy_cycles": _COUNTS, "unit": _TEXT,
    "unit_spans": (_each(_is_span), "an object of [start, end] cycle pairs"),
}
_SEGMENT = {"name": _TEXT, "nodes": (_all(lambda x: isinstance(x, str)), "a list of strings"),
            "cycles": _COUNT, "read_bytes": _COUNT, "write_bytes": _COUNT,
            "compute_cycles": _COUNT}


def _check(doc: dict, schema: dict, where: str, prefix: str) -> None:
    for key, (ok, expected) in schema.items():
        if key in doc and not ok(doc[key]):
            raise EmberError(f"{where}: malformed performance report: {prefix}{key} = "
                             f"{doc[key]!r:.60}: expected {expected}")


def _layer(layer: dict, latest_end: int, total: int, peak: int, where: str) -> LayerPerf:
    """One layer of the report; `latest_end`: the latest end of the layers before it in
    program order (a report without start cycles is read as layers back to back)."""
    try:
        name, cycles = str(layer["name"]), int(layer["cycles"])
    except (KeyError, TypeError, ValueError):
        raise EmberError(f"{where}: a layer without a name or cycles: {layer!r:.80}") from None
    macs, dram = int(layer.get("macs", 0)), int(layer.get("dram_bytes", 0))
    start = layer.get("start_cycle")
    # Spans overlap (a layer's weights load while the one before computes), so they add up to
    # more than the run; what a layer adds past the layers before it adds up to the run's end.
    exclusive = max((latest_end if start is None else int(start)) + cycles - latest_end, 0)
    busy = dict(layer.get("busy_cycles") or {})
    host = layer.get("unit") == "host"
    if host:
        kind = "host"
    elif macs or busy.get("array"):
        kind = "array"
    elif busy.get("vector") or not busy:
        kind = "vector"
    else:
        kind = "dma"
    return LayerPerf(
        name=name, kind=kind, cycles=cycles, exclusive_cycles=exclusive,
        start_cycle=start, macs=macs,
        dram_bytes=dram, bound_cycles=int(layer.get("bound_cycles", cycles if host else 0)),
        bound_by="host" if host else str(layer.get("bound_by", "")), busy_cycles=busy,
        unit_spans={u: tuple(s) for u, s in (layer.get("unit_spans") or {}).items()},
        share=exclusive / total, array_utilization=macs / (peak * cycles) if cycles else 0.0,
        macs_per_cycle=macs / cycles if cycles else 0.0,
        intensity=macs / dram if dram else None)


def _host_bar(name: str, cycles: int, compute: int | None, total: int) -> StackedBar:
    colour = BOUND_COLOURS["host"]
    if compute is None:
        segments = (("host", cycles, colour),)
    else:
        compute = min(int(compute), cycles)
        segments = (("host compute", compute, colour),
                    ("host transfers", cycles - compute, "#dcc6d6"))
    return StackedBar(name, segments, f"{cycles:,} ({cycles / max(total, 1):.0%}) host")

