"""The LayerNorm fusion by evaluation: Before (a norm as JAX writes it through tf2onnx: sums
times 1/n, Max(0, E[x²] - E[x]²), Sqrt, Reciprocal, broadcasting Reshapes; over the last axis
or another one) / Expected (one LayerNormalization, between two Transposes for another axis),
the fp32 output equal to onnxruntime's; and regions that are not a LayerNorm (an RMSNorm: no
mean taken off) or whose inner values something else reads, left as they are."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fuse_norm_by_value import fuse_norm_by_value
from ember import ort
from tests.e2e.models import jax_layer_norm

SHAPE = (1, 6, 10)


def norm_model(axis: int, rms: bool = False, extra_output: bool = False):
    """x → Relu → a JAX-form LayerNorm over `axis` → y (with `rms`, the mean is not taken
    off: an RMSNorm's x / sqrt(E[x²] + eps) * gamma + beta)."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu")]
    inits: dict = {}
    y = jax_layer_norm(nodes, inits, "r", SHAPE, axis, "norm", rng)
    if rms:  # x - 0 instead of x - mean, and E[x²] alone
        inits["norm/none"] = np.zeros([1 if i == axis else d for i, d in enumerate(SHAPE)],
                                      np.float32)
        for node in nodes:
            if node.output[0] == "norm/centred":
                node.input[1] = "norm/none"
            if node.output[0] == "norm/var0":
                node.input[1] = "norm/zero"
    outputs = [helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, list(SHAPE))]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("norm/mean", onnx.TensorProto.FLOAT,
                                                     [SHAPE[i] for i in range(3) if i != 2]))
    graph = helper.make_graph(
        nodes, "norm", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                      list(SHAPE))],
        outputs, [numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def passes(proto):
    return eliminate_dead(fuse_norm_by_value(fold_constants(import_model(proto))))


@pytest.mark.parametrize("axis, ops", [
    (2, ["Relu", "LayerNormalization"]),
    (1, ["Relu", "Transpose", "LayerNormalization", "Transpose"])])
def test_a_jax_layer_norm_over_any_axis_becomes_one(axis: int, ops: list[str]) -> None:
    proto = norm_model(axis)
    graph = passes(proto)
    assert [node.op for node in graph.nodes] == ops
    norm = next(n for n in graph.nodes if n.op == "LayerNormalization")
    assert norm.attrs["epsilon"] == pytest.approx(1e-6)
    rng = np.random.default_rng(1)
    for scale in (1.0, 0.3):  # smaller: E[x²] - E[x]² cancels in float32 (written out)
        feeds = {"x": rng.normal(0.2, scale, SHAPE).astype(np.float32)}
        np.testing.assert_allclose(evaluate(graph, feeds)["norm/y"],
                                   ort.run(ort.session(proto), feeds)["norm/y"], rtol=1e-4,
                                   atol=1e-4)


def test_what_is_not_a_layer_norm_or_is_read_inside_stays_written_out() -> None:
    assert "LayerNormalization" not in [n.op for n in passes(norm_model(2, rms=True)).nodes]
    shared = passes(norm_model(2, extra_output=True))
    assert "LayerNormalization" not in [n.op for n in shared.nodes]
