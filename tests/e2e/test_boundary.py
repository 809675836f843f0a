"""The one affine map, `numerics.quantize` and `numerics.dequantize` in float32, is ONNX
QuantizeLinear and DequantizeLinear as onnxruntime computes them, ties included, per tensor and
per channel; and the program's host-side bindings, which call it, give the quantized graph's
boundary nodes bit for bit, so float inputs give the oracle's integers."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from compiler.graph.int8 import dequantize_linear, quantize_linear
from simulator import numerics
from simulator.program import IOBinding

scales = st.floats(1e-4, 10.0, allow_nan=False).map(lambda s: float(np.float32(s)))
dtypes = st.sampled_from(["int8", "uint8"])
# Values on and halfway between grid points, where the rounding rule decides.
halves = st.lists(st.integers(-600, 600), min_size=1, max_size=32)
EXAMPLES = settings(max_examples=60)


@functools.cache
def _onnxruntime(dtype: str, per_channel: bool) -> onnxruntime.InferenceSession:
    """QuantizeLinear then DequantizeLinear, with the scale and zero point as inputs."""
    elem = TensorProto.INT8 if dtype == "int8" else TensorProto.UINT8
    x_shape, p_shape = (["n", "c"], ["c"]) if per_channel else (["n"], [])
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, p_shape),
         helper.make_tensor_value_info("z", elem, p_shape)],
        [helper.make_tensor_value_info("q", elem, x_shape),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return onnxruntime.InferenceSession(proto.SerializeToString(),
                                        providers=["CPUExecutionProvider"])


def _zero_point(dtype: str, draw: int) -> int:
    return draw + numerics.RANGES[dtype][0]


@EXAMPLES
@given(dtype=dtypes, scale=scales, zero=st.integers(0, 255), codes=halves)
def test_affine_is_onnxruntime_per_tensor(dtype, scale, zero, codes) -> None:
    zero_point = _zero_point(dtype, zero)
    x = (np.asarray(codes, np.float32) / np.float32(2)) * np.float32(scale)
    q_ort, y_ort = _onnxruntime(dtype, False).run(None, {
        "x": x, "s": np.asarray(scale, np.float32), "z": np.asarray(zero_point, dtype)})
    q = numerics.quantize(x, scale, zero_point, dtype=dtype)
    np.testing.assert_array_equal(q, q_ort)
    assert q.dtype == q_ort.dtype
    y = numerics.dequantize(q, scale, zero_point)
    np.testing.assert_array_equal(y, y_ort)
    assert y.dtype == y_ort.dtype


@EXAMPLES
@given(dtype=dtypes, channels=st.lists(st.tuples(scales, st.integers(0, 255)), min_size=2,
                                       max_size=5), rows=st.lists(halves, min_size=1, max_size=4))
def test_affine_is_onnxruntime_per_channel(dtype, channels, rows) -> None:
    scale = np.asarray([s for s, _ in channels], np.float32)
    zero_point = np.asarray([_zero_point(dtype, z) for _, z in channels])
    c = len(channels)
    x = np.asarray([(r * c)[:c] for r in rows], np.float32) / np.float32(2) * scale
    q_ort, y_ort = _onnxruntime(dtype, True).run(None, {
        "x": x, "s": scale, "z": zero_point.astype(dtype)})
    q = numerics.quantize(x, scale, zero_point, axis=1, dtype=dtype)
    np.testing.assert_array_equal(q, q_ort)
    np.testing.assert_array_equal(numerics.dequantize(q, scale, zero_point, axis=1), y_ort)


@given(scale=scales, zero_point=st.integers(-128, 127),
       codes=st.lists(st.integers(-300, 300), min_size=1, max_size=32))
def test_binding_quantize_equals_quantize_linear(scale, zero_point, codes) -> None:
    # Values on and halfway between grid points, where the rounding rule decides.
    x = (np.asarray(codes, np.float32) / np.float32(2)) * np.float32(scale)
    binding = IOBinding("x", 0, x.shape, scale, zero_point)
    expected = quantize_linear(x, np.float32(scale), np.int8(zero_point))
    np.testing.assert_array_equal(binding.quantize(x), expected)


@given(dtype=dtypes, scale=scales, zero=st.integers(0, 255),
       codes=st.lists(st.integers(0, 255), min_size=1, max_size=32))
def test_binding_dequantize_equals_dequantize_linear(dtype, scale, zero, codes) -> None:
    # The binding multiplies in float64 and rounds once to float32; DequantizeLinear multiplies
    # in float32. For a float32 scale the two agree: |q - z| < 2^9 times a 24-bit significand
    # is exact in float64, so both are the exact product rounded once.
    lo = numerics.RANGES[dtype][0]
    q = (np.asarray(codes) + lo).astype(dtype)
    zero_point = zero + lo
    binding = IOBinding("y", 0, q.shape, scale, zero_point, dtype)
    expected = dequantize_linear(q, np.float32(scale), np.asarray(zero_point, dtype))
    np.testing.assert_array_equal(binding.dequantize(q), expected)
