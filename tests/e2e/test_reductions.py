"""ReduceMax, ReduceMin and ReduceL2 in int8 on the accelerator: over the contiguous axis (a
row-major tensor's last, a map's channels) the vector unit's REDUCE, one value per row (max
and min exact in the input's scale; L2 the root of the centred codes' squares summed, in Q8),
a maximum over H and W a MAXPOOL; an L2 normalization (x / ReduceL2(x), as sentence encoders
end) whole on the accelerator. Bit-exact; the int8 outputs within a step or two of fp32."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.errors import CompileError
from compiler.graph.evaluate import evaluate
from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.reference import run_int8
from simulator import isa
from tests.e2e.flow import check_bit_exact
from tests.onnx_builder import model
from tests.quantizer.util import profile_of


def reduced(op: str, shape: list[int], axes: list[int], keepdims: int = 1):
    out = [1 if i in [a % len(shape) for a in axes] else d for i, d in enumerate(shape)]
    if not keepdims:
        out = [d for i, d in enumerate(shape) if i not in [a % len(shape) for a in axes]]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu") if op != "ReduceMin" else
             helper.make_node("Neg", ["x"], ["r"], name="neg"),
             helper.make_node(op, ["r", "axes"], ["y"], name="reduce", keepdims=keepdims)]
    return model(nodes, {"x": shape}, {"y": out}, {"axes": np.array(axes, np.int64)}, opset=18)


def samples(shape, count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(count)]


CASES = [("ReduceMax", [2, 5, 40], [-1], 1), ("ReduceMin", [1, 7, 300], [2], 0),
         ("ReduceL2", [2, 5, 40], [-1], 1), ("ReduceL2", [1, 24, 3, 5], [1], 1),
         ("ReduceMax", [1, 6, 9, 11], [2, 3], 1), ("ReduceMax", [1, 20, 4, 4], [1], 0)]


@pytest.mark.parametrize("op, shape, axes, keepdims", CASES)
def test_a_reduction_runs_on_the_accelerator_bit_exactly(op, shape, axes, keepdims) -> None:
    proto = reduced(op, shape, axes, keepdims)
    graph = optimized_graph(proto)
    profile = profile_of(proto, samples(shape, 6, 0), graph)
    built = compile_model(proto, profile, CompileOptions())
    program = built.compiled.program
    assert program.host_segments == ()
    spatial = op == "ReduceMax" and axes == [2, 3]
    assert any(i.op is (isa.MAXPOOL if spatial else isa.REDUCE) for i in program.instructions)
    check_bit_exact(built.qgraph, built.compiled, samples(shape, 2, 1))
    out = built.qgraph.type_of(built.qgraph.outputs[0] + "/q" if built.qgraph.outputs[0] + "/q"
                               in built.qgraph.values else built.qgraph.outputs[0])
    for feeds in samples(shape, 2, 2):
        want, got = evaluate(graph, feeds)["y"], run_int8(built.qgraph, feeds)["y"]
        assert np.abs(want - got).max() <= 2.5 * out.quant.scale[0] + 0.02 * np.abs(want).max()


def test_a_minimum_over_h_and_w_is_refused_in_one_line() -> None:
    shape = [1, 4, 5, 6]
    proto = reduced("ReduceMin", shape, [2, 3])
    profile = profile_of(proto, samples(shape, 2, 0), optimized_graph(proto))
    with pytest.raises(CompileError, match="reduces axes"):
        compile_model(proto, profile, CompileOptions())


def test_an_l2_normalization_runs_whole_and_close_to_fp32() -> None:
    """y = x / ReduceL2(x) over the last axis (sentence-transformers' Normalize): REDUCE op l2,
    then the divisor's reciprocal table and MUL."""
    shape = [1, 6, 32]
    nodes = [helper.make_node("ReduceL2", ["x", "axes"], ["norm"], keepdims=1, name="l2"),
             helper.make_node("Div", ["x", "norm"], ["y"], name="normalize")]
    proto = model(nodes, {"x": shape}, {"y": shape}, {"axes": np.array([-1], np.int64)},
                  opset=18)
    graph = optimized_graph(proto)
    profile = profile_of(proto, samples(shape, 8, 0), graph)
    built = compile_model(proto, profile, CompileOptions())
    assert built.compiled.program.host_segments == ()
    check_bit_exact(built.qgraph, built.compiled, samples(shape, 2, 1))
    for feeds in samples(shape, 3, 2):
        want, got = evaluate(graph, feeds)["y"], run_int8(built.qgraph, feeds)["y"]
        cosine = (want * got).sum() / np.linalg.norm(want) / np.linalg.norm(got)
        assert cosine > 0.995


def test_a_clip_after_an_l2_reduction_stays_bit_exact() -> None:
    """REDUCE has no clamp, so a Clip reading ReduceL2 must stay its own node, not fold into
    the reduction's qclamp (which only the integer reference would apply)."""
    shape = [2, 5, 40]
    nodes = [helper.make_node("ReduceL2", ["x", "axes"], ["n"], keepdims=1, name="l2"),
             helper.make_node("Clip", ["n", "lo", "hi"], ["y"], name="clip")]
    proto = model(nodes, {"x": shape}, {"y": [2, 5, 1]},
                  {"axes": np.array([-1], np.int64), "lo": np.array(5.0, np.float32),
                   "hi": np.array(7.0, np.float32)}, opset=18)
    built = compile_model(proto, profile_of(proto, samples(shape, 6, 0), optimized_graph(proto)),
                          CompileOptions())
    assert built.compiled.program.host_segments == ()
    check_bit_exact(built.qgraph, built.compiled, samples(shape, 2, 1))
