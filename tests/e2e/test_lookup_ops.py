"""Every operator whose row quantizes it to a 256-entry table and lowers it to the vector unit's
LUT runs on the accelerator alone, bit-exactly: a new such operator is one row of the table, and
this test covers it without naming it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.graph.int8 import Quant
from compiler.graph.ops import OPS, Lower
from tests.e2e.flow import compile_and_check
from tests.onnx_builder import model

LOOKUP_OPS = sorted(name for name, op in OPS.items()
                    if op.quant is Quant.LOOKUP and op.lower is Lower.LUT)


def opset_of(op: str, preferred: int = 17) -> int:
    """`preferred`, or the first opset that has `op` (Gelu 20, Swish 24) when it is newer."""
    try:
        onnx.defs.get_schema(op, preferred)
        return preferred
    except onnx.defs.SchemaError:
        return onnx.defs.get_schema(op).since_version


def test_the_table_has_lookup_operators() -> None:
    assert {"Sigmoid", "Tanh"} <= set(LOOKUP_OPS)


@pytest.mark.parametrize("op", LOOKUP_OPS)
@pytest.mark.parametrize("preset", ["edge", "default"])
def test_lookup_operator_runs_on_the_accelerator_bit_exactly(op: str, preset: str) -> None:
    # 5x7x9 = 315 elements: several vector rows on either preset and a partial last one.
    # A row's further required inputs (Pow's exponent) are constants, here 2.
    extra = {f"c{i}": np.float32(2.0) for i in range(1, OPS[op].min_inputs)}
    proto = model([helper.make_node(op, ["x", *extra], ["y"], name="f")], {"x": (1, 5, 7, 9)},
                  {"y": (1, 5, 7, 9)}, extra, opset=opset_of(op))
    compiled, _ = compile_and_check(proto, preset)
    assert compiled.program.host_segments == ()
    assert [row["kind"] for row in compiled.summary.per_layer] == ["Lut"]


@pytest.mark.parametrize("exponent", [3.0, 0.5, -1.0])
def test_pow_binds_its_constant_exponent_into_the_table(exponent: float) -> None:
    proto = model([helper.make_node("Abs", ["x"], ["a"]),
                   helper.make_node("Pow", ["a", "e"], ["y"], name="f")], {"x": (1, 5, 7, 9)},
                  {"y": (1, 5, 7, 9)}, {"e": np.float32(exponent)})
    compiled, _ = compile_and_check(proto, "edge")
    assert compiled.program.host_segments == ()
