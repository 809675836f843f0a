"""The one-hot embedding fusion: Before (ids compared with a range, cast to float, times a
table, plus a bias; or OneHot) / Expected (one Gather of the table with the bias in its rows),
the fp32 output equal to onnxruntime's; what must not fuse; and the lookup on the accelerator
(the indexed DMA) bit-exact."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fuse_one_hot import fuse_one_hot
from ember import ort
from ember.flow import CompileOptions, compile_model, optimized_graph
from simulator import isa
from tests.e2e.flow import check_bit_exact
from tests.quantizer.util import profile_of

T, K, N = 12, 20, 6  # tokens, the range, the table's width


def one_hot_dense(form: str = "equal", span=None, extra_output: bool = False):
    """ids int32 [1, T] → one-hot [1, T, K] (Equal with a range and Cast, or OneHot) → MatMul
    by W [K, N] → + b."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    inits = {"w": rng.normal(0, 1, (K, N)).astype(np.float32),
             "b": rng.normal(0, 0.1, N).astype(np.float32),
             "shape": np.array([1, T, 1], np.int64),
             "range": (np.arange(K) if span is None else span).astype(np.int32)
             .reshape(1, 1, K),
             "depth": np.array([K], np.int64), "values": np.array([0, 1], np.float32)}
    if form == "equal":
        nodes = [n("Reshape", ["ids", "shape"], ["column"]),
                 n("Equal", ["column", "range"], ["hot"]),
                 n("Cast", ["hot"], ["one_hot"], to=onnx.TensorProto.FLOAT)]
    else:
        nodes = [n("OneHot", ["ids", "depth", "values"], ["one_hot"], axis=-1)]
    nodes += [n("MatMul", ["one_hot", "w"], ["product"]), n("Add", ["product", "b"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, T, N])]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("one_hot", onnx.TensorProto.FLOAT,
                                                     [1, T, K]))
    # onnxruntime's OneHot takes int64 indices; tf2onnx's Equal form, Magika's, int32 ones.
    kind = onnx.TensorProto.INT32 if form == "equal" else onnx.TensorProto.INT64
    graph = helper.make_graph(
        nodes, "one_hot", [helper.make_tensor_value_info("ids", kind, [1, T])],
        outputs, [numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def ids(count: int, seed: int, dtype=np.int32) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(0, K, (1, T)).astype(dtype)} for _ in range(count)]


@pytest.mark.parametrize("form", ["equal", "one_hot"])
def test_a_one_hot_times_a_table_becomes_a_lookup_with_the_bias_in_its_rows(form) -> None:
    proto = one_hot_dense(form)
    graph = eliminate_dead(fuse_one_hot(fold_constants(import_model(proto))))
    assert [node.op for node in graph.nodes] == ["Gather"]
    gather = graph.nodes[0]
    assert gather.inputs[1] == "ids" and gather.outputs == ("y",)
    w, b = (numpy_helper.to_array(i) for i in proto.graph.initializer[:2])
    np.testing.assert_allclose(graph.values[gather.inputs[0]].const, w + b, rtol=1e-6)
    for feeds in ids(3, 1, np.int32 if form == "equal" else np.int64):
        np.testing.assert_allclose(evaluate(graph, feeds)["y"],
                                   ort.run(ort.session(proto), feeds)["y"], rtol=1e-5,
                                   atol=1e-6)


def test_a_range_that_is_not_0_to_k_or_a_one_hot_read_elsewhere_stays() -> None:
    shifted = one_hot_dense(span=np.arange(1, K + 1))
    assert "Gather" not in [n.op for n in fuse_one_hot(fold_constants(import_model(shifted))).nodes]
    shared = one_hot_dense(extra_output=True)
    assert "Gather" not in [n.op for n in fuse_one_hot(fold_constants(import_model(shared))).nodes]


def test_the_fused_lookup_runs_on_the_accelerator_bit_exactly() -> None:
    proto = one_hot_dense()
    profile = profile_of(proto, ids(8, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions())
    assert built.compiled.program.host_segments == ()
    assert any(i.op is isa.GATHER for i in built.compiled.program.instructions)
    check_bit_exact(built.qgraph, built.compiled, ids(3, 4))
