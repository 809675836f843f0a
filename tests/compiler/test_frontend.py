"""The ONNX importer: names kept, constants, shapes fixed, and a clear error for bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from compiler.errors import CompileError
from compiler.frontend.onnx import (MAX_OPSET, MIN_CONVERTED_OPSET, MIN_OPSET, import_model,
                                    parse_input_shapes)
from compiler.graph.evaluate import evaluate
from compiler.graph.ir import verify
from compiler.pipeline import optimize
from ember import ort
from ember.compare import max_relative_error
from tests.onnx_builder import conv_bn_relu, model, weights


def _relu(opset: int = 17, shape=(1, 4)) -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"], name="r")], {"x": list(shape)},
                 {"y": list(shape)}, opset=opset)


def test_import_keeps_onnx_names_and_makes_initializers_constants() -> None:
    graph = import_model(conv_bn_relu())
    verify(graph)
    assert [n.name for n in graph.nodes] == ["conv", "bn", "relu"]
    assert graph.inputs == ("x",) and graph.outputs == ("y",)
    assert graph["w"].is_const and graph["w"].type.shape == (4, 3, 3, 3)
    assert str(graph.type_of("n")) == "float32[1x4x8x8]"


def test_dynamic_dimension_is_fixed_by_input_shape() -> None:
    graph = import_model(_relu(shape=("N", 4)), {"x": (3, 4)})
    assert graph.type_of("y").shape == (3, 4)


def test_dynamic_dimension_without_input_shape_names_the_input() -> None:
    with pytest.raises(CompileError, match=r"input 'x' has dynamic shape \[N,4\].*--input-shape"):
        import_model(_relu(shape=("N", 4)))


def test_input_shape_for_an_unknown_input_lists_the_inputs() -> None:
    with pytest.raises(CompileError, match=r"names 'z', but the model's inputs are \['x'\]"):
        import_model(_relu(), {"z": (1, 4)})


def test_input_shape_of_the_wrong_rank() -> None:
    with pytest.raises(CompileError, match="rank 3 given, but the input has rank 2"):
        import_model(_relu(shape=("N", 4)), {"x": (1, 4, 1)})


@pytest.mark.parametrize("spec", ["x", "x=", "x=1,a", "=1,2", "x=0,3"])
def test_malformed_input_shape_spec(spec: str) -> None:
    with pytest.raises(CompileError, match="expected NAME=D0,D1"):
        parse_input_shapes([spec])


def test_unsupported_operator_names_node_op_and_supported_set() -> None:
    proto = model([helper.make_node("Hardmax", ["x"], ["y"], name="hardmax1")], {"x": [2]},
                  {"y": [2]})
    with pytest.raises(CompileError) as info:
        import_model(proto)
    message = str(info.value)
    assert "node 'hardmax1'" in message and "Hardmax" in message and "Conv" in message
    assert "\n" not in message


def test_an_opset_too_new_for_the_installed_onnx_says_so() -> None:
    proto = _relu()
    proto.opset_import[0].version = MAX_OPSET + 1
    with pytest.raises(CompileError, match=f"opset {MAX_OPSET + 1} is newer than the installed "
                                           f"onnx {onnx.__version__} knows"):
        import_model(proto)


def test_an_opset_older_than_the_converter_takes_is_refused() -> None:
    proto = _relu()
    proto.opset_import[0].version = MIN_CONVERTED_OPSET - 1
    with pytest.raises(CompileError, match=f"opset {MIN_CONVERTED_OPSET - 1} is too old"):
        import_model(proto)


def opset9_model(accelerated_only: bool = False) -> onnx.ModelProto:
    """A tf2onnx-era model at opset 9: BatchNormalization, Upsample (gone since opset 10),
    Dropout, Reshape, Gemm and a 2-D-coerced Softmax, each in its old form; `accelerated_only`
    leaves out Upsample (the Softmax runs on the accelerator)."""
    rng = np.random.default_rng(0)
    channels = 4
    inits = {"w": weights(rng, channels, 3, 3, 3),
             "gamma": rng.uniform(0.5, 1.5, channels).astype(np.float32),
             "beta": weights(rng, channels), "mean": weights(rng, channels),
             "var": rng.uniform(0.5, 2, channels).astype(np.float32),
             "scales": np.array([1, 1, 2, 2], np.float32),
             "fc": weights(rng, channels * 4 * 4, 5), "fcb": weights(rng, 5),
             "shape": np.array([1, -1], np.int64)}
    up = [helper.make_node("Upsample", ["r", "scales"], ["u"], mode="nearest", name="up"),
          helper.make_node("MaxPool", ["u"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                           name="pool")]
    if accelerated_only:
        up = [helper.make_node("Dropout", ["r"], ["p"], name="drop0")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2],
                         name="conv"),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"],
                         name="bn"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        *up,
        helper.make_node("Dropout", ["p"], ["d"], name="drop"),
        helper.make_node("Reshape", ["d", "shape"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["g"], name="fc"),
        helper.make_node("Softmax", ["g"], ["y"], name="softmax")]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 5]}, inits, opset=9)


def test_an_opset_9_model_is_converted_and_equals_onnxruntime() -> None:
    proto = opset9_model()
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected = ort.run(ort.session(proto), {"x": x})["y"]
    graph = import_model(proto)
    assert graph.opset == MIN_OPSET and "Resize" in graph.op_counts()
    assert {node.name for node in graph.nodes} >= {"conv", "bn", "up", "softmax"}
    assert "u" in graph.values  # the profile and the per-layer report know it by this name
    for candidate in (graph, optimize(graph)):
        assert max_relative_error(evaluate(candidate, {"x": x})["y"], expected) <= 1e-5


def test_legacy_softmax_axis_is_read_from_embers_types_not_value_info() -> None:
    """Opset-11 Softmax on axis 1 of a [1, 2] value whose shape ONNX's inference loses (a
    Reshape to a computed shape): ember's own types tell that axis 1 is the last."""
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], name="fc"),
             helper.make_node("Shape", ["g"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["sf"], to=onnx.TensorProto.FLOAT, name="to_float"),
             helper.make_node("Cast", ["sf"], ["si"], to=onnx.TensorProto.INT64, name="to_int"),
             helper.make_node("Reshape", ["g", "si"], ["r"], name="reshape"),
             helper.make_node("Softmax", ["r"], ["y"], axis=1, name="softmax")]
    proto = model(nodes, {"x": [1, 3]}, {"y": [1, 2]},
                  {"w": weights(np.random.default_rng(0), 3, 2)}, opset=11)
    inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    assert not any(v.type.tensor_type.shape.dim for v in inferred.graph.value_info
                   if v.name == "r")  # the case: ONNX's inference has no shape for it
    softmax = import_model(proto).nodes[-1]
    assert softmax.attrs["axis"] == -1
    x = np.ones((1, 3), np.float32)
    assert max_relative_error(evaluate(import_model(proto), {"x": x})["y"],
                              ort.run(ort.session(proto), {"x": x})["y"]) <= 1e-6


