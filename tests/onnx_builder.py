"""Small ONNX models for tests, built with onnx.helper in a few lines each."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def tensor(name: str, shape: Sequence[int | str] | None, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def weights(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    """Seeded normal weights of the given shape, float32."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def model(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, Sequence[int | str]],
          outputs: Mapping[str, Sequence[int | str]],
          initializers: Mapping[str, np.ndarray] = {}, opset: int = 17,
          name: str = "test") -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes), name, [tensor(n, s) for n, s in inputs.items()],
        [tensor(n, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = min(proto.ir_version, 8) if opset <= 17 else proto.ir_version
    return proto


def with_batch(proto: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """`proto` with its inputs' and outputs' batch axis set to `batch` (changed in place)."""
    for value in [*proto.graph.input, *proto.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = batch
    return proto


def conv_bn_relu(channels: int = 4, seed: int = 0) -> onnx.ModelProto:
    """x[1,3,8,8] → Conv → BatchNormalization → Relu → y: the pattern BN folding removes."""
    rng = np.random.default_rng(seed)
    inits = {
        "w": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32),
        "b": rng.standard_normal(channels).astype(np.float32),
        "gamma": rng.uniform(0.5, 1.5, channels).astype(np.float32),
        "beta": rng.standard_normal(channels).astype(np.float32),
        "mean": rng.standard_normal(channels).astype(np.float32),
        "var": rng.uniform(0.5, 2.0, channels).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"],
                         name="bn"),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, channels, 8, 8]}, inits)
