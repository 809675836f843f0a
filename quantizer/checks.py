"""Checks before quantizing: unknown keep_fp32 names, unquantizable nodes, non-finite weights.

Each error names the node or tensor; nothing that cannot be quantized is left in float silently.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph, Node, Type
from compiler.graph.ops import OPS
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from simulator.errors import listing


def check_quantizable(graph: Graph, options: QuantOptions) -> None:
    """Reject unknown keep_fp32 names, unquantizable nodes and non-finite weights, naming them."""
    names = [node.name for node in graph.nodes]
    unknown = [n for n in options.keep_fp32 if n not in names]
    if unknown:
        raise QuantizeError(f"--keep-fp32 {listing(unknown)}: no such node in graph "
                            f"{graph.name!r} after the fp32 passes; its nodes: "
                            f"{listing(names)}")
    integers = [f"{name!r} ({graph.type_of(name).dtype})" for name in graph.outputs
                if not is_float(graph.type_of(name))]
    if integers:
        raise QuantizeError(f"graph {graph.name!r}: output {listing(integers)} is not a float "
                            f"value: ember's programs write float outputs (an exporter's copy "
                            f"of an integer input is no output to compute; remove it from the "
                            f"model's outputs, e.g. with onnx.utils.Extractor)")
    keep = set(options.keep_fp32)
    problems = [f"node {node.name!r} ({node.op}): {reason}" for node in graph.nodes
                if node.name not in keep and (reason := unquantizable(graph, node))]
    if problems:
        raise QuantizeError(f"cannot quantize {listing(problems, limit=3, sep='; ')}"
                            f"; keep such nodes in fp32 with --keep-fp32 NODE")
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


def unquantizable_nodes(graph: Graph, options: QuantOptions) -> tuple[str, ...]:
    """The nodes not kept in fp32 that have no int8 form: with them kept in fp32 as well, the
    graph quantizes (the backend's host segments run them)."""
    keep = set(options.keep_fp32)
    return tuple(node.name for node in graph.nodes
                 if node.name not in keep and unquantizable(graph, node))


def is_float(t: Type) -> bool:
    return np.dtype(t.dtype).kind == "f"


def integer_node(graph: Graph, node: Node) -> bool:
    """Whether `node` of an fp32 graph computes integers from integers only (a Reshape of
    token ids, a comparison of byte values): exact as it is, so nothing of it is quantized."""
    run_time = [name for name in node.inputs if name and not graph.values[name].is_const]
    return bool(run_time) and not any(is_float(graph.type_of(name))
                                      for name in run_time + [n for n in node.outputs if n])


def unquantizable(graph: Graph, node: Node) -> str | None:
    """Why `node` has no int8 form, or None when it has one (an integer node needs none)."""
    if integer_node(graph, node):
        return None
    row = OPS[node.op]
    if row.quant is Quant.CAST:
        x = node.inputs[0]
        if x in graph.inputs and not is_float(graph.type_of(x)) and \
                graph.type_of(node.outputs[0]).dtype == "float32":
            return None
        return (f"casts {x!r} ({graph.type_of(x).dtype}) to "
                f"{graph.type_of(node.outputs[0]).dtype}: only a model input's integers cast "
                f"to float have an int8 form (the input's quantization)")
    if row.int8 is None or row.quant in (Quant.QUANTIZE, Quant.DEQUANTIZE):
        hint = (" (the graph passes remove it after a Conv or Gemm, or on a feature map)"
                if row.folds_into_producer else "")
        return f"has no int8 implementation{hint}"
    const = [bool(n) and graph.values[n].is_const for n in node.inputs]
    indices = [bool(n) and i in row.index_inputs for i, n in enumerate(node.inputs)]
    for name, is_index in zip(node.inputs, indices):
        if is_index and is_float(graph.type_of(name)):
            return f"its indices {name!r} are {graph.type_of(name).dtype}, not integers"
    data = [n for n, c, i in zip(node.inputs, const, indices) if n and not c and not i]
    for name in data[:1] if row.quant is not Quant.RESCALE_INPUTS else data:
        if graph.type_of(name).dtype != "float32":
            return f"input {name!r} is {graph.type_of(name).dtype}, not float32"
    operands = row.run_time_inputs
    if operands == 2 and all(const[:2]):
        return "both operands are constants (constant folding removes it)"
    for name, slot, is_const, is_index in zip(node.inputs[operands:], row.inputs[operands:],
                                              const[operands:], indices[operands:]):
        if name and not is_const and not is_index:
            return (f"its {slot.rstrip('?')} input {name!r} is computed at run time, not a "
                    "constant (only a constant one, or one that constant folding computes, "
                    "has an int8 form)")
    return None
