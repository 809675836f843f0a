"""ember.flow: the one entry point, and the options that round-trip through the program header."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from compiler.backend.program import BackendOptions
from ember.cli import cli
from ember.flow import CompileOptions, Quantizer, compile_model, quantize_model
from profiler import format as profile_format
from profiler.errors import ProfileError
from quantizer.options import QuantOptions
from simulator.program import Program
from tests.cli import DIGITS
from tests.onnx_builder import conv_bn_relu

OPTIONS = CompileOptions(QuantOptions(calibration="entropy", per_channel=False,
                                      activation_dtype="uint8", keep_fp32=("conv2",)),
                         BackendOptions(double_buffer=False, allow_host=True))


def test_options_round_trip_through_the_header() -> None:
    assert CompileOptions.from_header(OPTIONS.to_header()) == OPTIONS
    assert CompileOptions.from_header({"target": "edge"}) == CompileOptions()


def test_compile_model_gives_the_program_ember_compile_writes(tmp_path, digits_profile) -> None:
    """Same inputs, same bytes: the command is a thin layer over compile_model."""
    out = tmp_path / "digits.ember"
    result = CliRunner().invoke(cli, ["compile", str(DIGITS / "model.onnx"), "--profile",
                                      str(digits_profile), "--target", "edge", "--calibration",
                                      "entropy", "--per-tensor", "--activations", "uint8",
                                      "--keep-fp32", "conv2", "--no-double-buffer",
                                      "--allow-host", "-o", str(out)])
    assert result.exit_code == 0, result.output
    built = compile_model(DIGITS / "model.onnx", digits_profile, OPTIONS, "edge")
    assert built.compiled.program.to_bytes() == out.read_bytes()
    header = Program.load(out).metadata
    assert CompileOptions.from_header(header["options"]) == OPTIONS
    assert header["inputs"]["profile_sha256"] == hashlib.sha256(
        digits_profile.read_bytes()).hexdigest()


def test_an_in_memory_model_records_no_file_digests(digits_profile) -> None:
    proto = onnx.load(str(DIGITS / "model.onnx"))
    built = compile_model(proto, profile_format.load(digits_profile))
    header = built.compiled.program.metadata
    assert header["options"] == {"target": "default", **CompileOptions().to_header()}
    assert "inputs" not in header


def test_a_profile_of_another_model_is_refused(digits_profile) -> None:
    with pytest.raises(ProfileError, match="does not match the model"):
        quantize_model(conv_bn_relu(), digits_profile)


def _fingerprint(graph) -> tuple:
    """Everything a graph holds: its nodes in order and every value with its data."""
    nodes = tuple((n.op, n.name, n.inputs, n.outputs, repr(sorted(n.attrs.items())))
                  for n in graph.nodes)
    values = tuple((name, str(v.type), None if v.const is None else np.asarray(v.const).tobytes())
                   for name, v in sorted(graph.values.items()))
    return graph.inputs, graph.outputs, nodes, values


def test_a_quantizer_reused_across_options_gives_what_fresh_ones_give(digits_profile) -> None:
    """The budget imports a model once and quantizes it hundreds of times: the quantizer must
    leave the shared fp32 graph as it found it."""
    quantizer = Quantizer(DIGITS / "model.onnx", digits_profile)
    before = _fingerprint(quantizer.graph)
    options = [QuantOptions(), OPTIONS.quant, QuantOptions(calibration="mse", int16_tensors=("input",))]
    reused = [_fingerprint(quantizer(o).qgraph) for o in options + options[:1]]
    assert _fingerprint(quantizer.graph) == before
    fresh = [_fingerprint(quantize_model(DIGITS / "model.onnx", digits_profile, o).qgraph)
             for o in options]
    assert reused == fresh + fresh[:1]
    with pytest.raises(ValueError, match="equalize"):
        quantizer(QuantOptions(equalize="exact"))
