"""Checks before quantizing: unknown keep_fp32 names, unquantizable nodes, non-finite weights.

Each error names the node or tensor; nothing that cannot be quantized is left in float silently.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions


def check_quantizable(graph: Graph, options: QuantOptions) -> None:
    """Reject unknown keep_fp32 names, unquantizable nodes and non-finite weights, naming them."""
    names = {node.name for node in graph.nodes}
    unknown = [n for n in options.keep_fp32 if n not in names]
    if unknown:
        raise QuantizeError(f"keep_fp32 names node(s) {unknown} that the graph "
                            f"{graph.name!r} does not have")
    keep = set(options.keep_fp32)
    problems = [f"node {node.name!r} ({node.op}): {reason}" for node in graph.nodes
                if node.name not in keep and (reason := _unquantizable(graph, node))]
    if problems:
        raise QuantizeError("cannot quantize " + "; ".join(problems) + " (keep such nodes in "
                            "fp32 with keep_fp32, or run compiler.pipeline.optimize first)")
    for node in graph.nodes:
        if node.name in keep:
            continue
        for name in node.inputs:
            value = graph.values.get(name) if name else None
            if value is not None and value.is_const and value.const.dtype.kind == "f" \
                    and not np.all(np.isfinite(value.const)):
                bad = int(np.size(value.const) - np.count_nonzero(np.isfinite(value.const)))
                raise QuantizeError(f"weight {name!r} (read by node {node.name!r}, {node.op}) "
                                    f"holds {bad} NaN or Inf value(s); it cannot be quantized")


def _unquantizable(graph: Graph, node: Node) -> str | None:
    """Why `node` has no int8 form, or None when it has one."""
    if OPS[node.op].int8 is None or OPS[node.op].quant in (Quant.QUANTIZE, Quant.DEQUANTIZE):
        hint = " (BN folding removes it)" if node.op == "BatchNormalization" else ""
        return f"has no int8 implementation{hint}"
    const = [bool(n) and graph.values[n].is_const for n in node.inputs]
    data = [n for n, c in zip(node.inputs, const) if n and not c]
    for name in data[:1] if OPS[node.op].quant is not Quant.RESCALE_INPUTS else data:
        if graph.type_of(name).dtype != "float32":
            return f"input {name!r} is {graph.type_of(name).dtype}, not float32"
    if node.op == "Conv" and not const[1]:
        return f"weight {node.inputs[1]!r} is not a constant"
    if node.op in ("Gemm", "MatMul") and all(const[:2]):
        return "both operands are constants (constant folding removes it)"
    if node.op == "Gemm" and len(node.inputs) > 2 and node.inputs[2] and not const[2]:
        return f"bias {node.inputs[2]!r} is not a constant"
    if node.op == "Clip" and not all(const[1:]):
        return "min/max are not constants"
    if node.op in ("Add", "Sub", "Mul") and all(const):
        return "both operands are constants (constant folding removes it)"
    if node.op == "Resize" and node.attrs.get("mode", "nearest") != "nearest":
        return f"Resize mode {node.attrs['mode']!r}: only 'nearest' keeps the scale"
    if node.op == "Pad" and len(node.inputs) > 2 and node.inputs[2] and not const[2]:
        return "its constant_value is not a constant"
    if node.op not in ("Concat", "Add", "Sub", "Mul", "Gemm", "MatMul") and any(
            not c for n, c in zip(node.inputs[1:], const[1:]) if n):
        return "a parameter input is computed at run time, not a constant"
    return None
