"""The written-out softmax fusion: Before (Exp of x less its ReduceMax, or of x itself, over
its ReduceSum, along one axis) / Expected (one Softmax on that axis), the fp32 output equal to
onnxruntime's on the original graph; and what must not fuse."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fuse_softmax import fuse_softmax
from ember import ort
from ember.flow import CompileOptions, compile_model, optimized_graph
from tests.e2e.flow import check_bit_exact, model_samples
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

SHAPE = [1, 3, 4, 6]


def written_out(shift: bool = True, axis: int = -1, extra_reader: bool = False):
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"], name="relu")]
    x = "r"
    if shift:
        nodes += [n("ReduceMax", [x], ["m"], axes=[axis], keepdims=1, name="max"),
                  n("Sub", [x, "m"], ["d"], name="shift")]
        x = "d"
    nodes += [n("Exp", [x], ["e"], name="exp"),
              n("ReduceSum", ["e", "axes"], ["s"], keepdims=1, name="sum"),
              n("Div", ["e", "s"], ["y"], name="normalize")]
    outputs = {"y": SHAPE}
    if extra_reader:
        outputs["e"] = SHAPE
    return model(nodes, {"x": SHAPE}, outputs, {"axes": np.array([axis], np.int64)}, opset=17)


@pytest.mark.parametrize("shift,axis", [(True, -1), (False, -1), (True, 1)])
def test_a_written_out_softmax_becomes_one(shift: bool, axis: int) -> None:
    proto = written_out(shift, axis)
    graph = eliminate_dead(fuse_softmax(fold_constants(import_model(proto))))
    assert [node.op for node in graph.nodes] == ["Relu", "Softmax"]
    assert graph.nodes[-1].attrs == {"axis": axis % 4} and graph.nodes[-1].outputs == ("y",)
    x = {"x": np.random.default_rng(1).normal(0, 3, SHAPE).astype(np.float32)}
    np.testing.assert_allclose(evaluate(graph, x)["y"], ort.run(ort.session(proto), x)["y"],
                               rtol=1e-5, atol=1e-7)


def test_an_exponential_read_elsewhere_is_left_written_out() -> None:
    graph = fuse_softmax(fold_constants(import_model(written_out(extra_reader=True))))
    assert "Softmax" not in [node.op for node in graph.nodes]


def test_a_fused_softmax_runs_on_the_accelerator() -> None:
    proto = written_out()
    profile = profile_of(proto, model_samples(proto, 4), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions())
    assert built.compiled.program.host_segments == ()
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 2, 1))


def test_jaxs_softmax_with_keepdims_0_reshapes_and_a_guard_becomes_one() -> None:
    """JAX through tf2onnx (Magika's head): ReduceMax without keepdims, Max with -inf (a guard
    for a row of -inf), Reshape back, Sub, Exp, ReduceSum without keepdims, Reshape, Div."""

    from tests.e2e.models import jax_softmax
    nodes: list = [helper.make_node("Relu", ["x"], ["r"], name="relu")]
    inits: dict = {}
    y = jax_softmax(nodes, inits, "r", (2, 7), "softmax")
    proto = model(nodes, {"x": [2, 7]}, {y: [2, 7]}, inits, opset=15)
    graph = eliminate_dead(fuse_softmax(fold_constants(import_model(proto))))
    assert [node.op for node in graph.nodes] == ["Relu", "Softmax"]
    x = {"x": np.random.default_rng(2).normal(0, 3, (2, 7)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(graph, x)[y], ort.run(ort.session(proto), x)[y],
                               rtol=1e-5, atol=1e-7)
