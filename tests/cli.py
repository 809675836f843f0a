"""The command line as tests drive it: in process, through click's runner, on the bundled digits
CNN."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from ember.cli import cli

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


def invoke(*args, catch_exceptions: bool = True) -> Result:
    """`ember ARGS...` (paths and numbers as strings); with catch_exceptions off, an internal
    error raises in the test instead of becoming exit 1."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=catch_exceptions)


def assert_one_line_error(result: Result, *parts: str) -> None:
    """Exit 2 with one line, `ember: error: ...`, that holds every one of `parts`."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ember: error: "), result.output
    for part in parts:
        assert part in lines[0], lines[0]


def profiled(folder: Path, proto, calib, evaluation) -> Path:
    """`folder` holding a model (m.onnx), its calibration and evaluation data (calib.npz,
    eval.npz: dicts of input arrays) and its profile (p.json), made by `ember
    quantize-profile` as a user would: what a command-line test of accuracy or a budget reads."""
    import numpy as np
    import onnx

    onnx.save(proto, str(folder / "m.onnx"))
    for name, data in (("calib", calib), ("eval", evaluation)):
        np.savez(folder / f"{name}.npz", **data)
    result = invoke("quantize-profile", folder / "m.onnx", "--data", folder / "calib.npz",
                    "-o", folder / "p.json")
    assert result.exit_code == 0, result.output
    return folder
