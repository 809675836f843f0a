"""Each fp32 pass against a Before/Expected pair, compared structurally and numerically."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.errors import CompileError
from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.graph.ir import Graph, Type, Value, verify
from compiler.passes.channel_affine import channel_affine
from compiler.passes.eliminate_common import eliminate_common
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_batchnorm import fold_batchnorm
from compiler.passes.fold_bias import fold_bias
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fold_pad import fold_pad
from compiler.passes.remove_identity import remove_identity
from compiler.pipeline import GRAPH_PASSES, INT8_PASSES, optimize
from ember import ort
from ember.compare import max_relative_error
from tests.onnx_builder import conv_bn_relu, model


def structure(graph: Graph) -> list[tuple]:
    """Ops in order with their wiring, names abstracted: (op, operand refs, attrs keys)."""
    index: dict[str, str] = {name: f"in{i}" for i, name in enumerate(graph.inputs)}
    rows = []
    for k, node in enumerate(graph.nodes):
        refs = []
        for name in node.inputs:
            if not name:
                refs.append("_")
            elif graph.values[name].is_const:
                refs.append(f"const{graph.values[name].type.shape}")
            else:
                refs.append(index[name])
        for j, out in enumerate(node.outputs):
            index[out] = f"n{k}.{j}"
        rows.append((node.op, tuple(refs), tuple(sorted(node.attrs))))
    return rows + [("outputs", tuple(index[o] for o in graph.outputs))]


def assert_same_function(before: Graph, after: Graph, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal(before.type_of(n).shape).astype(np.float32)
             for n in before.inputs}
    a, b = evaluate(before, feeds), evaluate(after, feeds)
    for name in before.outputs:
        assert max_relative_error(b[name], a[name]) < 1e-5


def test_fold_constants_collapses_shape_chains_into_a_constant_reshape() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"], name="unsq"),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], name="cat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="flat")]
    before = import_model(model(nodes, {"x": [2, 3, 4]}, {"y": [2, 12]},
                                {"zero": np.array(0, np.int64), "ax": np.array([0], np.int64),
                                 "minus1": np.array([-1], np.int64)}))
    expected = import_model(model([helper.make_node("Reshape", ["x", "t"], ["y"])],
                                  {"x": [2, 3, 4]}, {"y": [2, 12]},
                                  {"t": np.array([2, -1], np.int64)}))
    after = fold_constants(before)
    verify(after)
    assert structure(after) == structure(expected)
    np.testing.assert_array_equal(after[after.nodes[0].inputs[1]].const, [2, -1])
    assert_same_function(before, after)


def test_fold_batchnorm_into_conv_keeps_the_bn_output_name() -> None:
    proto = conv_bn_relu()
    before = import_model(proto)
    expected = import_model(model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]},
        {"w": np.zeros((4, 3, 3, 3), np.float32), "b": np.zeros(4, np.float32)}))
    after = fold_batchnorm(before)
    verify(after)
    assert structure(after) == structure(expected)
    assert after.nodes[0].name == "conv" and after.nodes[0].outputs == ("n",)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    reference = ort.run(ort.session(proto), feeds)["y"]
    assert max_relative_error(evaluate(after, feeds)["y"], reference) < 1e-5


@pytest.mark.parametrize("trans_b", [0, 1])
def test_fold_batchnorm_into_gemm(trans_b: int) -> None:
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 6) if trans_b else (6, 5)).astype(np.float32)
    inits = {"w": w, "c": rng.standard_normal(5).astype(np.float32),
             "g": rng.uniform(0.5, 2, 5).astype(np.float32),
             "be": rng.standard_normal(5).astype(np.float32),
             "m": rng.standard_normal(5).astype(np.float32),
             "v": rng.uniform(0.5, 2, 5).astype(np.float32)}
    proto = model([helper.make_node("Gemm", ["x", "w", "c"], ["h"], name="fc", transB=trans_b,
                                    alpha=0.5, beta=2.0),
                   helper.make_node("BatchNormalization", ["h", "g", "be", "m", "v"], ["y"],
                                    name="bn")],
                  {"x": [3, 6]}, {"y": [3, 5]}, inits)
    before = import_model(proto)
    after = fold_batchnorm(before)
    verify(after)
    assert [n.op for n in after.nodes] == ["Gemm"]
    feeds = {"x": rng.standard_normal((3, 6)).astype(np.float32)}
    reference = ort.run(ort.session(proto), feeds)["y"]
    assert max_relative_error(evaluate(after, feeds)["y"], reference) < 1e-5


def test_fold_batchnorm_leaves_a_conv_output_read_twice() -> None:
    proto = conv_bn_relu()
    proto.graph.node.append(helper.make_node("Relu", ["c"], ["z"], name="second_reader"))
    proto.graph.output.append(helper.make_tensor_value_info("z", 1, [1, 4, 8, 8]))
    before = import_model(proto)
    assert fold_batchnorm(before) is before


def test_channel_affine_makes_depthwise_convs_and_a_scalar_div_a_mul() -> None:
    rng = np.random.default_rng(3)
    inits = {n: rng.uniform(0.5, 1.5, 4).astype(np.float32) for n in ("g", "be", "m", "v")}
    inits.update(k=rng.standard_normal((4, 1, 1)).astype(np.float32),
                 two=np.array([2.0], np.float32), plane=np.ones((3, 3), np.float32))
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[1, 1]),
             helper.make_node("BatchNormalization", ["p", "g", "be", "m", "v"], ["n"],
                              name="bn"),
             helper.make_node("Sub", ["k", "n"], ["s"], name="sub"),
             helper.make_node("Div", ["s", "two"], ["d"], name="div"),
             helper.make_node("Add", ["d", "plane"], ["y"], name="add")]
    proto = model(nodes, {"x": [1, 4, 3, 3]}, {"y": [1, 4, 3, 3]}, inits)
    before = import_model(proto)
    after = channel_affine(before)
    verify(after)
    # The Add's constant varies over H and W: it is no per-channel map and stays.
    assert [(n.name, n.op) for n in after.nodes] == [
        ("pool", "MaxPool"), ("bn", "Conv"), ("sub", "Conv"), ("div", "Mul"), ("add", "Add")]
    assert after.node("bn").attrs == {"group": 4, "kernel_shape": [1, 1]}
    assert after.node("bn").outputs == ("n",)
    feeds = {"x": rng.standard_normal((1, 4, 3, 3)).astype(np.float32)}
    reference = ort.run(ort.session(proto), feeds)["y"]
    assert max_relative_error(evaluate(after, feeds)["y"], reference) < 1e-5


def test_remove_identity_and_dropout() -> None:
    nodes = [helper.make_node("Identity", ["x"], ["a"], name="id1"),
             helper.make_node("Dropout", ["a"], ["b"], name="drop"),
             helper.make_node("Relu", ["b"], ["c"], name="relu"),
             helper.make_node("Identity", ["c"], ["y"], name="id_out")]
    before = import_model(model(nodes, {"x": [2, 3]}, {"y": [2, 3]}))
    after = remove_identity(before)
    verify(after)
    # The Identity that names the graph output stays: the output name is part of the model.
    assert [(n.op, n.inputs) for n in after.nodes] == [("Relu", ("x",)), ("Identity", ("c",))]
    assert_same_function(before, after)


def test_eliminate_dead_removes_unread_nodes_and_constants() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="used"),
             helper.make_node("Add", ["x", "k"], ["unused"], name="dead")]
    before = import_model(model(nodes, {"x": [4]}, {"y": [4]}, {"k": np.ones(4, np.float32)}))
    after = eliminate_dead(before)
    verify(after)
    assert [n.name for n in after.nodes] == ["used"] and "k" not in after.values


def test_eliminate_common_merges_equal_nodes() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"),
             helper.make_node("Relu", ["x"], ["b"], name="r2"),
             helper.make_node("LeakyRelu", ["x"], ["c"], name="l1", alpha=0.1),
             helper.make_node("LeakyRelu", ["x"], ["d"], name="l2", alpha=0.2),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Add", ["c", "d"], ["t"], name="add2"),
             helper.make_node("Add", ["s", "t"], ["y"], name="add3")]
    before = import_model(model(nodes, {"x": [4]}, {"y": [4]}))
    after = eliminate_common(before)
    verify(after)
    assert [n.name for n in after.nodes] == ["r1", "l1", "l2", "add", "add2", "add3"]
    assert after.node("add").inputs == ("a", "a")
    assert_same_function(before, after)


@pytest.mark.parametrize("graph_pass", GRAPH_PASSES + INT8_PASSES, ids=lambda p: p.__name__)
def test_a_pass_that_changes_nothing_returns_its_input(graph_pass) -> None:
    graph = import_model(model([helper.make_node("Relu", ["x"], ["y"], name="r")], {"x": [4]},
                               {"y": [4]}))
    assert graph_pass(graph) is graph


def test_pipeline_verifies_after_every_pass_and_keeps_the_function() -> None:
    before = import_model(conv_bn_relu())
    after = optimize(before, check=True)
    assert [n.op for n in after.nodes] == ["Conv", "Relu"]
    assert_same_function(before, after)


def test_verifier_catches_broken_graphs() -> None:
    graph = import_model(conv_bn_relu())
    swapped = graph.replace(nodes=graph.nodes[::-1])
    with pytest.raises(CompileError, match="before it is defined"):
        verify(swapped)
    retyped = graph.replace(values={**graph.values,
                                    "n": Value("n", Type("float32", (1, 4, 7, 7)))})
    with pytest.raises(CompileError, match=r"output 'n' is typed float32\[1x4x7x7\]"):
        verify(retyped)
    twice = graph.replace(nodes=graph.nodes + (graph.nodes[-1].with_(name="again"),))
    with pytest.raises(CompileError, match="defined twice"):
        verify(twice)
    no_output = graph.replace(outputs=("nothing",))
    with pytest.raises(CompileError, match="never defined"):
        verify(no_output)


def _padded(reader: str, widths, value: float | None = None, mode: str = "constant", **attrs):
    """x[1,3,8,8] → Pad(widths, value) → Conv (4 filters, stride 2) or AveragePool 3x3/2."""
    rng = np.random.default_rng(0)
    inputs = ["x", "pads"] + (["value"] if value is not None else [])
    inits = {"pads": np.array(widths, np.int64), "w": rng.standard_normal((4, 3, 3, 3))
             .astype(np.float32)}
    if value is not None:
        inits["value"] = np.array(value, np.float32)
    second = (helper.make_node("Conv", ["p", "w"], ["y"], strides=[2, 2], name="conv", **attrs)
              if reader == "conv" else
              helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                               name="pool", **attrs))
    proto = model([helper.make_node("Pad", inputs, ["p"], name="pad", mode=mode), second],
                  {"x": [1, 3, 8, 8]}, {"y": ["n", "c", "h", "w"]}, inits)
    return proto, import_model(proto)


@pytest.mark.parametrize("reader, pads, attrs, expected_pads", [
    ("conv", (0, 0, 1, 0, 0, 0, 2, 1), {}, [1, 0, 2, 1]),          # asymmetric: TF's SAME
    ("conv", (0, 0, 1, 1, 0, 0, 1, 1), {"pads": [1, 0, 0, 1]}, [2, 1, 1, 2]),
    ("pool", (0, 0, 1, 1, 0, 0, 1, 1), {}, [1, 1, 1, 1]),
    ("pool", (0, 0, 1, 1, 0, 0, 1, 1), {"count_include_pad": 1, "pads": [1, 1, 1, 1]},
     [2, 2, 2, 2]),
])
def test_fold_pad_moves_a_zero_pad_into_its_readers_pads(reader, pads, attrs,
                                                         expected_pads) -> None:
    proto, before = _padded(reader, pads, **attrs)
    after = fold_pad(before)
    (node,) = after.nodes
    assert node.attrs["pads"] == expected_pads and node.inputs[0] == "x"
    if reader == "pool":
        assert node.attrs["count_include_pad"] == 1
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert max_relative_error(evaluate(after, {"x": x})["y"],
                              ort.run(ort.session(proto), {"x": x})["y"]) <= 1e-5


@pytest.mark.parametrize("reader, pads, value, mode, attrs", [
    ("conv", (0, 0, 1, 1, 0, 0, 1, 1), 1.0, "constant", {}),         # not zeros
    ("pool", (0, 1, 0, 0, 0, 0, 0, 0), None, "constant", {}),       # pads channels
    ("conv", (0, 0, 1, 1, 0, 0, 1, 1), None, "reflect", {}),        # not constant
    ("conv", (0, 0, 1, 1, 0, 0, 1, 1), None, "constant", {"auto_pad": "SAME_UPPER"}),
    ("pool", (0, 0, 1, 1, 0, 0, 1, 1), None, "constant", {"pads": [1, 1, 1, 1]}),  # no count
    ("pool", (0, 0, 1, 1, 0, 0, 1, 1), None, "constant", {"ceil_mode": 1}),
])
def test_fold_pad_leaves_what_its_reader_cannot_say(reader, pads, value, mode, attrs) -> None:
    _, before = _padded(reader, pads, value, mode, **attrs)
    assert fold_pad(before) is before


_BIAS_CASES = {  # name → (nodes, inputs, output shape, initializers): TensorFlow's BiasAdd forms
    "MatMul + Add": ([helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),
                      helper.make_node("Add", ["m", "bias"], ["y"], name="fc/BiasAdd")],
                     [1, 8], [1, 2], {"w": (8, 2), "bias": (2,)}),
    "Conv + Add": ([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                    helper.make_node("Add", ["bias", "c"], ["y"], name="conv/BiasAdd")],
                   [1, 3, 8, 8], [1, 4, 8, 8], {"w": (4, 3, 3, 3), "bias": (1, 4, 1, 1)}),
    "Gemm + Sub": ([helper.make_node("Gemm", ["x", "w", "c0"], ["m"], name="fc", beta=0.5),
                    helper.make_node("Sub", ["m", "bias"], ["y"], name="sub")],
                   [2, 8], [2, 3], {"w": (8, 3), "c0": (3,), "bias": (3,)}),
}


@pytest.mark.parametrize("case", sorted(_BIAS_CASES))
def test_fold_bias_makes_a_constant_add_the_producers_bias(case: str) -> None:
    nodes, x_shape, y_shape, shapes = _BIAS_CASES[case]
    rng = np.random.default_rng(0)
    proto = model(nodes, {"x": x_shape}, {"y": y_shape},
                  {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()})
    after = fold_bias(fold_constants(import_model(proto)))
    (node,) = after.nodes
    assert node.name == nodes[0].name and node.outputs == ("y",) and len(node.inputs) == 3
    x = rng.standard_normal(x_shape).astype(np.float32)
    assert max_relative_error(evaluate(after, {"x": x})["y"],
                              ort.run(ort.session(proto), {"x": x})["y"]) <= 1e-5


def test_fold_bias_leaves_an_add_that_is_not_one_value_per_channel() -> None:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Add", ["c", "plane"], ["y"], name="add")]
    proto = model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]},
                  {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                   "plane": rng.standard_normal((1, 1, 8, 8)).astype(np.float32)})
    before = import_model(proto)
    assert fold_bias(before) is before


def test_fold_bias_makes_a_projection_of_tokens_a_gemm_of_its_rows() -> None:
    """Before: MatMul([1, 5, 8] by [8, 6]) and Add(bias [6], first, as torch exports it).
    Expected: Reshape to [5, 8], Gemm with the bias, Reshape to [1, 5, 6] named as the Add."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="proj"),
             helper.make_node("Add", ["b", "m"], ["y"], name="bias")]
    proto = model(nodes, {"x": [1, 5, 8]}, {"y": [1, 5, 6]},
                  {"w": rng.standard_normal((8, 6)).astype(np.float32),
                   "b": rng.standard_normal(6).astype(np.float32)})
    after = fold_bias(fold_constants(import_model(proto)))
    assert [n.op for n in after.nodes] == ["Reshape", "Gemm", "Reshape"]
    assert after.nodes[-1].outputs == ("y",) and after.type_of(after.nodes[1].outputs[0]).shape \
        == (5, 6)
    x = rng.standard_normal((1, 5, 8)).astype(np.float32)
    assert max_relative_error(evaluate(after, {"x": x})["y"],
                              ort.run(ort.session(proto), {"x": x})["y"]) <= 1e-5
