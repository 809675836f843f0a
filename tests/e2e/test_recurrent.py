"""Unrolled LSTM and GRU on the accelerator: every step's MatMuls on the array, the gates as
tables and their products on the vector unit, bit-exact against the integer reference on every
preset with no host segment; and through the CLI, profiled by onnxruntime in the unrolled
form the importer reads."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.cli import assert_one_line_error, invoke
from tests.e2e.flow import compile_and_check
from tests.onnx_builder import model

T, F, H, CLASSES = 6, 5, 12, 4


def sequence_classifier(op: str = "LSTM", direction: str = "forward", seed: int = 0,
                        hidden: int = H, steps: int = T, **attrs):
    """x [1, T, F] → time-major → LSTM/GRU → Y_h → Gemm → logits; Y feeds a second output."""
    rng = np.random.default_rng(seed)
    gates = 4 if op == "LSTM" else 3
    dirs = 2 if direction == "bidirectional" else 1
    inits = {"W": rng.normal(0, 0.5, (dirs, gates * hidden, F)).astype(np.float32),
             "R": rng.normal(0, 0.4, (dirs, gates * hidden, hidden)).astype(np.float32),
             "B": rng.normal(0, 0.2, (dirs, 2 * gates * hidden)).astype(np.float32),
             "fc_w": rng.normal(0, 0.3, (dirs * hidden, CLASSES)).astype(np.float32),
             "flat": np.array([1, dirs * hidden], np.int64)}
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node(op, ["xt", "W", "R", "B"], ["y", "y_h"], name="rnn",
                              hidden_size=hidden, direction=direction, **attrs),
             helper.make_node("Reshape", ["y_h", "flat"], ["h"]),
             helper.make_node("MatMul", ["h", "fc_w"], ["logits"])]
    return model(nodes, {"x": [1, steps, F]},
                 {"logits": [1, CLASSES], "y": [steps, dirs, 1, hidden]}, inits, opset=14)


@pytest.mark.parametrize("preset", ["edge", "default", "large"])
@pytest.mark.parametrize("op,direction,attrs", [
    ("LSTM", "forward", {}),
    ("GRU", "forward", {"linear_before_reset": 1}),
    ("GRU", "reverse", {}),
    ("LSTM", "bidirectional", {"clip": 2.0}),
])
def test_unrolled_recurrence_is_bit_exact_without_host(op, direction, attrs, preset) -> None:
    compiled, _ = compile_and_check(sequence_classifier(op, direction, **attrs), preset)
    assert not compiled.program.host_segments


def test_the_cli_profiles_and_compiles_an_lstm(tmp_path) -> None:
    path = tmp_path / "lstm.onnx"
    path.write_bytes(sequence_classifier().SerializeToString())
    profile, program = tmp_path / "lstm.profile.json", tmp_path / "lstm.ember"
    result = invoke("quantize-profile", path, "--random", 4, "-o", profile)
    assert result.exit_code == 0, result.output
    result = invoke("compile", path, "--int8", "--profile", profile, "-o", program)
    assert result.exit_code == 0, result.output


def test_an_unsupported_activation_is_one_line(tmp_path) -> None:
    path = tmp_path / "lstm.onnx"
    path.write_bytes(sequence_classifier(activations=["Sigmoid", "Elu", "Tanh"])
                     .SerializeToString())
    assert_one_line_error(invoke("show", path),
                          "node 'rnn' (LSTM): activations: 'Elu' is not supported")
