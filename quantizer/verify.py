"""The verifier of quantized graphs: ir.verify's invariants, plus the quantized types.

ir.verify checks what every graph keeps (defined before use, defined once, types equal to the
shape rules', unique node names); a quantized graph also keeps its interface in float and
gives every integer activation a scale and zero point.
"""

from __future__ import annotations

from compiler.errors import CompileError
from compiler.graph.ir import Graph, verify


def verify_int8(graph: Graph) -> None:
    """Raise CompileError naming the first breach of an invariant of a quantized graph.

    Besides ir.verify's, every integer activation carries QuantParams and the graph's
    outputs are float; its inputs are float or integers (token ids), never quantized codes.
    """
    verify(graph)
    for name in graph.inputs:
        if graph.values[name].type.dtype not in ("float32", "int32", "int64"):
            raise CompileError(f"graph {graph.name!r}: input {name!r} is "
                               f"{graph.values[name].type.dtype}, not float32 or integers")
    for name in graph.outputs:
        if graph.values[name].type.dtype != "float32":
            raise CompileError(f"graph {graph.name!r}: interface value {name!r} is not float32")
    for name, value in graph.values.items():
        if value.type.dtype in ("int8", "uint8") and value.type.quant is None and \
                not value.is_const:
            raise CompileError(f"value {name!r} is {value.type.dtype} without a scale and zero "
                               "point")
