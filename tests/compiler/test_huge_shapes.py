"""Shapes read from a model that would need more memory than one tensor may take are refused
before anything is allocated (a 10^12-element ConstantOfShape once asked for 3.6 TiB)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.errors import CompileError
from compiler.frontend.onnx import import_model
from simulator.numerics import MAX_TENSOR_BYTES, oversize
from tests.onnx_builder import model

BIG = 1_000_000


def _mean_of(node, initializers) -> object:
    """x + mean(node's output): the node's output is a constant computed at import."""
    return model([node, helper.make_node("ReduceMean", ["c"], ["r"], name="mean", keepdims=0),
                  helper.make_node("Add", ["x", "r"], ["y"], name="add")],
                 {"x": [1, 4]}, {"y": [1, 4]}, initializers)


@pytest.mark.parametrize("node,initializers", [
    (helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill"),
     {"s": np.array([BIG, BIG], np.int64)}),
    (helper.make_node("Pad", ["d", "p"], ["c"], name="fill"),
     {"d": np.zeros((2, 2), np.float32), "p": np.array([0, 0, BIG, BIG], np.int64)}),
    (helper.make_node("Resize", ["d", "", "k"], ["c"], name="fill"),
     {"d": np.zeros((1, 1, 2, 2), np.float32),
      "k": np.array([1, 1, BIG, BIG], np.float32)}),
])
def test_a_huge_constant_is_refused_before_it_is_made(node, initializers) -> None:
    with pytest.raises(CompileError, match=r"node 'fill' \(\w+\): output too large: shape "
                                           r"\[.*\] of float32 is [\d,]+ bytes, over the limit"):
        import_model(_mean_of(node, initializers))


def test_a_huge_model_input_is_refused() -> None:
    proto = model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                  {"x": [1, BIG, BIG]}, {"y": [1, BIG, BIG]})
    with pytest.raises(CompileError, match="input 'x' is too large: shape "
                                           r"\[1, 1000000, 1000000\] of float32"):
        import_model(proto)


def test_the_limit_is_one_tensor_in_bytes() -> None:
    assert oversize([MAX_TENSOR_BYTES // 4], np.float32) is None
    assert "over the limit of 4 GiB" in oversize([MAX_TENSOR_BYTES // 4 + 1], np.float32)
    assert oversize([BIG, BIG, BIG, BIG], np.int8)  # no integer overflow in the product
