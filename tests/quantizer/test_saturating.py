"""Ranges around saturating functions (`calibrate.saturation`, `moving_interval`,
`_Rewriter._saturating`): a score the model outputs keeps its function's whole range whatever
the calibration set scored, and an input is cut where its function is flat."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.graph import reference as ref
from compiler.graph.evaluate import evaluate
from ember.flow import optimized_graph
from quantizer.calibrate import moving_interval, saturation
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from tests.e2e.flow import quantized
from tests.onnx_builder import model


@pytest.mark.parametrize("function, levels, edge", [
    (ref.sigmoid, (0.0, 1.0), 6.24), (np.tanh, (-1.0, 1.0), 3.12),
    (lambda x: ref.hard_sigmoid(x, alpha=1 / 6, beta=0.5), (0.0, 1.0), 3.0)])
def test_a_saturating_function_has_levels_and_an_interval_where_it_moves(function, levels,
                                                                           edge) -> None:
    (low, high), (start, end) = saturation(function)
    np.testing.assert_allclose((low, high), levels, atol=1e-9)
    np.testing.assert_allclose((start, end), (-edge, edge), atol=0.02)
    # Outside the interval the function rounds to its levels at 255 steps over them.
    step = (high - low) / 255
    assert abs(function(np.float32(end + 0.1)) - high) <= step / 2
    # Finer output steps need more of the input: the interval grows.
    assert moving_interval(function, step / 10)[1] > end


@pytest.mark.parametrize("function", [ref.hard_swish, np.exp, lambda x: x, ref.relu])
def test_a_function_that_does_not_saturate_at_both_ends_has_none(function) -> None:
    assert saturation(function) is None and moving_interval(function, 0.01) is None


def score_head(threshold: float = -6.0):
    """x [1, 4, 6, 6] → Conv (positive weights) → Sigmoid → Reshape → y: a detector's class
    scores, far below 0.5 (the bias) unless the input is strong everywhere."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["logits"], name="head", pads=[1] * 4),
             helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid"),
             helper.make_node("Reshape", ["scores", "shape"], ["y"], name="flat")]
    inits = {"w": (np.abs(rng.normal(0, 0.05, (3, 4, 3, 3))) + 0.05).astype(np.float32),
             "b": np.full(3, threshold, np.float32), "shape": np.array([1, 3, 36])}
    return model(nodes, {"x": [1, 4, 6, 6]}, {"y": [1, 3, 36]}, inits)


def test_a_score_the_calibration_never_saw_high_is_not_clipped() -> None:
    proto = score_head()
    rng = np.random.default_rng(1)
    calibration = [{"x": rng.normal(0, 1, (1, 4, 6, 6)).astype(np.float32)} for _ in range(4)]
    qgraph = quantized(proto, calibration)
    graph = optimized_graph(proto)
    seen = max(float(evaluate(graph, c)["y"].max()) for c in calibration)
    assert seen < 0.2  # the calibration set scores low everywhere
    strong = {"x": np.full((1, 4, 6, 6), 3.0, np.float32)}  # a detection: scores near 1
    want = evaluate(graph, strong)["y"]
    got = run_int8(qgraph, strong)["y"]
    assert want.max() > 0.9
    # Before: clipped at the calibration's highest score. Now within the logits' step (the
    # interval where the sigmoid moves, 255 steps) and the score's.
    assert got.max() > 0.9
    np.testing.assert_allclose(got, want, atol=4 / 255)
    scores = qgraph.type_of("y/q").quant
    assert scores.scale[0] == pytest.approx(1 / 255, rel=1e-3)


def test_an_inner_gates_input_is_cut_where_the_gate_is_flat() -> None:
    """A Sigmoid read by a Mul (not an output): its input's calibrated range [-20, 2] is cut
    at the interval where the gate still moves at its output's step; the output keeps the
    calibrated range."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["gate"], name="sigmoid"),
             helper.make_node("Mul", ["v", "gate"], ["y"], name="gated")]
    proto = model(nodes, {"x": [1, 64], "v": [1, 64]}, {"y": [1, 64]})
    calibration = [{"x": np.linspace(-20, 2, 64, dtype=np.float32)[None],
                    "v": np.linspace(-1, 1, 64, dtype=np.float32)[None]}]
    qgraph = quantized(proto, calibration, QuantOptions())
    sigmoid = next(n for n in qgraph.nodes if n.op == "Sigmoid")
    source = qgraph.type_of(sigmoid.inputs[0]).quant
    low = (-128 - source.zero_point[0]) * source.scale[0]
    # The input of the gate (x as the Sigmoid reads it) stops near -7.7, not at -20: the
    # gate's output range [0, 0.88] has steps of 0.0035, and sigmoid(-7.7) is below half one.
    assert -9.0 < low < -6.0, low


def test_an_int16_scores_input_is_extended_never_cut() -> None:
    """Raised to int16 (the budget's doing), a score's input keeps every calibrated value and
    still reaches where the Sigmoid stops moving."""
    proto = score_head()
    rng = np.random.default_rng(1)
    calibration = [{"x": rng.normal(0, 1, (1, 4, 6, 6)).astype(np.float32)} for _ in range(4)]
    graph = optimized_graph(proto)
    lowest = min(float(evaluate(graph, c, keep_all=True)["logits"].min()) for c in calibration)
    qgraph = quantized(proto, calibration, QuantOptions(int16_tensors=("logits",)))
    params = qgraph.type_of("logits").quant
    assert qgraph.type_of("logits").dtype == "int16"
    reach = np.array([-1, 1]) * params.scale[0] * 32767  # symmetric
    assert reach[0] <= lowest and reach[1] >= 6.2, (reach, lowest)
    strong = {"x": np.full((1, 4, 6, 6), 3.0, np.float32)}
    np.testing.assert_allclose(run_int8(qgraph, strong)["y"], evaluate(graph, strong)["y"],
                               atol=4 / 255)  # measured: 2.2 steps (its table's knots)
