"""The verifier of quantized graphs: ir.verify's invariants, plus the quantized types.

Until the operator table holds the int8 columns, ir.verify rejects QuantizeLinear,
DequantizeLinear and Rescale and the integer attributes the quantizer adds; this check runs the
same shape rules with those attributes set aside and the new operators' rules from int8.NEW_OPS.
"""

from __future__ import annotations

from compiler.errors import CompileError
from compiler.graph.int8 import INT8_ATTRS, NEW_OPS, defaults
from compiler.graph.ir import Graph, Node, Type
from compiler.graph.ops import OPS, infer_from


def infer_int8(graph: Graph, node: Node) -> list[Type]:
    """The output types (dtype and shape) the shape rules give for a node of an int8 graph."""
    inputs = [graph.values[name] if name else None for name in node.inputs]
    if node.op in NEW_OPS:
        return NEW_OPS[node.op].shape(inputs, {**defaults(node.op), **node.attrs})
    if node.op not in OPS:
        raise CompileError(f"node {node.name!r}: unknown operator {node.op!r}")
    plain = node.with_(attrs={k: v for k, v in node.attrs.items() if k not in INT8_ATTRS})
    return infer_from(plain, inputs) or [graph.values[name].type for name in node.outputs]


def verify_int8(graph: Graph) -> None:
    """Raise CompileError naming the first breach of an invariant of a quantized graph.

    Besides ir.verify's (defined before use, defined once, types equal the shape rules', node
    names unique), every integer activation carries QuantParams, and
    the graph's inputs and outputs are float.
    """
    defined = set(graph.inputs) | {n for n, v in graph.values.items() if v.is_const}
    for name in list(graph.inputs) + list(graph.outputs):
        if name not in graph.values or graph.values[name].type.dtype != "float32":
            raise CompileError(f"graph {graph.name!r}: interface value {name!r} is not float32")
    for node in graph.nodes:
        for name in node.inputs:
            if name and name not in defined:
                raise CompileError(f"node {node.name!r} ({node.op}) reads {name!r} before it is "
                                   "defined")
        for name in node.outputs:
            if name in defined:
                raise CompileError(f"value {name!r} is defined twice (again by {node.name!r})")
            if name not in graph.values:
                raise CompileError(f"node {node.name!r} output {name!r} has no type")
            defined.add(name)
        for name, want in zip(node.outputs, infer_int8(graph, node)):
            got = graph.values[name].type
            if (got.dtype, got.shape) != (want.dtype, want.shape):
                raise CompileError(f"node {node.name!r} ({node.op}) output {name!r} is typed "
                                   f"{got} but its shape rule gives {want}")
    for name, value in graph.values.items():
        if value.type.dtype in ("int8", "uint8") and value.type.quant is None and \
                not value.is_const:
            raise CompileError(f"value {name!r} is {value.type.dtype} without a scale and zero "
                               "point")
    for name in graph.outputs:
        if name not in defined:
            raise CompileError(f"graph output {name!r} is never defined")
    names = [node.name for node in graph.nodes]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise CompileError(f"node name {dup!r} is used twice")
