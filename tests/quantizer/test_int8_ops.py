"""Every int8 kernel of the operator table against the fp32 reference, with tolerances from the scales.

Each case is a one- or two-node ONNX model. It is profiled on its own samples (so minmax ranges
hold them), quantized, and run by the integer reference; the fp32 `evaluate` runs the same
graph on the *dequantized* integer inputs and weights, so what remains is the kernel's own
error: |int8 - fp32| <= steps * output scale (about one half; 0 for data movement).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fuse_channel_map import fuse_channel_map
from compiler.passes.fuse_hypot import fuse_hypot
from compiler.graph import reference as ref
from compiler.graph.evaluate import evaluate
from compiler.graph.ops import OPS

INT8_OPS = {name for name, op in OPS.items() if op.int8 is not None}
from compiler.graph.ir import Graph, QuantParams, Value
from quantizer.quantize import QuantOptions, quantize
from quantizer.reference import run_int8
from simulator import numerics
from tests.onnx_builder import model
from tests.quantizer.util import profile_of


@dataclass(frozen=True)
class Case:
    id: str
    nodes: list
    inputs: Mapping[str, tuple[int, ...]]
    outputs: Mapping[str, tuple[int, ...]]
    inits: Mapping[str, np.ndarray] = field(default_factory=dict)
    # Tolerance in output scales: half a step of output rounding, plus the multiplier's and
    # float32's slack; 0 for data movement, which must be exact.
    steps: float = 0.6
    ranges: Mapping[str, float] = field(default_factory=dict)  # input name → magnitude
    offsets: Mapping[str, float] = field(default_factory=dict)  # input name → centre
    expect_ops: tuple[str, ...] = ()  # ops the quantized graph must hold
    absent_ops: tuple[str, ...] = ()  # ops it must not hold
    opset: int = 17  # newer for operators added later (Gelu 20, Swish 24)
    # The fusion passes the case needs (ember's own operators, which only a pass writes:
    # Hypot from a written-out magnitude); the others reach the quantizer as imported.
    passes: tuple = ()
    # Whether onnxruntime's run of the QDQ export reproduces it exactly in affine schemes (a
    # linear Resize rounds after each axis, onnxruntime once).
    qdq_exact: bool = True


def _rng(seed=0):
    return np.random.default_rng(seed)


def _w(*shape, seed=1):
    return (_rng(seed).standard_normal(shape) * 0.5).astype(np.float32)


def n(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name=f"{op.lower()}_{outputs[0]}", **attrs)


X4 = {"x": (1, 4, 6, 6)}
Y4 = (1, 4, 6, 6)

CASES = [
    Case("Conv", [n("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": (1, 3, 6, 6)},
         {"y": (1, 4, 6, 6)}, {"w": _w(4, 3, 3, 3), "b": _w(4, seed=2)}),
    Case("Conv-depthwise-strided", [n("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1],
                                      strides=[2, 2], group=4)], X4, {"y": (1, 4, 3, 3)},
         {"w": _w(4, 1, 3, 3), "b": _w(4, seed=2)}),
    Case("Conv-Relu-fused", [n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                             n("Relu", ["c"], ["y"])], {"x": (1, 3, 5, 5)}, {"y": (1, 2, 5, 5)},
         {"w": _w(2, 3, 3, 3)}, absent_ops=("Relu",)),
    Case("ConvTranspose", [n("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                             pads=[1, 1, 1, 1], output_padding=[1, 1])], {"x": (1, 3, 4, 5)},
         {"y": (1, 4, 9, 11)}, {"w": _w(3, 4, 4, 4), "b": _w(4, seed=2)}),
    Case("ConvTranspose-depthwise-stride3", [n("ConvTranspose", ["x", "w"], ["y"],
                                               strides=[3, 3], group=4)], X4,
         {"y": (1, 4, 17, 17)}, {"w": _w(4, 1, 2, 2)}),
    Case("ConvTranspose-groups-Relu-fused", [
        n("ConvTranspose", ["x", "w", "b"], ["c"], strides=[2, 1], dilations=[1, 2], group=2,
          auto_pad="SAME_UPPER"), n("Relu", ["c"], ["y"])], X4, {"y": (1, 6, 12, 6)},
         {"w": _w(4, 3, 3, 3), "b": _w(6, seed=2)}, absent_ops=("Relu",)),
    Case("Gemm", [n("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5, beta=2.0)],
         {"x": (2, 8)}, {"y": (2, 5)}, {"w": _w(5, 8), "b": _w(5, seed=2)}),
    Case("Gemm-Clip-fused", [n("Gemm", ["x", "w"], ["g"]), n("Clip", ["g", "lo", "hi"], ["y"])],
         {"x": (3, 6)}, {"y": (3, 4)},
         {"w": _w(6, 4), "lo": np.float32(-0.3), "hi": np.float32(0.6)},
         absent_ops=("Clip",)),
    Case("MatMul", [n("MatMul", ["x", "w"], ["y"])], {"x": (2, 3, 8)}, {"y": (2, 3, 5)},
         {"w": _w(8, 5)}),
    Case("MatMul-activations", [n("MatMul", ["a", "b"], ["y"])], {"a": (2, 4), "b": (4, 3)},
         {"y": (2, 3)}),
    Case("Add", [n("Add", ["a", "b"], ["y"])], {"a": (1, 4, 3, 3), "b": (1, 4, 3, 3)},
         {"y": (1, 4, 3, 3)}, ranges={"b": 5.0}),
    Case("Max", [n("Max", ["a", "b"], ["y"])], {"a": (1, 4, 3, 3), "b": (1, 4, 3, 3)},
         {"y": (1, 4, 3, 3)}, ranges={"b": 3.0}),
    Case("Hypot", [n("Pow", ["a", "two"], ["a2"]), n("Pow", ["b", "two"], ["b2"]),
                   n("Add", ["a2", "b2"], ["p"]), n("Sqrt", ["p"], ["y"])],
         {"a": (1, 4, 3, 3), "b": (1, 4, 3, 3)}, {"y": (1, 4, 3, 3)},
         {"two": np.array(2.0, np.float32)}, ranges={"b": 0.3}, expect_ops=("Hypot",),
         passes=(fold_constants, fuse_hypot, eliminate_dead),
         qdq_exact=False),  # its root is floored in Q8: onnxruntime's Sqrt may round across
    Case("Min-broadcast", [n("Min", ["a", "b"], ["y"])], {"a": (1, 4, 3, 3), "b": (1, 1, 1, 1)},
         {"y": (1, 4, 3, 3)}, ranges={"a": 2.0}),
    Case("Add-const-broadcast", [n("Add", ["a", "c"], ["y"])], {"a": (1, 4, 3, 3)},
         {"y": (1, 4, 3, 3)}, {"c": _w(4, 1, 1)}, steps=1.0),  # c is quantized too
    Case("Sub", [n("Sub", ["a", "b"], ["y"])], {"a": (2, 5), "b": (2, 5)}, {"y": (2, 5)},
         ranges={"a": 3.0}),
    Case("Add-Relu-fused", [n("Add", ["a", "b"], ["s"]), n("Relu", ["s"], ["y"])],
         {"a": (2, 6), "b": (2, 6)}, {"y": (2, 6)}, absent_ops=("Relu",)),
    Case("Mul", [n("Mul", ["a", "b"], ["y"])], {"a": (2, 5), "b": (2, 5)}, {"y": (2, 5)}),
    Case("Mul-gate", [n("Mul", ["a", "g"], ["y"])], {"a": (2, 4, 3, 3), "g": (2, 4, 1, 1)},
         {"y": (2, 4, 3, 3)}, ranges={"g": 0.3}, offsets={"g": 0.5}),
    # The reciprocal's own step (1 / b quantized over [1 / hi, 1 / lo]) times |a| adds a
    # fraction of an output step to the product's rounding.
    Case("Div", [n("Div", ["a", "b"], ["y"])], {"a": (2, 4, 3, 3), "b": (2, 4, 3, 3)},
         {"y": (2, 4, 3, 3)}, ranges={"b": 0.5}, offsets={"b": 3.0}, steps=1.0),
    Case("Div-by-scalar-activation", [n("Div", ["a", "b"], ["y"])],
         {"a": (2, 4, 3, 3), "b": (2, 1, 1, 1)}, {"y": (2, 4, 3, 3)}, ranges={"b": 0.5},
         offsets={"b": -3.0}, steps=1.0),
    Case("Reciprocal", [n("Reciprocal", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 0.5},
         offsets={"x": 2.0}),
    Case("Relu", [n("Relu", ["x"], ["y"])], X4, {"y": Y4}, steps=0),
    Case("Clip", [n("Clip", ["x", "lo", "hi"], ["y"])], X4, {"y": Y4},
         {"lo": np.float32(-0.5), "hi": np.float32(0.7)}),
    Case("Sigmoid", [n("Sigmoid", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}),
    Case("Tanh", [n("Tanh", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 2.0}),
    Case("HardSigmoid", [n("HardSigmoid", ["x"], ["y"], alpha=0.3, beta=0.4)], X4, {"y": Y4},
         ranges={"x": 3.0}),
    Case("HardSwish", [n("HardSwish", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}),
    Case("Abs", [n("Abs", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}),
    Case("Neg", [n("Neg", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}),
    Case("Exp", [n("Exp", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 2.0}),
    Case("Erf", [n("Erf", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 3.0}),
    Case("Sqrt", [n("Sqrt", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 0.5},
         offsets={"x": 2.0}),
    Case("Pow", [n("Pow", ["x", "e"], ["y"])], X4, {"y": Y4}, {"e": np.float32(2.0)},
         ranges={"x": 2.0}),
    Case("Gelu", [n("Gelu", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}, opset=20),
    # Its integer kernel rounds the normalized value (Q16) before the output: not onnxruntime's
    # float arithmetic between DequantizeLinear and QuantizeLinear to the last code.
    Case("LayerNormalization", [n("LayerNormalization", ["x", "g", "b"], ["y"])],
         {"x": (1, 5, 24)}, {"y": (1, 5, 24)}, {"g": _w(24), "b": _w(24, seed=2)},
         ranges={"x": 3.0}, qdq_exact=False),
    Case("Swish", [n("Swish", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}, opset=24),
    Case("Mish", [n("Mish", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}, opset=18),
    Case("Softplus", [n("Softplus", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}),
    Case("Softsign", [n("Softsign", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}),
    Case("Elu", [n("Elu", ["x"], ["y"], alpha=0.5)], X4, {"y": Y4}, ranges={"x": 4.0}),
    Case("Celu", [n("Celu", ["x"], ["y"], alpha=2.0)], X4, {"y": Y4}, ranges={"x": 4.0}),
    Case("Selu", [n("Selu", ["x"], ["y"])], X4, {"y": Y4}, ranges={"x": 4.0}),
    Case("LeakyRelu", [n("LeakyRelu", ["x"], ["y"], alpha=0.1)], X4, {"y": Y4}),
    Case("PRelu-per-channel", [n("PRelu", ["x", "s"], ["y"])], X4, {"y": Y4},
         {"s": np.array([0.1, -0.4, 0.7, 1.5], np.float32).reshape(4, 1, 1)}),
    Case("PRelu-scalar", [n("PRelu", ["x", "s"], ["y"])], X4, {"y": Y4},
         {"s": np.full(1, 0.2, np.float32)}),
    # Equalization's form of an activation (`quantizer.equalize` mode "all"): a table per
    # channel of post * f(pre * x).
    Case("ChannelMap", [n("Mul", ["x", "pre"], ["a"]), n("HardSwish", ["a"], ["b"]),
                        n("Mul", ["b", "post"], ["y"])], X4, {"y": Y4},
         {"pre": np.array([0.5, 2.0, 8.0, 1.0], np.float32).reshape(4, 1, 1),
          "post": np.array([2.0, 0.5, 0.125, 1.0], np.float32).reshape(4, 1, 1)},
         ranges={"x": 3.0}, expect_ops=("ChannelMap",), passes=(fuse_channel_map,)),
    Case("ChannelMap-Swish", [n("Mul", ["x", "pre"], ["a"]), n("Swish", ["a"], ["b"]),
                              n("Mul", ["b", "post"], ["y"])], X4, {"y": Y4},
         {"pre": np.array([0.5, 2.0, 4.0, 1.0], np.float32).reshape(4, 1, 1),
          "post": np.array([2.0, 0.5, 0.25, 1.0], np.float32).reshape(4, 1, 1)},
         ranges={"x": 3.0}, opset=24, expect_ops=("ChannelMap",),
         passes=(fuse_channel_map,)),
    Case("Softmax", [n("Softmax", ["x"], ["y"], axis=-1)], {"x": (3, 10)}, {"y": (3, 10)},
         ranges={"x": 3.0}),
    Case("LogSoftmax", [n("LogSoftmax", ["x"], ["y"], axis=-1)], {"x": (3, 10)},
         {"y": (3, 10)}, ranges={"x": 3.0}),
    Case("MaxPool", [n("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                       pads=[1, 1, 1, 1])], X4, {"y": (1, 4, 3, 3)}, steps=0),
    Case("GlobalMaxPool", [n("GlobalMaxPool", ["x"], ["y"])], X4, {"y": (1, 4, 1, 1)}, steps=0),
    Case("AveragePool", [n("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                           pads=[1, 1, 1, 1])], X4, {"y": (1, 4, 3, 3)}),
    Case("AveragePool-ceil-include-pad", [n("AveragePool", ["x"], ["y"], kernel_shape=[2, 2],
                                            strides=[2, 2], pads=[1, 1, 0, 0], ceil_mode=1,
                                            count_include_pad=1)],
         {"x": (1, 2, 5, 5)}, {"y": (1, 2, 3, 3)}),
    Case("GlobalAveragePool", [n("GlobalAveragePool", ["x"], ["y"])], X4, {"y": (1, 4, 1, 1)}),
    Case("ReduceMean", [n("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)], X4,
         {"y": (1, 4)}),
    Case("ReduceSum", [n("ReduceSum", ["x", "axes"], ["y"], keepdims=1)], {"x": (1, 12, 8)},
         {"y": (1, 1, 8)}, {"axes": np.array([1], np.int64)}),
    # Max and min keep the input's scale: exact (0 steps); L2 roots the centred codes' squares.
    Case("ReduceMax", [n("ReduceMax", ["x", "axes"], ["y"], keepdims=1)], {"x": (1, 6, 9)},
         {"y": (1, 6, 1)}, {"axes": np.array([2], np.int64)}, steps=0, opset=18),
    Case("ReduceMin", [n("ReduceMin", ["x", "axes"], ["y"], keepdims=0)], {"x": (2, 5, 7)},
         {"y": (2, 7)}, {"axes": np.array([1], np.int64)}, steps=0, opset=18),
    Case("ReduceL2", [n("ReduceL2", ["x", "axes"], ["y"], keepdims=1)], {"x": (1, 6, 9)},
         {"y": (1, 6, 1)}, {"axes": np.array([-1], np.int64)}, opset=18),
    Case("Identity", [n("Identity", ["x"], ["y"])], X4, {"y": Y4}, steps=0),
    Case("Reshape", [n("Reshape", ["x", "s"], ["y"])], X4, {"y": (4, 36)},
         {"s": np.array([4, -1], np.int64)}, steps=0),
    Case("Flatten", [n("Flatten", ["x"], ["y"], axis=2)], X4, {"y": (4, 36)}, steps=0),
    Case("Transpose", [n("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])], X4, {"y": (1, 6, 6, 4)},
         steps=0),
    Case("Squeeze", [n("Squeeze", ["x", "axes"], ["y"])], X4, {"y": (4, 6, 6)},
         {"axes": np.array([0], np.int64)}, steps=0),
    Case("Unsqueeze", [n("Unsqueeze", ["x", "axes"], ["y"])], X4, {"y": (1, 4, 1, 6, 6)},
         {"axes": np.array([2], np.int64)}, steps=0),
    Case("Slice", [n("Slice", ["x", "st", "en", "ax"], ["y"])], X4, {"y": (1, 2, 6, 3)},
         {"st": np.array([1, 2], np.int64), "en": np.array([3, 5], np.int64),
          "ax": np.array([1, 3], np.int64)}, steps=0),
    Case("Split", [n("Split", ["x", "sp"], ["y", "z"], axis=1)], X4,
         {"y": (1, 1, 6, 6), "z": (1, 3, 6, 6)}, {"sp": np.array([1, 3], np.int64)}, steps=0),
    Case("Pad", [n("Pad", ["x", "p", "v"], ["y"])], X4, {"y": (1, 4, 8, 7)},
         {"p": np.array([0, 0, 1, 0, 0, 0, 1, 1], np.int64), "v": np.float32(0.0)}, steps=0),
    Case("Pad-reflect", [n("Pad", ["x", "p"], ["y"], mode="reflect")], X4, {"y": (1, 4, 8, 8)},
         {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}, steps=0),
    Case("Resize", [n("Resize", ["x", "", "sc"], ["y"], mode="nearest")], X4,
         {"y": (1, 4, 12, 12)}, {"sc": np.array([1, 1, 2, 2], np.float32)}, steps=0),
    # Linear rounds after each axis (H, then W): within one step of fp32.
    Case("Resize-linear", [n("Resize", ["x", "", "", "sz"], ["y"], mode="linear")], X4,
         {"y": (1, 4, 9, 14)}, {"sz": np.array([1, 4, 9, 14], np.int64)}, steps=1.01,
         qdq_exact=False),
    Case("Concat-rescale", [n("Sigmoid", ["a"], ["s"]), n("Concat", ["s", "b"], ["y"], axis=1)],
         {"a": (1, 2, 3, 3), "b": (1, 3, 3, 3)}, {"y": (1, 5, 3, 3)}, ranges={"b": 4.0},
         expect_ops=("Rescale",)),
    # An activation's rows by constant indices keep its codes (a constant table's rows by
    # integer inputs: tests/e2e/test_embedding.py).
    Case("Gather-activation-rows", [n("Gather", ["x", "idx"], ["y"], axis=1)], {"x": (2, 5, 3)},
         {"y": (2, 2, 3)}, {"idx": np.asarray([4, -5], np.int64)}, steps=0),
    Case("Concat-const", [n("Concat", ["a", "c"], ["y"], axis=0)], {"a": (2, 3)}, {"y": (4, 3)},
         {"c": _w(2, 3)}),
    # A Rescale after a requantizing node folds into it: the Conv writes the Concat's type.
    Case("Concat-rescale-folded", [n("Conv", ["a", "w"], ["c"]),
                                   n("Concat", ["c", "b"], ["y"], axis=1)],
         {"a": (1, 2, 3, 3), "b": (1, 3, 3, 3)}, {"y": (1, 5, 3, 3)}, {"w": _w(2, 2, 1, 1)},
         ranges={"b": 4.0}, absent_ops=("Rescale",)),
]

# QuantizeLinear and DequantizeLinear sit at the boundary of every case.
BOUNDARY = {"QuantizeLinear", "DequantizeLinear"}


def _samples(case: Case, count: int = 12) -> list[dict[str, np.ndarray]]:
    rng = _rng(7)
    return [{name: (rng.standard_normal(shape) * case.ranges.get(name, 1.0)
                    + case.offsets.get(name, 0.0)).astype(np.float32)
             for name, shape in case.inputs.items()} for _ in range(count)]


def _dequantize(q: np.ndarray, params: QuantParams) -> np.ndarray:
    return numerics.dequantize(q, params.scale, params.zero_point, axis=params.axis,
                               arithmetic=np.float64).astype(np.float32)


def _fp32_on_dequantized(graph: Graph, qgraph: Graph, env: dict) -> Graph:
    """The fp32 graph with each weight replaced by its dequantized int8 value."""
    values = dict(graph.values)
    for name, value in graph.values.items():
        qvalue = qgraph.values.get(name)
        if value.is_const and qvalue is not None and qvalue.type.quant is not None \
                and qvalue.type.dtype == "int8":
            values[name] = Value(name, value.type, _dequantize(qvalue.const, qvalue.type.quant))
    return graph.replace(values=values)


def case_graph(case: Case, proto) -> Graph:
    """The case's graph as imported (no optimize: Identity must reach the quantizer), through
    its own fusion passes."""
    graph = import_model(proto)
    for graph_pass in case.passes:
        graph = graph_pass(graph)
    return graph


def check_case(case: Case, options: QuantOptions = QuantOptions()) -> Graph:
    proto = model(case.nodes, case.inputs, case.outputs, case.inits, opset=case.opset)
    graph = case_graph(case, proto)
    samples = _samples(case)
    qgraph = quantize(graph, profile_of(proto, samples), options)
    ops = qgraph.op_counts()
    for op in case.expect_ops:
        assert op in ops, f"{case.id}: expected a {op} in {ops}"
    for op in case.absent_ops:
        assert op not in ops, f"{case.id}: {op} should have been fused, got {ops}"
    reference = _fp32_on_dequantized(graph, qgraph, {})
    for feeds in samples[:4]:
        env = run_int8(qgraph, feeds, keep_all=True)
        dequantized = {name: _dequantize(env[f"{name}/q"], qgraph.type_of(f"{name}/q").quant)
                       for name in graph.inputs}
        want = evaluate(reference, dequantized)
        for out in graph.outputs:
            q = env[f"{out}/q"]
            params = qgraph.type_of(f"{out}/q").quant
            assert q.dtype == np.dtype(options.activation_dtype)
            got = _dequantize(q, params)
            # Values past the representable range saturate: that is the range's error (the
            # profile saw exact inputs, the reference dequantized ones), not the kernel's.
            lo, hi = np.iinfo(q.dtype).min, np.iinfo(q.dtype).max
            edges = _dequantize(np.array([lo, hi]), QuantParams.per_tensor(
                params.scale[0], params.zero_point[0]))
            error = np.max(np.abs(got - np.clip(want[out], *edges)), initial=0.0)
            bound = case.steps * params.scale[0] + 1e-6
            assert error <= bound, (f"{case.id}: output {out!r} differs by {error:.4g}, more "
                                    f"than {case.steps} x scale {params.scale[0]:.4g}")
            np.testing.assert_allclose(env[out], got, rtol=1e-6, atol=1e-7)
    return qgraph


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_int8_kernel_matches_fp32_within_the_output_scale(case: Case) -> None:
    check_case(case)


@pytest.mark.parametrize("case", [c for c in CASES if c.id in (
    "Conv", "ConvTranspose", "Gemm", "Add", "Sigmoid", "Softmax", "LogSoftmax", "AveragePool",
    "Concat-rescale", "MaxPool", "Pad", "Mul", "Max")], ids=lambda c: c.id)
@pytest.mark.parametrize("options", [
    QuantOptions(activation_dtype="uint8"),
    QuantOptions(symmetric_activations=True),
    QuantOptions(schema="power2", per_channel=False),
], ids=["uint8", "symmetric", "power2-per-tensor"])
def test_int8_kernels_under_other_schemes(case: Case, options: QuantOptions) -> None:
    check_case(case, options)


def test_every_int8_row_has_a_case() -> None:
    covered = {node.op_type for case in CASES for node in case.nodes} | BOUNDARY | {"Rescale"}
    covered |= {op for case in CASES if case.passes for op in case.expect_ops}
    assert INT8_OPS <= covered, f"no test case for {sorted(INT8_OPS - covered)}"


@settings(derandomize=True, max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(1, 2), st.integers(0, 2),
       st.integers(1, 3), st.sampled_from(["NOTSET", "SAME_UPPER", "VALID"]), st.booleans())
def test_conv_windows_groups_and_padding(group, stride, dilation, pad, kernel, auto_pad,
                                         bias):
    """Conv over strides, dilations, (asymmetric) pads, auto_pad and groups, per channel."""
    channels, outputs = 2 * group, 2 * group
    attrs = {"strides": [stride, stride], "dilations": [dilation, dilation], "group": group}
    if auto_pad == "NOTSET":
        attrs["pads"] = [pad, 0, pad, pad]
    else:
        attrs["auto_pad"] = auto_pad
    inits = {"w": _w(outputs, 2, kernel, kernel, seed=group + kernel)}
    inputs = ["x", "w"] + (["b"] if bias else [])
    if bias:
        inits["b"] = _w(outputs, seed=3)
    shape = ref.conv(np.zeros((1, channels, 7, 7), np.float32), inits["w"], **attrs).shape
    case = Case("Conv-property", [helper.make_node("Conv", inputs, ["y"], name="c", **attrs)],
                {"x": (1, channels, 7, 7)}, {"y": shape}, inits)
    check_case(case)
