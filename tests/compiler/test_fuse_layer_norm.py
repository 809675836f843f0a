"""The written-out LayerNorm fusion: Before (ReduceMean, Sub, Pow or Mul, ReduceMean, Add eps,
Sqrt, Div, then Mul gamma and Add beta when present) / Expected (one LayerNormalization), the
fp32 output equal to onnxruntime's on the original graph; and what must not fuse."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fuse_layer_norm import fuse_layer_norm
from ember import ort
from tests.onnx_builder import model

W = 12


def written_out(square: str = "Pow", affine: bool = True, extra_reader: bool = False):
    rng = np.random.default_rng(0)
    inits = {"axes": np.array([-1], np.int64), "two": np.float32(2.0), "eps": np.float32(1e-5),
             "gamma": rng.uniform(0.5, 1.5, W).astype(np.float32),
             "beta": rng.normal(0, 0.2, W).astype(np.float32)}
    n = helper.make_node
    nodes = [n("ReduceMean", ["x", "axes"], ["mean"]), n("Sub", ["x", "mean"], ["d"]),
             n("Pow", ["d", "two"], ["d2"]) if square == "Pow" else n("Mul", ["d", "d"], ["d2"]),
             n("ReduceMean", ["d2", "axes"], ["var"]), n("Add", ["var", "eps"], ["ve"]),
             n("Sqrt", ["ve"], ["std"]), n("Div", ["d", "std"], ["norm"])]
    out = "norm"
    if affine:
        nodes += [n("Mul", ["norm", "gamma"], ["scaled"]), n("Add", ["scaled", "beta"], ["y"])]
        out = "y"
    outputs = {out: [1, 5, W]}
    if extra_reader:
        outputs["d"] = [1, 5, W]
    return model(nodes, {"x": [1, 5, W]}, outputs, inits, opset=18)


@pytest.mark.parametrize("square,affine", [("Pow", True), ("Mul", True), ("Pow", False)])
def test_a_written_out_layer_norm_becomes_one(square: str, affine: bool) -> None:
    proto = written_out(square, affine)
    graph = eliminate_dead(fuse_layer_norm(fold_constants(import_model(proto))))
    assert [node.op for node in graph.nodes] == ["LayerNormalization"]
    x = {"x": np.random.default_rng(1).normal(0.3, 2, (1, 5, W)).astype(np.float32)}
    expected = ort.run(ort.session(proto), x)
    for name in graph.outputs:
        np.testing.assert_allclose(evaluate(graph, x)[name], expected[name], rtol=1e-4,
                                   atol=1e-5)


def test_a_centred_value_read_elsewhere_is_left_written_out() -> None:
    graph = fuse_layer_norm(fold_constants(import_model(written_out(extra_reader=True))))
    assert "LayerNormalization" not in [node.op for node in graph.nodes]
