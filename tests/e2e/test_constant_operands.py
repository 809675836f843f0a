"""Add, Sub, Mul and Div with a constant tensor operand that varies over the pixels (a
positional embedding, a fixed mask, a per-pixel bias) on the accelerator: the quantizer gives
the constant its own per-tensor int8 scale, the codes live in the program's DRAM image, and the
vector unit's ADD or MUL reads them over a View that repeats them (stride 0) where the constant
has one value; Div by a constant is a Mul by its reciprocal. Bit-exact on the edge and default
presets with no host segment."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.graph.evaluate import evaluate
from ember.flow import CompileOptions, compile_model, optimized_graph
from ember.reports.metrics import ErrorStats
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from tests.e2e.flow import check_bit_exact, compile_and_check, quantized, samples
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

C = 10  # two channel blocks on the edge preset (8 lanes), a partial one on default (16)


def constant_model(op: str, shape: tuple[int, ...], const_first: bool,
                   x_shape: tuple[int, ...] = (1, C, 5, 3), seed: int = 0):
    """x → Relu (Sigmoid for a divisor: away from zero) → op with a constant k of `shape`
    (away from zero, either sign)."""
    rng = np.random.default_rng(seed)
    const = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    inputs = ["k", "r"] if const_first else ["r", "k"]
    first = "Sigmoid" if op == "Div" and const_first else "Relu"
    nodes = [helper.make_node(first, ["x"], ["r"], name="first"),
             helper.make_node(op, inputs, ["y"], name="f")]
    return model(nodes, {"x": list(x_shape)}, {"y": list(np.broadcast_shapes(x_shape, shape))},
                 {"k": const.astype(np.float32)})


# Over H and W per channel, over H and W for every channel (given at rank 4 and at rank 2),
# along W only, along H per channel.
SHAPES = [(1, C, 5, 3), (1, 1, 5, 3), (5, 3), (1, 1, 1, 3), (C, 5, 1)]
FORMS = [(op, shape, first) for op in ("Add", "Sub", "Mul", "Div") for shape in SHAPES
         for first in (False, True)]


@pytest.mark.parametrize("op, shape, const_first", FORMS, ids=lambda v: str(v).replace(" ", ""))
def test_constant_tensor_operand_runs_on_the_accelerator_bit_exactly(op, shape,
                                                                     const_first) -> None:
    compiled, _ = compile_and_check(constant_model(op, shape, const_first), "edge")
    assert compiled.program.host_segments == ()


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_constant_tensor_operand_bit_exact_on_default_over_a_batch(op) -> None:
    """Two images read the one constant (its View's single image)."""
    proto = constant_model(op, (1, 1, 5, 3), True, x_shape=(2, C, 5, 3))
    compiled, _ = compile_and_check(proto, "default")
    assert compiled.program.host_segments == ()


def sequence_model(op: str, shape: tuple[int, ...], const_first: bool, seed: int = 0):
    """x [1, 6, 16] → MatMul → [1, 6, 8] → op with a constant k of `shape`: a token sequence
    (rank 3, its last axis in the lanes) with a positional table or a per-token scale."""
    rng = np.random.default_rng(seed)
    const = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    inputs = ["k", "m"] if const_first else ["m", "k"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="project"),
             helper.make_node(op, inputs, ["y"], name="f")]
    return model(nodes, {"x": [1, 6, 16]}, {"y": [1, 6, 8]},
                 {"w": rng.standard_normal((16, 8)).astype(np.float32),
                  "k": const.astype(np.float32)})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("shape", [(6, 8), (6, 1), (8,)])
def test_constant_operand_of_a_sequence_bit_exact(op, shape) -> None:
    """A value per token ([6, 1]) repeats along the lanes: ADD reads its codes repeated there,
    MUL splats lane 0."""
    for const_first, preset in ((False, "edge"), (True, "default")):
        compiled, _ = compile_and_check(sequence_model(op, shape, const_first), preset)
        assert compiled.program.host_segments == ()


def test_constant_codes_live_in_the_dram_image() -> None:
    proto = constant_model("Add", (1, C, 5, 3), False)
    compiled, _ = compile_and_check(proto, "edge", count=1)
    codes = quantized(proto, samples({"x": (1, C, 5, 3)}, 8)).values["k/q"].const
    assert codes.transpose(0, 2, 3, 1).tobytes() in compiled.program.dram_image


@pytest.mark.parametrize("op, const_first", [("Add", False), ("Mul", True), ("Div", False),
                                             ("Sub", True)])
def test_constant_tensor_operand_follows_fp32(op, const_first) -> None:
    proto = constant_model(op, (1, 1, 5, 3), const_first)
    graph = optimized_graph(proto)
    qgraph = quantized(proto, samples({"x": (1, C, 5, 3)}, 16))
    error = ErrorStats()
    for feed in samples({"x": (1, C, 5, 3)}, 8, seed=5):
        error.add(evaluate(graph, feed)["y"], run_int8(qgraph, feed)["y"])
    assert error.sqnr_db > 30.0, error.sqnr_db


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_constant_tensor_operand_with_uint8_activations_bit_exact(op) -> None:
    """uint8 quantization gives the constant uint8 codes too: the int8 passes offset them as
    they offset the activations."""
    proto = constant_model(op, (1, 1, 5, 3), True)
    shapes = {"x": (1, C, 5, 3)}
    profile = profile_of(proto, samples(shapes, 8), optimized_graph(proto))
    built = compile_model(proto, profile,
                          CompileOptions(quant=QuantOptions(activation_dtype="uint8")), "edge")
    assert built.compiled.program.host_segments == ()
    check_bit_exact(built.qgraph, built.compiled, samples(shapes, 2, 1))
