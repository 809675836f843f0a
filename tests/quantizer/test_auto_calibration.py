"""`--calibration auto`: each side clipped on its own, on the tensor's own integer steps, and the
error weighed where the tensor's readers see it (a Sigmoid's output, not its input)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.pipeline import optimize
from profiler.accumulate import Accumulator
from profiler.histogram import Binner
from quantizer.calibrate import tensor_range
from quantizer.quantize import QuantOptions, quantize
from tests.onnx_builder import model
from tests.quantizer.util import profile_of


def _stats(x: np.ndarray):
    accumulator = Accumulator("activation", "float32", Binner())
    accumulator.add(x.astype(np.float32))
    return accumulator.stats()


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def _reader_error(x: np.ndarray, lo: float, hi: float) -> float:
    """Mean squared error of sigmoid(x) when x is quantized to int8 over [lo, hi]."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    step = (hi - lo) / 255
    q = np.clip(np.round((x - lo) / step), 0, 255) * step + lo
    return float(np.mean((_sigmoid(x) - _sigmoid(q)) ** 2))


def test_a_sigmoids_input_is_clipped_where_the_sigmoid_saturates() -> None:
    x = np.random.default_rng(0).normal(0.0, 4.0, 50_000)
    stats = _stats(x)
    lo, hi = tensor_range(stats, "auto", reader=_sigmoid)
    assert -9.0 < lo < -4.0 and 4.0 < hi < 9.0  # minmax: about +-17
    errors = {m: _reader_error(x, *tensor_range(stats, m)) for m in ("minmax", "mse")}
    # 7 dB below mse's range on what the Sigmoid outputs, 7.8 below minmax's.
    assert _reader_error(x, lo, hi) < 0.25 * min(errors.values())
    # Without the reader, the same histogram keeps nearly all of its range.
    plain = tensor_range(stats, "auto")
    assert plain[1] - plain[0] > 2 * (hi - lo)


def test_int16_tensors_are_calibrated_on_their_own_steps() -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0.0, 1.0, 50_000), rng.exponential(2.0, 2000) + 2])
    stats = _stats(x)
    lo8, hi8 = tensor_range(stats, "auto", symmetric=True)
    lo16, hi16 = tensor_range(stats, "auto", levels=65535, symmetric=True)
    # 255 steps: the tail's clipping costs less than coarser rounding of everything else.
    assert hi8 < 0.9 * float(stats.max)
    # 65,535 steps: rounding is nearly free, so the whole range stays.
    assert (lo16, hi16) == (float(stats.min), float(stats.max))
    # mse weighs the type's steps too (it clipped int16 tensors as if they were int8).
    assert tensor_range(stats, "mse", levels=65535)[1] > tensor_range(stats, "mse")[1]


def _gate_model(shared: bool):
    """x → Conv → Sigmoid → y; with `shared`, the Conv's output is also a model output (so
    its own error counts, not only the Sigmoid's)."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((4, 3, 1, 1)) * 3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="gate")]
    outputs = {"y": [1, 4, 8, 8]} | ({"c": [1, 4, 8, 8]} if shared else {})
    return model(nodes, {"x": [1, 3, 8, 8]}, outputs, {"w": w})


def test_the_quantizer_weighs_a_tensor_by_the_function_all_its_readers_apply() -> None:
    rng = np.random.default_rng(4)
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(8)]
    scales = {}
    for shared in (False, True):
        proto = _gate_model(shared)
        graph = optimize(import_model(proto))
        qgraph = quantize(graph, profile_of(proto, samples), QuantOptions(calibration="auto"))
        conv = next(n for n in qgraph.nodes if n.op == "Conv")
        scales[shared] = qgraph.type_of(conv.outputs[0]).quant.scale[0]
    # Read by the Sigmoid alone, the Conv's output clips where the gate saturates.
    assert scales[False] < 0.75 * scales[True]
