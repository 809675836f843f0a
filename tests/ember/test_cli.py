"""The CLI skeleton: help that teaches, one-line errors with exit 2, tracebacks with --debug."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from ember.cli import cli
from tests.onnx_builder import conv_bn_relu


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "cbr.onnx"
    onnx.save(conv_bn_relu(), path)
    return path


def invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_every_command_has_help_with_an_example() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for name, command in cli.commands.items():
        sub = invoke(name, "--help")
        assert sub.exit_code == 0, name
        assert len(command.help or "") > 40, f"{name} --help does not teach"


def test_show_prints_typed_ir(model_path) -> None:
    result = invoke("show", model_path)
    assert result.exit_code == 0
    assert "%n = Conv[conv](%x, @conv/W_bn, @conv/B_bn)" in result.output
    assert ": float32[1x4x8x8]" in result.output
    raw = invoke("show", model_path, "--no-optimize")
    assert "BatchNormalization[bn]" in raw.output


def test_show_json(model_path) -> None:
    data = json.loads(invoke("show", model_path, "--json").output)
    assert [n["op"] for n in data["nodes"]] == ["Conv", "Relu"]
    assert data["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}]


def test_run_compares_with_onnxruntime_and_writes_outputs(model_path, tmp_path) -> None:
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    out = tmp_path / "out.npz"
    result = invoke("run", model_path, "-i", tmp_path / "in.npz", "-o", out, "--json")
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert report["outputs"][0]["max_rel_error"] < 1e-5
    assert np.load(out)["y"].shape == (1, 4, 8, 8)


def test_bad_input_is_one_line_with_exit_2(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["show", str(tmp_path / "missing.onnx")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "missing.onnx: no such file" in result.output
    assert "Traceback" not in result.output


def test_debug_shows_the_traceback(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["--debug", "show", str(tmp_path / "missing.onnx")])
    assert result.exit_code != 0 and result.exception is not None
    assert type(result.exception).__name__ == "CompileError"


def test_run_with_mismatched_input_names_the_input(model_path, tmp_path) -> None:
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 3, 9, 9), np.float32))
    result = CliRunner().invoke(cli, ["run", str(model_path), "-i", str(tmp_path / "bad.npz")])
    assert result.exit_code == 2
    assert "input 'x': expected shape (1, 3, 8, 8), found (1, 3, 9, 9)" in result.output


def test_output_in_a_missing_directory_fails_cleanly(model_path, tmp_path) -> None:
    result = CliRunner().invoke(cli, ["run", str(model_path), "-o",
                                      str(tmp_path / "nodir" / "out.npz")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_every_output_file_gets_the_same_mode(digits_profile, tmp_path) -> None:
    """Whatever the command, an output is 0666 minus the umask, as `open()` would make it."""
    from tests.conftest import DIGITS
    with np.load(DIGITS / "eval.npz") as data:
        np.savez(tmp_path / "sample.npz", input=data["input"][:1])
    out = {name: tmp_path / name for name in (
        "p.json", "m.ember", "q.onnx", "o.npz", "perf.json", "t.json", "r.json", "r.html",
        "run.npz")}
    old = os.umask(0o027)
    try:
        for args in (
                ("quantize-profile", DIGITS / "model.onnx", "--data", DIGITS / "calib.npz",
                 "--samples", "8", "-o", out["p.json"]),
                ("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                 "-o", out["m.ember"], "--emit-onnx", out["q.onnx"]),
                ("simulate", out["m.ember"], "-i", tmp_path / "sample.npz", "-o", out["o.npz"],
                 "--report", out["perf.json"], "--trace", out["t.json"]),
                ("report", out["perf.json"], "-o", out["r.json"], "--html", out["r.html"]),
                ("run", DIGITS / "model.onnx", "-i", tmp_path / "sample.npz",
                 "-o", out["run.npz"])):
            result = invoke(*map(str, args))
            assert result.exit_code == 0, (args, result.output)
    finally:
        os.umask(old)
    modes = {name: oct(path.stat().st_mode & 0o777) for name, path in out.items()}
    assert modes == {name: oct(0o640) for name in out}
