"""The program's host-side input quantization equals ONNX QuantizeLinear as the quantizer's
reference computes it, ties included, so float inputs give the oracle's integers."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from compiler.graph.int8 import quantize_linear
from simulator.program import IOBinding

scales = st.floats(1e-4, 10.0, allow_nan=False).map(lambda s: float(np.float32(s)))


@given(scale=scales, zero_point=st.integers(-128, 127),
       codes=st.lists(st.integers(-300, 300), min_size=1, max_size=32))
def test_binding_quantize_equals_quantize_linear(scale, zero_point, codes) -> None:
    # Values on and halfway between grid points, where the rounding rule decides.
    x = (np.asarray(codes, np.float32) / np.float32(2)) * np.float32(scale)
    binding = IOBinding("x", 0, x.shape, scale, zero_point)
    expected = quantize_linear(x, np.float32(scale), np.int8(zero_point))
    np.testing.assert_array_equal(binding.quantize(x), expected)
