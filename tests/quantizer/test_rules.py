"""The operator table's quantization columns: every kind has its rule and every row the
details its rule reads, and one `zero_point_fold` matches each linear operator's reduction."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.graph.int8 import Quant, zero_point_fold
from compiler.graph.ir import QuantParams, Type, Value
from compiler.graph.ops import FUSED_ONLY, IMPORTABLE, OPS
from quantizer.quantize import RULES

# The row column each rule kind reads besides the kind itself.
_DETAIL = {Quant.LINEAR: "weight", Quant.CLAMP: "clamp_bounds", Quant.AVERAGE: "window_sizes"}


@pytest.mark.parametrize("name", sorted(n for n in IMPORTABLE | FUSED_ONLY
                                         if OPS[n].quant is not None))
def test_every_quantizable_row_names_a_rule_and_has_its_details(name: str) -> None:
    row = OPS[name]
    assert row.quant in RULES
    detail = _DETAIL.get(row.quant)
    if detail is not None:
        assert getattr(row, detail) is not None, f"{name}: {row.quant} reads `{detail}`"


def test_the_kinds_only_quantized_graphs_hold_have_no_rule() -> None:
    for kind in Quant:
        assert (kind in RULES) != kind.quantized_only


def _activation(shape, zero: int) -> Value:
    return Value("x", Type("int8", shape, QuantParams.per_tensor(0.1, zero)))


def _weight(array) -> Value:
    array = np.asarray(array, np.int8)
    return Value("w", Type("int8", array.shape, QuantParams.per_tensor(0.1)), array)


# Before: a linear node, its constant operand and the activation's zero point (3).
# Expected: -3 times the constant summed over the axes the operator reduces, shaped like the bias.
W = np.arange(6).reshape(2, 3) - 2       # [[-2, -1, 0], [1, 2, 3]]: rows sum to -3 and 6
FOLDS = [
    ("Conv", {}, (1, 3, 1, 1), "b", W.reshape(2, 3, 1, 1), [9, -18]),
    ("Gemm", {"transA": 0, "transB": 1}, (4, 3), "b", W, [9, -18]),
    ("Gemm", {"transA": 0, "transB": 0}, (4, 2), "b", W, [3, -3, -9]),
    ("Gemm", {"transA": 0, "transB": 0}, (3, 4), "a", W, [[9], [-18]]),
    ("Gemm", {"transA": 1, "transB": 0}, (2, 4), "a", W, [[3], [-3], [-9]]),
    ("MatMul", {}, (4, 2), "b", W, [[3, -3, -9]]),
    ("MatMul", {}, (4, 3), "b", W[1], -18),
    ("MatMul", {}, (3, 4), "a", W, [[9], [-18]]),
]


@pytest.mark.parametrize("op, attrs, shape, const, w, expected", FOLDS)
def test_zero_point_fold(op, attrs, shape, const, w, expected) -> None:
    x, weight = _activation(shape, 3), _weight(w)
    a, b = (weight, x) if const == "a" else (x, weight)
    fold = zero_point_fold(OPS[op].weight, attrs, a, b)
    np.testing.assert_array_equal(fold, np.asarray(expected))
    assert np.shape(fold) == np.shape(expected)


@pytest.mark.parametrize("op, attrs, shape, const, w, expected", FOLDS)
def test_the_fold_is_what_the_reference_sums(op, attrs, shape, const, w, expected) -> None:
    """fp32(x - z, w) == fp32(x, w) + fold: the fold is exactly the zero point's share."""
    row = OPS[op]
    codes = np.random.default_rng(0).integers(-128, 128, shape).astype(np.float64)
    x, weight = _activation(shape, 3), _weight(w)
    a, b = (weight, x) if const == "a" else (x, weight)
    fold = zero_point_fold(row.weight, attrs, a, b)
    args = (weight.const.astype(np.float64), codes) if const == "a" else \
        (codes, weight.const.astype(np.float64))
    centred = (args[0], args[1] - 3) if const == "a" else (args[0] - 3, args[1])
    bound = {**{k: v for k, v in row.attrs.items() if k in attrs}, **attrs}
    want = row.fp32(*centred, **bound)
    got = row.fp32(*args, **bound)
    if op == "Conv":
        fold = fold.reshape(1, -1, 1, 1)  # the bias's place in the output
    np.testing.assert_array_equal(got + fold, want)


def test_no_fold_without_exactly_one_constant_operand() -> None:
    x = _activation((2, 3), 3)
    assert zero_point_fold(OPS["MatMul"].weight, {}, x, x) is None
    assert zero_point_fold(OPS["MatMul"].weight, {}, _weight(W), _weight(W)) is None
