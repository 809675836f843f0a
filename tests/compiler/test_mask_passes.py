"""The mask passes: Before/Expected for `cast_early` (an integer mask's Cast moved onto the
mask through Unsqueeze and Expand, equal Casts merged) and `sink_expand` (an Expand sunk past
the broadcasting Mul, the sums over axes it kept and a map, then gone), the fp32 output equal to
onnxruntime's on the original graph; what must stay; and the quantizer's side: the Cast of a
model input is its quantization, any other Cast to float is refused naming it, an integer
output is refused naming it, and the additive mask's ranges (`quantizer.masks`)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.cast_early import cast_early
from compiler.passes.eliminate_common import eliminate_common
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_constants import fold_constants
from compiler.passes.sink_expand import sink_expand
from ember import ort
from ember.flow import optimized_graph
from quantizer.checks import check_quantizable
from quantizer.errors import QuantizeError
from quantizer.masks import additive_mask_ranges
from quantizer.options import QuantOptions

S, D = 6, 4
n = helper.make_node


def pooling(extra_reader: bool = False):
    """sentence-transformers' masked mean pooling of x [1, S, D] by mask [1, S] (int64), and
    BERT's additive mask [1, 1, 1, S] added to scores [1, 2, S, S] before a Softmax."""
    inits = {"last": np.array([-1], np.int64), "shape": np.array([1, S, D], np.int64),
             "tokens": np.array([1], np.int64), "least": np.float32(1e-9),
             "a1": np.array([1], np.int64), "a2": np.array([2], np.int64),
             "one": np.float32(1.0), "lowest": np.float32(np.finfo(np.float32).min)}
    nodes = [n("Unsqueeze", ["mask", "last"], ["m3"]), n("Expand", ["m3", "shape"], ["wide"]),
             n("Cast", ["wide"], ["weights"], to=TensorProto.FLOAT),
             n("Mul", ["x", "weights"], ["masked"]),
             n("ReduceSum", ["masked", "tokens"], ["total"], keepdims=0),
             n("ReduceSum", ["weights", "tokens"], ["count"], keepdims=0),
             n("Clip", ["count", "least"], ["clipped"]), n("Div", ["total", "clipped"], ["y"]),
             n("Unsqueeze", ["mask", "a1"], ["mh"]), n("Unsqueeze", ["mh", "a2"], ["mr"]),
             n("Cast", ["mr"], ["mf"], to=TensorProto.FLOAT), n("Sub", ["one", "mf"], ["inv"]),
             n("Mul", ["inv", "lowest"], ["bias"]), n("Add", ["scores", "bias"], ["biased"]),
             n("Softmax", ["biased"], ["probs"], axis=-1)]
    outputs = {"y": (1, D), "probs": (1, 2, S, S)}
    if extra_reader:
        outputs["wide"] = (1, S, D)
    graph = helper.make_graph(
        nodes, "pooling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, S, D]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2, S, S]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, [1, S])],
        [helper.make_tensor_value_info(name, TensorProto.INT64 if name == "wide"
                                       else TensorProto.FLOAT, shape)
         for name, shape in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


def feeds(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(0, 1, (1, S, D)).astype(np.float32),
            "scores": rng.normal(0, 2, (1, 2, S, S)).astype(np.float32),
            "mask": (np.arange(S) < 4).astype(np.int64)[None]}


def passes(proto):
    graph = fold_constants(import_model(proto))
    return eliminate_dead(eliminate_common(sink_expand(cast_early(graph))))


def test_the_masks_casts_move_onto_it_and_merge_and_the_expand_goes() -> None:
    proto = pooling()
    graph = passes(proto)
    ops = [node.op for node in graph.nodes]
    assert "Expand" not in ops
    casts = [node for node in graph.nodes if node.op == "Cast"]
    assert [node.inputs for node in casts] == [("mask",)]
    reduced = {node.outputs[0]: graph.type_of(node.outputs[0]).shape for node in graph.nodes
               if node.op == "ReduceSum"}
    assert sorted(reduced.values()) == [(1, 1), (1, D)]  # the count sums the [1, S, 1] mask
    sample = feeds()
    expected = ort.run(ort.session(proto), sample)
    got = evaluate(graph, sample)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_an_expand_read_as_it_is_stays() -> None:
    graph = passes(pooling(extra_reader=True))
    assert [node.op for node in graph.nodes].count("Expand") == 1


def test_a_reduction_over_an_expanded_axis_keeps_its_expand() -> None:
    """A sum over D, the axis the Expand widened, counts D copies: the Expand stays."""
    nodes = [n("Unsqueeze", ["mask", "last"], ["m3"]), n("Expand", ["m3", "shape"], ["wide"]),
             n("Cast", ["wide"], ["weights"], to=TensorProto.FLOAT),
             n("ReduceSum", ["weights", "last"], ["y"], keepdims=0)]
    proto = helper.make_model(helper.make_graph(
        nodes, "over_d", [helper.make_tensor_value_info("mask", TensorProto.INT64, [1, S])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, S])],
        [numpy_helper.from_array(np.array([-1], np.int64), "last"),
         numpy_helper.from_array(np.array([1, S, D], np.int64), "shape")]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = passes(proto)
    assert [node.op for node in graph.nodes] == ["Cast", "Unsqueeze", "Expand", "ReduceSum"]
    sample = {"mask": feeds()["mask"]}
    np.testing.assert_array_equal(evaluate(graph, sample)["y"],
                                  ort.run(ort.session(proto), sample)["y"])


def test_a_model_inputs_cast_is_quantizable_and_a_computed_ones_is_refused() -> None:
    graph = optimized_graph(pooling())
    check_quantizable(graph, QuantOptions())  # the mask's Cast: the input's quantization
    ids = [n("Add", ["mask", "mask"], ["twice"]),
           n("Cast", ["twice"], ["y"], to=TensorProto.FLOAT)]
    proto = helper.make_model(helper.make_graph(
        ids, "computed", [helper.make_tensor_value_info("mask", TensorProto.INT64, [1, S])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, S])]),
        opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(QuantizeError, match=r"casts 'twice' \(int64\) to float32: only a "
                                            r"model input's integers"):
        check_quantizable(import_model(proto), QuantOptions())


def test_an_integer_output_is_refused_naming_it() -> None:
    graph = optimized_graph(pooling(extra_reader=True))
    with pytest.raises(QuantizeError, match=r"output 'wide' \(int64\) is not a float value"):
        check_quantizable(graph, QuantOptions())


def test_the_additive_mask_gets_the_scores_range_widened_by_the_gap() -> None:
    """Scores in [-4, 6], a mask in [lowest, 0]: the sum over [-4 - ln(256·6), 6], the mask
    over [-(10 + ln(256·6)), 0]."""
    graph = optimized_graph(pooling())
    ranges = {"scores": (-4.0, 6.0), "bias": (float(np.finfo(np.float32).min), 0.0)}
    found = additive_mask_ranges(graph, lambda name: ranges[name])
    gap = np.log(256 * S)
    assert found["biased"] == pytest.approx((-4 - gap, 6.0))
    assert found["bias"] == pytest.approx((-(10 + gap), 0.0))


def test_a_bias_that_reaches_no_further_than_the_scores_is_no_mask() -> None:
    graph = optimized_graph(pooling())
    ranges = {"scores": (-4.0, 6.0), "bias": (-3.0, 0.0)}
    assert additive_mask_ranges(graph, lambda name: ranges[name]) == {}
