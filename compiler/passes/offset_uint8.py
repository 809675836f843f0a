"""uint8 activations as int8 codes: the same real values, every code offset by -128.

The accelerator's local memories and its array hold int8, so a graph quantized with uint8
activations is compiled as the equivalent int8 graph, as TFLite's converter does for uint8
models: a uint8 code q of zero point z is the int8 code q - 128 of zero point z - 128, and
real = scale * (q - z) is unchanged. Every integer kernel depends on codes only through
q - z, the order of codes (max pooling, clamps) or a table indexed from the dtype's minimum, so
the rewritten graph computes exactly the original's codes minus 128 (the tests hold it to that
on random graphs). Two places see codes without their zero point and get a correction:

- Conv, and Gemm/MatMul with a constant weight, had the activation zero point folded into their
  int32 bias (bias - z * sum(w)), so the kernel sums raw codes: offsetting the codes by -128
  adds 128 * sum(w) to the bias (per output channel);
- uint8 constants (QuantizeLinear/DequantizeLinear zero points, lookup tables, Pad values) are
  codes themselves and move by -128.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from compiler.graph.int8 import Quant, zero_point_fold
from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import OPS, int8_attrs, is_integer_node
from compiler.passes.util import prune_values
from simulator.program import IOBinding

OFFSET = 128
# Attributes holding the zero point of the activation input at this index, subtracted from
# the codes by the kernel (unless folded: then Conv's x_zero_point only pads).
_CENTRING = {"x_zero_point": 0, "a_zero_point": 0, "b_zero_point": 1}


def has_uint8(graph: Graph) -> bool:
    return any(v.type.dtype == "uint8" and not v.is_const for v in graph.values.values())


def _int8_type(t: Type) -> Type:
    quant = t.quant
    if quant is not None:
        quant = dataclasses.replace(quant, zero_point=tuple(z - OFFSET for z in quant.zero_point))
    return Type("int8", t.shape, quant)


def _fold_correction(node: Node, graph: Graph, was_uint8: set[str]) -> np.ndarray | None:
    """128 * sum(w) over the reduced axis: the `zero_point_fold` of the codes' -128 shift, in
    the int32 bias the quantizer folded the activation's zero point into, or None when
    nothing was folded."""
    weight = OPS[node.op].weight
    if weight is None or len(node.inputs) < 2:
        return None
    a, b = (graph.values[n] for n in node.inputs[:2])
    if node.attrs.get("a_zero_point", 0) or node.attrs.get("b_zero_point", 0):
        return None  # two activations: both zero points are subtracted, nothing folded
    activation = b if a.is_const else a
    if activation.name not in was_uint8:
        return None
    return zero_point_fold(weight, int8_attrs(node), a, b, zero=-OFFSET)


def unsigned_io(binding: IOBinding, graph: Graph) -> IOBinding:
    """A program input or output of `graph` (before the offset) typed as the graph types it:
    a uint8 value keeps its uint8 zero point, and the machine offsets its codes at its I/O."""
    kinds = {n.name: OPS[n.op].quant for n in graph.nodes}
    codes = [n.outputs[0] if kinds[n.name] is Quant.QUANTIZE else n.inputs[0]
             for n in graph.nodes
             if (kinds[n.name] is Quant.QUANTIZE and n.inputs[0] == binding.name)
             or (kinds[n.name] is Quant.DEQUANTIZE and n.outputs[0] == binding.name)]
    if not codes or graph.type_of(codes[0]).dtype != "uint8" or binding.dtype != "int8":
        return binding
    return dataclasses.replace(binding, dtype="uint8", zero_point=binding.zero_point + OFFSET)


def offset_uint8(graph: Graph) -> Graph:
    """The int8 graph computing `graph`'s uint8 codes minus 128 (`graph` when it has none)."""
    if not has_uint8(graph):
        return graph
    was_uint8 = {name for name, v in graph.values.items() if v.type.dtype == "uint8"}
    values: dict[str, Value] = {}
    for name, value in graph.values.items():
        if value.type.dtype != "uint8":
            values[name] = value
        elif value.is_const:
            codes = value.const.astype(np.int16) - OFFSET
            values[name] = Value(name, _int8_type(value.type), codes.astype(np.int8))
        else:
            values[name] = Value(name, _int8_type(value.type))
    nodes = []
    for node in graph.nodes:
        if not is_integer_node(graph, node):
            nodes.append(node)
            continue
        attrs = dict(node.attrs)
        inputs = list(node.inputs)
        weight = OPS[node.op].weight
        folded = weight is not None and any(graph.values[n].is_const for n in inputs[:2])
        for attr, index in _CENTRING.items():
            if attr in attrs and not folded and index < len(inputs) and inputs[index] in was_uint8:
                attrs[attr] = int(attrs[attr]) - OFFSET
        correction = _fold_correction(node, graph, was_uint8)
        if correction is not None:
            if weight.padded:
                attrs["x_zero_point"] = int(attrs.get("x_zero_point", 0)) - OFFSET
            bias_name = f"{node.name}/bias/offset_uint8"
            old = graph.values[inputs[2]].const if len(inputs) > 2 and inputs[2] else 0
            bias = (np.asarray(old, np.int64) + correction).astype(np.int32)
            values[bias_name] = Value(bias_name, Type("int32", bias.shape), bias)
            inputs = inputs[:2] + [bias_name] + inputs[3:]
        if any(out in was_uint8 for out in node.outputs):
            if "out_zero_point" in attrs:
                attrs["out_zero_point"] = int(attrs["out_zero_point"]) - OFFSET
            if attrs.get("qclamp") is not None:
                attrs["qclamp"] = tuple(int(q) - OFFSET for q in attrs["qclamp"])
            if attrs.get("out_dtype") == "uint8":
                attrs["out_dtype"] = "int8"
        nodes.append(node.with_(inputs=tuple(inputs), attrs=attrs))
    return prune_values(graph, nodes, extra=values)
