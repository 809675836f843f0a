"""A model's fingerprint: separate digests of its graph, its input shapes and its weights.

Three digests instead of one let a mismatch say what differs: another or an edited graph, the
same graph exported with another batch size, or the same graph with retrained weights.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import onnx
from onnx import numpy_helper

Dim = int | str | None


@dataclass(frozen=True)
class ModelFingerprint:
    graph: str
    inputs: str
    weights: str
    input_shapes: dict[str, list[Dim]]

    @property
    def digest(self) -> str:
        return _sha256(self.graph + self.inputs + self.weights)


def fingerprint(model: onnx.ModelProto) -> ModelFingerprint:
    graph = model.graph
    weights = hashlib.sha256()
    for init in sorted(graph.initializer, key=lambda t: t.name):
        _hash_tensor(weights, init)
    structure = {
        "opsets": sorted((o.domain, o.version) for o in model.opset_import),
        "initializers": sorted((t.name, t.data_type, list(t.dims)) for t in graph.initializer),
        "outputs": [o.name for o in graph.output],
        "nodes": [_node(node, weights) for node in graph.node],
    }
    shapes = {vi.name: _dims(vi) for vi in graph_inputs(model)}
    elem_types = {vi.name: vi.type.tensor_type.elem_type for vi in graph_inputs(model)}
    return ModelFingerprint(graph=_sha256(json.dumps(structure, sort_keys=True, default=str)),
                            inputs=_sha256(json.dumps([shapes, elem_types], sort_keys=True)),
                            weights=weights.hexdigest(), input_shapes=shapes)


def difference(profiled: ModelFingerprint, model: ModelFingerprint) -> str | None:
    """What differs, in words, or None when the fingerprints match."""
    if profiled.graph != model.graph:
        return "different graph (another model, or this one edited after profiling)"
    if profiled.inputs != model.inputs:
        return (f"different input shapes or batch size: profiled {_shapes(profiled)}, "
                f"model has {_shapes(model)}")
    if profiled.weights != model.weights:
        return "different weights (same graph, other values: retrained or edited weights)"
    return None


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs that take data: graph inputs that no initializer provides."""
    initialized = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in initialized]


def _node(node: onnx.NodeProto, weights) -> list:
    attrs = []
    for attr in sorted(node.attribute, key=lambda a: a.name):
        if attr.type == onnx.AttributeProto.TENSOR:
            _hash_tensor(weights, attr.t)
            value = "tensor"
        elif attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            value = _sha256(attr.SerializeToString(deterministic=True).hex())
        else:
            value = onnx.helper.get_attribute_value(attr)
            value = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        attrs.append((attr.name, value))
    return [node.domain, node.op_type, list(node.input), list(node.output), attrs]


def _hash_tensor(digest, tensor: onnx.TensorProto) -> None:
    array = numpy_helper.to_array(tensor)
    digest.update(f"{tensor.name}|{array.dtype}|{array.shape}|".encode())
    digest.update(array.tobytes())


def any_size(dim: onnx.TensorShapeProto.Dimension) -> bool:
    """Whether a declared size of -1 means "any" (paddle2onnx writes it so, and onnxruntime reads
    it so): the profiler treats it as the named dynamic dimension "?" everywhere."""
    return dim.HasField("dim_value") and dim.dim_value == -1


def _dims(vi: onnx.ValueInfoProto) -> list[Dim]:
    """Each dimension as recorded: its size, or its name when dynamic (-1 as "?", the name
    `run.load_model` gives it, so both spellings fingerprint alike)."""
    return ["?" if any_size(d) else d.dim_value if d.HasField("dim_value") else
            (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


def _shapes(fp: ModelFingerprint) -> str:
    return ", ".join(f"{name}{list(dims)}" for name, dims in fp.input_shapes.items())


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