def test_weights_in_constant_nodes_become_constants() -> None:
    """PicoDet-style exports hold weights in Constant nodes: after the passes they are the
    convolution's constant operands, as initializers would be."""
    rng = np.random.default_rng(0)
    w = weights(rng, 4, 3, 3, 3)
    nodes = [helper.make_node("Constant", [], ["w"], name="w_const",
                              value=numpy_helper.from_array(w, "w")),
             helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    graph = optimize(import_model(model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]})))
    assert graph.op_counts() == {"Conv": 1}
    np.testing.assert_array_equal(graph.values[graph.nodes[0].inputs[1]].const, w)


@pytest.mark.parametrize("opset", [11, 13, 17, MAX_OPSET])
def test_supported_opsets_import(opset: int) -> None:
    proto = _relu(opset)
    proto.ir_version = onnx.IR_VERSION
    assert import_model(proto).nodes[0].op == "Relu"


def test_missing_initializer_is_named() -> None:
    proto = model([helper.make_node("Add", ["x", "bias"], ["y"], name="add")], {"x": [2]},
                  {"y": [2]})
    with pytest.raises(CompileError, match="bias"):
        import_model(proto)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(CompileError, match="no such file"):
        import_model(tmp_path / "absent.onnx")


def test_not_onnx_and_truncated_files(tmp_path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"this is not a protobuf \xff\xfe" * 10)
    with pytest.raises(CompileError, match="garbage.onnx: not a valid ONNX model"):
        import_model(garbage)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(conv_bn_relu().SerializeToString()[:200])
    with pytest.raises(CompileError, match="truncated.onnx"):
        import_model(truncated)


def test_legacy_attribute_forms_become_inputs() -> None:
    proto = model([helper.make_node("Squeeze", ["x"], ["y"], name="sq", axes=[0])],
                  {"x": [1, 3]}, {"y": [3]}, opset=11)
    graph = import_model(proto)
    node = graph.nodes[0]
    assert node.inputs == ("x", "sq/axes") and "axes" not in node.attrs
    np.testing.assert_array_equal(graph["sq/axes"].const, [0])


def test_a_prequantized_model_is_rejected_as_such() -> None:
    proto = model([helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="q")],
                  {"x": [2]}, {"y": [2]}, {"s": np.array(0.1, np.float32)})
    proto.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.UINT8
    with pytest.raises(CompileError, match="node 'q' has unsupported operator QuantizeLinear"):
        import_model(proto)
