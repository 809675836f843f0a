"""`ember compile` from the command line: the summary, atomic and deterministic output, and a
one-line error (exit 2, no file written) for each kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from simulator import machine
from simulator.arch import PRESETS
from simulator.program import Program
from tests.cli import DIGITS
from tests.cli import invoke as cli_invoke
from tests.onnx_builder import model


def invoke(*args):
    return cli_invoke(*args, catch_exceptions=False)


@pytest.fixture
def profile(digits_profile) -> Path:
    return digits_profile


def test_compile_writes_a_runnable_deterministic_program(tmp_path, profile) -> None:
    out, again = tmp_path / "digits.ember", tmp_path / "again.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", profile,
                    "--target", "edge", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["layers"] == 4
    assert report["bound_cycles"] <= report["busiest_unit_cycles"] <= report["cycles"]
    assert report["activation_lower_bound_bytes"] <= report["activation_peak_bytes"]
    invoke("compile", DIGITS / "model.onnx", "--profile", profile, "--target", "edge", "-o", again)
    assert out.read_bytes() == again.read_bytes()
    program = Program.load(out)
    assert program.metadata["options"]["target"] == "edge"
    x = program.inputs[0].quantize(np.load(DIGITS / "eval.npz")["input"][:1])
    assert machine.run(program, {"input": x}).outputs["logits"].shape == (1, 10)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_the_summary_cycles_are_the_simulated_cycles(tmp_path, profile, preset) -> None:
    """The summary's cycles come from the machine's timing, which no data changes: they equal
    what a run reports (the busiest unit alone said 1,856 for 3,192 on digits/default)."""
    out = tmp_path / "digits.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--profile", profile, "--target", preset,
                    "-o", out, "--json")
    report = json.loads(result.output)
    program = Program.load(out)
    x = program.inputs[0].quantize(np.load(DIGITS / "eval.npz")["input"][:1])
    simulated = machine.run(program, {"input": x}).stats.cycles
    assert report["cycles"] == simulated
    assert report["busiest_unit_cycles"] < simulated
    table = invoke("compile", DIGITS / "model.onnx", "--profile", profile, "--target", preset,
                   "-o", out).output
    words = " ".join(table.replace("│", " ").split())
    assert f"cycles (the simulator's timing) {simulated:,}" in words


def _fails(result, *fragments) -> None:
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("ember: error:") and "\n" not in line, line
    for fragment in fragments:
        assert fragment in line, line


def test_unsupported_op(tmp_path) -> None:
    proto = model([helper.make_node("Softmax", ["x"], ["y"], name="probabilities", axis=0)],
                  {"x": [2, 1, 1, 1, 10]}, {"y": [2, 1, 1, 1, 10]})  # rank 5: no lowering
    onnx.save(proto, tmp_path / "softmax.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x=rng.standard_normal((8, 1, 1, 1, 10)).astype(np.float32))
    assert invoke("quantize-profile", tmp_path / "softmax.onnx", "--data",
                  tmp_path / "data.npz", "-o", tmp_path / "p.json").exit_code == 0
    result = invoke("compile", tmp_path / "softmax.onnx", "--profile", tmp_path / "p.json",
                    "-o", tmp_path / "out.ember")
    _fails(result, "'probabilities' (Softmax)", "--keep-fp32")
    assert not (tmp_path / "out.ember").exists()


def _arch_file(tmp_path: Path, old: str, new: str) -> Path:
    text = (PRESETS / "edge.toml").read_text()
    assert old in text
    path = tmp_path / "target.toml"
    path.write_text(text.replace(old, new))
    return path


def test_too_large_for_dram(tmp_path, profile) -> None:
    arch = _arch_file(tmp_path, "size_bytes = 268435456", "size_bytes = 4096")
    result = invoke("compile", DIGITS / "model.onnx", "--profile", profile, "--target", arch,
                    "-o", tmp_path / "out.ember")
    _fails(result, "bytes of DRAM")
    assert not (tmp_path / "out.ember").exists()


@pytest.mark.parametrize("old,new,fragment", [
    ("rows = 8\ncols = 8", "rows = 16\ncols = 8", "array.rows"),  # inconsistent
    ("size_bytes = 32768", "size_bytes = 64", "smallest tile"),  # too small for any tile
])
def test_impossible_arch_file(tmp_path, profile, old, new, fragment) -> None:
    arch = _arch_file(tmp_path, old, new)
    result = invoke("compile", DIGITS / "model.onnx", "--profile", profile, "--target", arch,
                    "-o", tmp_path / "out.ember")
    _fails(result, fragment)
    assert not (tmp_path / "out.ember").exists()


def test_mismatched_profile(tmp_path, profile) -> None:
    proto = onnx.load(DIGITS / "model.onnx")
    proto.graph.initializer[0].raw_data = bytes(len(proto.graph.initializer[0].raw_data))
    onnx.save(proto, tmp_path / "other.onnx")
    result = invoke("compile", tmp_path / "other.onnx", "--profile", profile,
                    "-o", tmp_path / "out.ember")
    _fails(result, "does not match the model")
    assert not (tmp_path / "out.ember").exists()


def test_output_directory_missing(tmp_path, profile) -> None:
    out = tmp_path / "missing" / "out.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--profile", profile, "-o", out)
    _fails(result, "does not exist")
    assert not out.parent.exists()


def test_a_profile_of_random_data_compiles_with_a_one_line_warning(tmp_path, profile) -> None:
    synthetic = tmp_path / "random.profile.json"
    assert invoke("quantize-profile", DIGITS / "model.onnx", "--random", 4, "-o",
                  synthetic).exit_code == 0
    result = invoke("compile", DIGITS / "model.onnx", "--profile", synthetic, "-o",
                    tmp_path / "r.ember", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"ember: warning: {synthetic}") and "--random" in result.stderr
    json.loads(result.stdout)
    real = invoke("compile", DIGITS / "model.onnx", "--profile", profile, "-o",
                  tmp_path / "d.ember")
    assert real.exit_code == 0 and real.stderr == ""
