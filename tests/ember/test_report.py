"""`ember report`: the performance report of a program (or a saved JSON report) as a table,
JSON with the documented keys and a self-contained HTML page; host segments; bad input."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from ember.reports.performance import PerformanceReport
from tests.cli import DIGITS, invoke


@pytest.fixture(scope="module")
def digits(digits_profile, tmp_path_factory):
    """The digits CNN compiled for the default target, and one held-out image."""
    tmp = tmp_path_factory.mktemp("report")
    program = tmp / "digits.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "-o", program)
    assert result.exit_code == 0, result.output
    with np.load(DIGITS / "eval.npz") as data:
        np.savez(tmp / "sample.npz", input=data["input"][:1])
    return tmp, program, tmp / "sample.npz"


def test_report_of_a_program(digits) -> None:
    tmp, program, sample = digits
    html, out = tmp / "perf.html", tmp / "perf.json"
    result = invoke("report", program, "-i", sample, "--html", html, "-o", out)
    assert result.exit_code == 0, result.output
    for text in ("roofline bound", "per layer", "conv1", "conv2", "pool", "fc", "vector",
                 "compulsory DRAM", "energy", "util", "what sets it",
                 "MACs issued to the array", "model MACs"):
        assert text in result.output, text
    assert re.search(r"conv2\s+array\s+[\d,]+\s+\d+%\s+294,912\s+\d+%\s+[\d,]+ array",
                     result.output)
    doc = json.loads(out.read_text())
    for key in ("cycles", "time_ms", "bound_cycles", "bound_ratio", "utilization", "macs",
                "peak_macs_per_cycle", "dram_bytes_per_cycle", "dram_bytes",
                "compulsory_dram_bytes", "dram_traffic_ratio", "energy_uj", "host_cycles",
                "host_segments", "layers", "run", "model_macs"):
        assert key in doc, key
    assert 0 < doc["model_macs"] <= doc["macs"]
    assert 0 < doc["bound_ratio"] <= 1 and doc["dram_traffic_ratio"] >= 1
    names = [layer["name"] for layer in doc["layers"]]
    assert names == ["conv1", "conv2", "pool", "fc"]
    for layer in doc["layers"]:
        for key in ("kind", "unit", "cycles", "share", "macs", "array_utilization",
                    "bound_cycles", "bound_by", "dram_bytes", "intensity_macs_per_byte",
                    "busy_cycles", "unit_spans"):
            assert key in layer, key
        assert layer["bound_by"] in ("array", "dram", "vector")
        assert layer["bound_cycles"] <= layer["cycles"]
    kinds = {layer["name"]: layer["kind"] for layer in doc["layers"]}
    assert kinds == {"conv1": "array", "conv2": "array", "pool": "vector", "fc": "array"}
    page = html.read_text()
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    roofline = page[page.index("<h2>Roofline</h2>"):page.index("<h2>Where the cycles go")]
    with_macs = [layer["name"] for layer in doc["layers"] if layer["macs"]]
    assert roofline.count('class="point"') == len(with_macs) == 3
    for name in with_macs:
        assert re.search(rf'class="point"[^>]*><title>{name}: ', roofline), name
    assert 'class="roof"' in roofline and 'class="total"' in roofline
    assert "pool (vector)" in roofline  # the layer without MACs is named beside the plot
    assert page.count("<svg") == 4  # roofline, cycles, utilization, timeline


def test_layer_shares_are_exclusive_and_add_up_to_the_run(digits) -> None:
    """Spans overlap (fc's weights load while conv2 computes: the spans add up to more than the
    run); the exclusive cycles, what each layer adds past the ones before it, add up to it."""
    _, program, sample = digits
    doc = json.loads(invoke("report", program, "-i", sample, "--json").output)
    layers = doc["layers"]
    fc_span = layers[-1]["cycles"]
    assert re.search(rf"fc\s+[\d,]+\s+{doc['cycles']:,}\s+{fc_span:,}\s",
                     invoke("report", program, "-i", sample).output)
    assert sum(layer["cycles"] for layer in layers) > doc["cycles"]
    assert sum(layer["exclusive_cycles"] for layer in layers) == doc["cycles"]
    assert sum(layer["share"] for layer in layers) == pytest.approx(1.0)
    fc = layers[-1]
    assert fc["exclusive_cycles"] == doc["cycles"] - max(
        layer["start_cycle"] + layer["cycles"] for layer in layers[:-1])
    assert fc["exclusive_cycles"] < fc["cycles"]


def test_a_report_without_start_cycles_reads_its_layers_back_to_back() -> None:
    doc = {"report_version": 1, "arch": "x", "clock_mhz": 1.0, "cycles": 40, "bound_cycles": 10,
           "macs": 0, "peak_macs_per_cycle": 1, "dram_bytes_per_cycle": 1,
           "layers": [{"name": "a", "cycles": 10}, {"name": "b", "cycles": 30}]}
    report = PerformanceReport.from_report(doc)
    assert [(layer.exclusive_cycles, layer.share) for layer in report.layers] == \
        [(10, 0.25), (30, 0.75)]


def test_saved_json_renders_the_same_and_simulate_writes_html(digits) -> None:
    tmp, program, sample = digits
    saved, page = tmp / "sim.json", tmp / "sim.html"
    assert invoke("simulate", program, "-i", sample, "--report", saved).exit_code == 0
    result = invoke("simulate", program, "-i", sample, "--report", page)
    assert result.exit_code == 0, result.output
    assert "per layer" in result.output
    assert page.read_text().startswith("<!DOCTYPE html>") and 'class="point"' in page.read_text()
    rendered = invoke("report", saved, "--json")
    assert rendered.exit_code == 0, rendered.output
    doc = json.loads(rendered.output)
    assert doc["cycles"] == json.loads(saved.read_text())["cycles"]
    no_input = json.loads(invoke("report", program, "--json").output)  # zero-point inputs
    assert no_input["cycles"] == doc["cycles"]


def _host_doc() -> dict:
    """A hand-made report with a host segment, as the simulator writes them."""
    return {
        "report_version": 1, "arch": "default", "clock_mhz": 1000, "cycles": 10000,
        "time_ms": 0.01, "bound_cycles": 2000, "instructions": 50, "macs": 262144,
        "peak_macs_per_cycle": 256, "dram_bytes_per_cycle": 16, "mac_utilization": 0.1,
        "utilization": {"load": 0.5, "array": 0.3, "vector": 0.1, "store": 0.1, "dram": 0.4},
        "dram_bytes_read": 30000, "dram_bytes_written": 5000, "compulsory_dram_bytes": 25000,
        "energy_uj": 4.2, "host_cycles": 3000,
        "host_segments": [{"name": "host0", "nodes": ["softmax", "<b>concat</b>"],
                           "cycles": 3000, "read_bytes": 400, "write_bytes": 40,
                           "compute_cycles": 2500}],
        "layers": [
            {"name": "conv1", "unit": "accelerator", "cycles": 6000, "start_cycle": 0,
             "macs": 262144, "dram_bytes": 20000, "bound_cycles": 1250, "bound_by": "dram",
             "busy_cycles": {"load": 3000, "array": 1100, "vector": 300, "store": 200},
             "unit_spans": {"load": [0, 5000], "array": [100, 5800], "vector": [200, 5900],
                            "store": [300, 6000]}},
            {"name": "host0", "unit": "host", "cycles": 3000, "start_cycle": 6000, "macs": 0,
             "dram_bytes": 440, "bound_cycles": 3000, "bound_by": "host"},
            {"name": "pool", "unit": "accelerator", "cycles": 1000, "start_cycle": 9000,
             "macs": 0, "dram_bytes": 1000, "bound_cycles": 400, "bound_by": "vector",
             "busy_cycles": {"load": 100, "array": 0, "vector": 400, "store": 100},
             "unit_spans": {"load": [9000, 9100], "vector": [9100, 9900],
                            "store": [9900, 10000]}},
        ],
    }


def test_host_segments_have_their_own_rows_and_colour() -> None:
    report = PerformanceReport.from_report(_host_doc())
    out = io.StringIO()
    report.print(Console(file=out, width=160))
    text = out.getvalue()
    assert "host segments" in text and "host0" in text and "3,000" in text and "30%" in text
    assert [layer.kind for layer in report.layers] == ["array", "host", "vector"]
    doc = report.to_json()
    assert doc["host_cycles"] == 3000 and doc["host_share"] == pytest.approx(0.3)
    assert doc["host_segments"][0]["compute_cycles"] == 2500
    page = report.html()
    assert "<h2>Host segments</h2>" in page and "&lt;b&gt;concat&lt;/b&gt;" in page
    assert "<b>concat</b>" not in page
    assert page.count('class="point"') == 1  # only conv1 has MACs on the accelerator
    assert "host0 on the host: 3,000 cycles" in page  # the timeline's host row
    assert "#b279a2" in page  # the host colour in the cycles chart


def test_report_of_a_program_with_a_host_segment(digits, digits_profile) -> None:
    tmp, _, sample = digits
    program = tmp / "host.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "--keep-fp32", "pool", "--allow-host", "-o", program)
    assert result.exit_code == 0, result.output
    result = invoke("report", program, "-i", sample, "--json", "--html", tmp / "host.html")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    (segment,) = doc["host_segments"]
    assert doc["host_cycles"] == segment["cycles"] > 0
    host_rows = [layer for layer in doc["layers"] if layer["kind"] == "host"]
    assert [layer["name"] for layer in host_rows] == [segment["name"]]
    page = (tmp / "host.html").read_text()
    assert "<h2>Host segments</h2>" in page and "host compute" in page


def test_report_without_host_keys_or_layers_still_renders() -> None:
    doc = _host_doc()
    for key in ("host_cycles", "host_segments"):
        del doc[key]
    doc["layers"] = [doc["layers"][0]]
    report = PerformanceReport.from_report(doc)
    assert report.host_cycles == 0 and "Host segments" not in report.html()
    doc["layers"] = []
    assert "<svg" in PerformanceReport.from_report(doc).html()


@pytest.mark.parametrize("make,message", [
    (lambda tmp: tmp / "missing.ember", "missing.ember: no such file"),
    (lambda tmp: DIGITS / "model.onnx", "not an ember program"),
    (lambda tmp: DIGITS / "eval.npz", "not an ember program"),
    (lambda tmp: _write(tmp / "bad.json", "{not json"), "not a JSON performance report"),
    (lambda tmp: _write(tmp / "other.json", '{"format": "ember.profile"}'),
     "not an ember performance report"),
    (lambda tmp: _write(tmp / "broken.json", json.dumps({**_host_doc(), "layers": 5})),
     "malformed performance report"),
    (lambda tmp: _write(tmp / "future.json", json.dumps({**_host_doc(), "report_version": 2})),
     "future.json: report version 2, but this ember reads version 1"),
    (lambda tmp: _write(tmp / "text.json", json.dumps({**_host_doc(), "report_version": "1"})),
     "text.json: report version '1'"),
    # Found by the fuzzers (benchmarks/fuzz.py): each was an internal error while rendering.
    (lambda tmp: _write(tmp / "r.json", json.dumps({**_host_doc(), "dram_bytes_read": {}})),
     "malformed performance report: dram_bytes_read = {}: expected a non-negative integer"),
    (lambda tmp: _write(tmp / "r.json", json.dumps({**_host_doc(), "clock_mhz": [1]})),
     "clock_mhz = [1]: expected a positive, finite number"),
    (lambda tmp: _write(tmp / "r.json", json.dumps({**_host_doc(), "utilization": {"load": "x"}})),
     "utilization = {'load': 'x'}: expected an object of finite numbers"),
    (lambda tmp: _write(tmp / "r.json", json.dumps(_edited(_host_doc(), "layers", 0, "macs",
                                                           None))),
     "layers[0].macs = None: expected a non-negative integer"),
    (lambda tmp: _write(tmp / "r.json", json.dumps(_edited(_host_doc(), "host_segments", 0,
                                                           "compute_cycles", [2]))),
     "host_segments[0].compute_cycles = [2]"),
    (lambda tmp: _write(tmp / "r.json", json.dumps(_edited(_host_doc(), "layers", 0,
                                                           "unit_spans", {"load": [5, 1]}))),
     "layers[0].unit_spans = {'load': [5, 1]}: expected an object of [start, end] cycle pairs"),
    (lambda tmp: _write(tmp / "r.json", json.dumps({**_host_doc(), "run": {"tool": 3.5}})),
     "run = {'tool': 3.5}: expected an object of objects tool, program, inputs and options"),
    (lambda tmp: _write(tmp / "r.json", json.dumps({**_host_doc(), "run": {"options": 1}})),
     "run = {'options': 1}: expected an object of objects"),
    (lambda tmp: _write(tmp / "r.json", json.dumps({**_host_doc(), "note": float("nan")})),
     "r.json: not a JSON performance report: NaN is not JSON"),
])
def test_bad_input_is_one_line_with_exit_2(tmp_path, make, message) -> None:
    result = invoke("report", make(tmp_path))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output


def _edited(doc: dict, *path_and_value) -> dict:
    """`doc` with the element at the path (keys and indices) set to the last argument."""
    *path, key, value = path_and_value
    node = doc
    for part in path:
        node = node[part]
    node[key] = value
    return doc


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
