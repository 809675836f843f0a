"""The JSON performance report's stable keys and the Chrome trace's schema."""

import json
from collections import defaultdict

import pytest

from simulator import machine, trace
from simulator.stats import UNITS
from tests.simulator.sim_programs import gemm_data, gemm_program


@pytest.fixture(scope="module")
def run():
    data = gemm_data()
    prog = gemm_program(*data)
    return prog, machine.run(prog, {"x": data[0]})


def test_report_keys(run):
    _, result = run
    report = json.loads(json.dumps(result.stats.to_report()))
    for key, kind in [("cycles", int), ("time_ms", float), ("bound_cycles", int),
                      ("peak_macs_per_cycle", int), ("dram_bytes_per_cycle", int),
                      ("compulsory_dram_bytes", int),
                      ("utilization", dict), ("dram_bytes_read", int),
                      ("dram_bytes_written", int), ("energy_uj", float), ("layers", list)]:
        assert isinstance(report[key], kind), key
    assert set(report["utilization"]) == set(UNITS.values()) | {"dram", "host"}
    assert report["host_cycles"] == 0 and report["host_segments"] == []
    assert all(0 <= v <= 1 for v in report["utilization"].values())
    assert report["time_ms"] == pytest.approx(report["cycles"] / 1e6)
    for layer in report["layers"]:
        assert {"name", "cycles", "macs", "bound_cycles"} <= set(layer)
        assert layer["unit"] == "accelerator"
        assert layer["bound_cycles"] <= layer["cycles"]
        # Each unit's busy time and span lie inside the layer's span; the vector unit is a roof.
        end = layer["start_cycle"] + layer["cycles"]
        for unit, (start, stop) in layer["unit_spans"].items():
            assert layer["start_cycle"] <= start <= stop <= end
            assert layer["busy_cycles"][unit] <= stop - start
        assert layer["bound_cycles"] >= layer["busy_cycles"]["vector"]
    assert report["bound_cycles"] <= report["cycles"]


def test_energy_adds_up(run):
    prog, result = run
    e = prog.arch.energy
    stats = result.stats
    dram = (stats.dram_bytes_read + stats.dram_bytes_written) * e.dram_byte_pj
    assert stats.energy_uj * 1e6 > stats.macs * e.mac_pj + dram


@pytest.mark.parametrize("level", trace.LEVELS)
def test_trace_schema(run, level):
    prog, result = run
    doc = json.loads(json.dumps(trace.chrome_trace(prog, result.timeline, level)))
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names.values()) == sorted(UNITS.values())
    slices = defaultdict(list)
    for e in events:
        assert e["ph"] in ("M", "X", "C")
        if e["ph"] == "X":
            assert e["tid"] in names and e["dur"] >= 0 and "cycles" in e["args"]
            slices[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in slices.values():  # slices on one thread nest or are disjoint
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end in spans:
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-9
            stack.append(end)
    kinds = {e["cat"] for e in events if e["ph"] == "X"}
    assert kinds == ({"layer", "instruction"} if level == "instruction" else {"layer"})
    assert any(e["ph"] == "C" for e in events)
    last = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X")
    assert last == pytest.approx(result.stats.cycles / prog.arch.clock_mhz)
