"""The ONNX importer: names kept, constants, shapes fixed, and a clear error for bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.errors import CompileError
from compiler.frontend.onnx import MAX_OPSET, import_model, parse_input_shapes
from compiler.graph.ir import verify
from tests.onnx_builder import conv_bn_relu, model


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
    proto = model([helper.make_node("Erf", ["x"], ["y"], name="erf1")], {"x": [2]}, {"y": [2]})
    with pytest.raises(CompileError) as info:
        import_model(proto)
    message = str(info.value)
    assert "node 'erf1'" in message and "Erf" in message and "Conv" in message
    assert "\n" not in message


@pytest.mark.parametrize("opset", [10, MAX_OPSET + 1])
def test_opset_outside_the_supported_range(opset: int) -> None:
    proto = _relu()
    proto.opset_import[0].version = opset
    with pytest.raises(CompileError, match=f"opset {opset} is outside the supported range"):
        import_model(proto)


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
