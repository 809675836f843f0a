"""Tiny ONNX models and calibration files, built in each test's temporary folder."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def conv_model(batch: int | str = 1, seed: int = 0) -> onnx.ModelProto:
    """x[batch,2,4,4] -> Conv -> Relu -> Flatten -> Gemm -> y[batch,3]; also zero = r - r."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w", (3, 2, 3, 3)), ("b", (3,)), ("fc", (3, 12)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[0, 0, 0, 0]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("Flatten", ["relu"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc"], ["y"], transB=1),
             helper.make_node("Sub", ["relu", "relu"], ["zero"])]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3]),
         helper.make_tensor_value_info("zero", TensorProto.FLOAT, [batch, 3, 2, 2])],
        weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def samples(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 2, 4, 4)).astype(np.float32)


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(conv_model(), str(path))
    return path


@pytest.fixture
def calib_path(tmp_path):
    path = tmp_path / "calib.npz"
    np.savez(path, x=samples(40), labels=np.arange(40))
    return path
