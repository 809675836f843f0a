"""`ember disasm` and `ember simulate` through click's CliRunner."""

import dataclasses
import json

import numpy as np
import pytest

from simulator import isa
from tests.cli import invoke
from tests.simulator.sim_programs import gemm_data, gemm_program, gemm_reference


@pytest.fixture
def files(tmp_path):
    data = gemm_data()
    prog = gemm_program(*data)
    prog.save(tmp_path / "g.ember")
    x = data[0].astype(np.float32) * prog.inputs[0].scale
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "raw.npz", x=data[0])
    return tmp_path, data, prog


def test_disasm(files):
    tmp, _, prog = files
    result = invoke("disasm", tmp / "g.ember")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "9 instructions" in lines[0] and "load 4" in lines[0]
    body = [line for line in lines if not line.startswith(";")]
    assert len(body) == len(prog.instructions)
    assert body[5].split()[0] == "5" and body[5].endswith("; fc")
    text = body[5].split(None, 1)[1].split(";")[0]
    assert isa.assemble(text) == prog.instructions[5]


def test_simulate_writes_outputs_report_and_trace(files):
    tmp, data, prog = files
    result = invoke("simulate", tmp / "g.ember", "-i", tmp / "x.npy", "-o", tmp / "out.npz",
                    "--report", tmp / "perf.json", "--trace", tmp / "t.json",
                    "--trace-level", "instruction")
    assert result.exit_code == 0, result.output
    assert "cycles" in result.output and "810" in result.output
    want = gemm_reference(*data)
    out = np.load(tmp / "out.npz")["y"]
    np.testing.assert_allclose(out, prog.outputs[0].dequantize(want))
    report = json.loads((tmp / "perf.json").read_text())
    assert report["cycles"] == 810 and report["layers"][0]["name"] == "fc"
    assert report["run"]["tool"]["name"] == "ember"
    assert json.loads((tmp / "t.json").read_text())["traceEvents"]


def test_simulate_raw_int8_npz_and_json(files):
    tmp, data, _ = files
    result = invoke("simulate", tmp / "g.ember", "-i", tmp / "raw.npz", "-o", tmp / "o.npz",
                    "--raw", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["cycles"] == 810
    np.testing.assert_array_equal(np.load(tmp / "o.npz")["y"], gemm_reference(*data))


def test_simulate_batch(files):
    tmp, data, _ = files
    np.savez(tmp / "b.npz", x=np.stack([data[0], data[0]]))
    result = invoke("simulate", tmp / "g.ember", "-i", tmp / "b.npz", "-o", tmp / "o.npz",
                    "--raw", "--json")
    assert result.exit_code == 0, result.output
    assert np.load(tmp / "o.npz")["y"].shape == (2, 32, 16)


@pytest.mark.parametrize("make,message", [
    (lambda tmp: (tmp / "x.npy", tmp / "x.npy"), "not an ember program"),
    (lambda tmp: (tmp / "g.ember", tmp / "bad.npy"), "expected [32, 16]"),
    (lambda tmp: (tmp / "g.ember", tmp / "wrong.npz"), "the program takes ['x']"),
    (lambda tmp: (tmp / "g.ember", tmp / "missing.npz"), "cannot read inputs"),
])
def test_simulate_errors_exit_2(files, make, message):
    tmp, _, _ = files
    np.save(tmp / "bad.npy", np.zeros((3, 3), np.float32))
    np.savez(tmp / "wrong.npz", y=np.zeros((32, 16), np.float32))
    program, inputs = make(tmp)
    result = invoke("simulate", program, "-i", inputs)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp / "out.npz").exists()


def test_simulate_unwritable_output_exits_2(files):
    tmp, _, _ = files
    result = invoke("simulate", tmp / "g.ember", "-i", tmp / "x.npy", "-o",
                    tmp / "no" / "such" / "dir.npz")
    assert result.exit_code == 2 and "directory" in result.output and "does not exist" in \
        result.output, result.output  # checked before simulating, as for every output


def test_simulate_reports_a_race_unless_told_not_to(tmp_path):
    from simulator.arch import Arch
    from simulator.program import IOBinding, Program
    load = isa.LOAD(mem="scratchpad", sram=0, dram=0, y_size=1, x_size=1, elem_bytes=16,
                    x_stride=16, y_stride=16)
    prog = Program(arch=Arch.load("default"),
                   instructions=[load, isa.PRELOAD(sp=0, k=1), isa.END()],
                   inputs=(IOBinding("x", 0, (16,), 1.0, 0),))
    prog.save(tmp_path / "race.ember")
    np.save(tmp_path / "x.npy", np.zeros(16, np.int8))
    result = invoke("simulate", tmp_path / "race.ember", "-i", tmp_path / "x.npy")
    assert result.exit_code == 2 and "race (read after write)" in result.output
    result = invoke("simulate", tmp_path / "race.ember", "-i", tmp_path / "x.npy",
                    "--no-check-hazards", "--json")
    assert result.exit_code == 0, result.output


def test_no_checks_skips_only_a_race_check_that_passed_before(files, tmp_path, monkeypatch):
    """--no-checks checks a program it has not seen pass, then skips the check for it; a racy
    program never passes, so its race is reported every time."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tmp, _, prog = files
    args = ("simulate", tmp / "g.ember", "-i", tmp / "x.npy", "--json", "--no-checks")
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "has not passed the race check before; checking it this once" in first.stderr
    assert json.loads(first.stdout)["run"]["options"]["race_check"] == "ran"
    again = invoke(*args)
    assert again.exit_code == 0 and again.stderr == ""
    assert json.loads(again.stdout)["run"]["options"]["race_check"] == "passed before"
    assert json.loads(again.stdout)["cycles"] == json.loads(first.stdout)["cycles"]
    dataclasses.replace(prog, metadata={"note": "another program"}).save(tmp / "h.ember")
    assert "checking it this once" in invoke(*args[:1], tmp / "h.ember", *args[2:]).stderr


def test_no_checks_never_skips_a_race(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    from simulator.arch import Arch
    from simulator.program import IOBinding, Program
    load = isa.LOAD(mem="scratchpad", sram=0, dram=0, y_size=1, x_size=1, elem_bytes=16,
                    x_stride=16, y_stride=16)
    Program(arch=Arch.load("default"), instructions=[load, isa.PRELOAD(sp=0, k=1), isa.END()],
            inputs=(IOBinding("x", 0, (16,), 1.0, 0),)).save(tmp_path / "race.ember")
    np.save(tmp_path / "x.npy", np.zeros(16, np.int8))
    for _ in range(2):
        result = invoke("simulate", tmp_path / "race.ember", "-i", tmp_path / "x.npy",
                        "--no-checks")
        assert result.exit_code == 2 and "race (read after write)" in result.output
