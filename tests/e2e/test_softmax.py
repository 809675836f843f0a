"""Softmax and LogSoftmax on the accelerator: a classifier's head (Conv → GlobalAveragePool →
Flatten → Gemm → Softmax) and a per-pixel softmax over a map's channels run whole on the vector
unit's SOFTMAX, bit-exactly, and so does one along an axis that is not contiguous in memory
(through element copies); a rank-5 one is refused in one line; the int8 LogSoftmax stays close
to fp32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.graph.evaluate import evaluate
from ember.flow import optimized_graph
from ember.reports.metrics import ErrorStats
from quantizer.reference import run_int8
from tests.cli import assert_one_line_error, invoke
from tests.e2e.flow import compile_and_check, quantized, samples
from tests.onnx_builder import model


def classifier(op: str, classes: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = {"w": (rng.standard_normal((6, 3, 3, 3)) * 0.4).astype(np.float32),
             "g": (rng.standard_normal((6, classes)) * 1.5).astype(np.float32),
             "b": rng.standard_normal(classes).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "g", "b"], ["l"], name="fc"),
             helper.make_node(op, ["l"], ["y"], name="head", axis=1)]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, classes]}, inits)


def channel_map(op: str, axis: int, channels: int = 10) -> onnx.ModelProto:
    """Conv → op over `axis` of the N x C x H x W map."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((channels, 3, 3, 3)) * 0.5).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c"], ["y"], name="head", axis=axis)]
    return model(nodes, {"x": [2, 3, 5, 4]}, {"y": [2, channels, 5, 4]}, {"w": w})


# 2 classes (opennsfw's and the OCR classifier's heads), one block's worth on the edge
# preset (8 lanes), and several blocks with a partial last one on both presets.
@pytest.mark.parametrize("classes", [2, 8, 37])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("preset", ["edge", "default"])
def test_classifier_head_runs_on_the_accelerator_bit_exactly(preset, op, classes) -> None:
    compiled, _ = compile_and_check(classifier(op, classes), preset, count=3)
    assert compiled.program.host_segments == ()
    assert any(insn.op.mnemonic == "SOFTMAX" for insn in compiled.program.instructions)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_over_a_maps_channels_is_bit_exact(op) -> None:
    compiled, _ = compile_and_check(channel_map(op, 1), "edge", count=2)
    assert compiled.program.host_segments == ()


@pytest.mark.parametrize("axis", [0, 2, 3])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_over_a_non_contiguous_axis_is_bit_exact(op, axis) -> None:
    """Along an axis whose elements are not a row's lanes, through element copies into a
    tensor where they are, and back."""
    compiled, _ = compile_and_check(channel_map(op, axis), "edge", count=2)
    assert compiled.program.host_segments == ()
    assert any(insn.op.mnemonic == "SOFTMAX" for insn in compiled.program.instructions)


def test_a_rank_5_softmax_is_refused_in_one_line(tmp_path) -> None:
    onnx.save(model([helper.make_node("Softmax", ["x"], ["y"], name="head", axis=2)],
                    {"x": [1, 2, 3, 4, 5]}, {"y": [1, 2, 3, 4, 5]}), tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(0).standard_normal(
        (8, 2, 3, 4, 5)).astype(np.float32))
    profiled = invoke("quantize-profile", tmp_path / "m.onnx", "--data", tmp_path / "c.npz",
                      "-o", tmp_path / "p.json")
    assert profiled.exit_code == 0, profiled.output
    result = invoke("compile", tmp_path / "m.onnx", "--profile", tmp_path / "p.json",
                    "-o", tmp_path / "m.ember")
    assert_one_line_error(result, "'head' (Softmax)", "normalizes axis 2 of a rank-5 value",
                          "ranks up to 4 lower")
    assert not (tmp_path / "m.ember").exists()


def test_int8_log_softmax_is_close_to_fp32_on_random_logits() -> None:
    """The fixed output scale (the input's) keeps LogSoftmax's error at the input's own
    quantization error: measured 48.1 dB on these logits."""
    proto = model([helper.make_node("LogSoftmax", ["x"], ["y"], name="head", axis=-1)],
                  {"x": [4, 10]}, {"y": [4, 10]})
    qgraph = quantized(proto, samples({"x": (4, 10)}, 16))
    graph = optimized_graph(proto)
    error = ErrorStats()
    for feed in samples({"x": (4, 10)}, 16, seed=5):
        error.add(evaluate(graph, feed)["y"], run_int8(qgraph, feed)["y"])
    assert error.sqnr_db > 35.0, error.sqnr_db
