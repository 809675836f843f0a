"""What raising tensors and layers' weights above int8 costs in cycles, estimated from the
quantized graph alone (no compile): the accuracy budget (`ember.budget`) ranks, prunes and
reports the items it raises by this.

Each node is priced on the units the machine runs it on, and a node's time is the busiest of
them (the program double-buffers, so a layer's DMA overlaps its compute); the model's is the
sum over its nodes. On the int8 DB text detector the real program's layers, priced by their
measured busy time in the same way, sum to 0.88 of its cycles; the estimate is a guide to
what an item costs against another, and the compile's cycles remain the figure reported.

- The array (Conv, ConvTranspose, Gemm, MatMul by a constant or of two activations): one
  cycle per output pixel (row) for each tile of `rows` input channels by `cols` output
  channels and each tap (a grouped convolution packs as many groups into a tile as fit, the
  rest of it zeros), times its passes: two for an int16 input (two byte planes), two for int16
  weights (two parts) or an int16 second activation, four for both (`numerics.wide_passes`,
  `numerics.activation_passes`).
- The vector unit: one element per lane and pass, channels padded to the array's lanes; a
  pass more for each int16 operand's and output's second plane (requantization, ADD), the
  products of the planes for MUL, and a table's int16 input two more; a Softmax or
  LayerNorm three passes over its rows, two more for an int16 input and one for an int16
  output (`units.vector`).
- DMA: each activation read and written, two bytes an int16 element, and the weights, two
  bytes each when int16, at the port's bytes per cycle.
- A node kept in fp32 on the host: its FLOPs at the host's rate (`Arch.host_cycles`) and its
  tensors over DMA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from compiler.backend.partition import flops
from compiler.backend.tiling import ceil_div
from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, Lower
from quantizer.wide import activation_matmul, wide_group
from simulator.arch import Arch

_ARRAY = {Lower.CONV, Lower.CONV_TRANSPOSE, Lower.GEMM, Lower.MATMUL}
# Bindings, views and buffers the program shares: no work of their own.
_FREE = {Lower.VIEW, Lower.SLICE, Lower.SPLIT, Lower.CONCAT, Lower.QUANTIZE, Lower.DEQUANTIZE}


@dataclass(frozen=True)
class Wide:
    """What is raised, in the quantized graph's terms: values held in int16, nodes whose
    weights are int16, nodes kept in fp32 on the host."""

    values: frozenset[str] = frozenset()
    weights: frozenset[str] = frozenset()
    host: frozenset[str] = frozenset()

    def __or__(self, other: "Wide") -> "Wide":
        return Wide(self.values | other.values, self.weights | other.weights,
                    self.host | other.host)


class CycleModel:
    """The estimated cycles of a quantized graph on `arch`, with any further values and
    weights raised (`cycles`); built once per graph, priced per configuration in
    microseconds."""

    def __init__(self, graph: Graph, arch: Arch, fp32: Graph | None = None):
        """`graph` quantized; `fp32` the graph it was quantized from, whose int16 groups
        (`quantizer.wide.wide_group`: the values a Concat, view or copy joins) say which
        values raising one tensor raises with it."""
        self.graph, self.arch, self.fp32 = graph, arch, fp32
        self.nodes = [node for node in graph.nodes if OPS[node.op].lower not in _FREE]
        self._array = {node.name: self._array_cycles(node) for node in self.nodes
                       if OPS[node.op].lower in _ARRAY and (self._weight(node) is not None
                                                            or activation_matmul(graph, node))}
        self._host = {node.name: arch.host_cycles(flops(graph, node)) for node in self.nodes}
        users = graph.users()
        self._views: dict[str, set[str]] = {}
        for name in graph.values:  # each value and the views that keep its codes
            members, pending = {name}, [name]
            while pending:
                for node in users.get(pending.pop(), []):
                    if OPS[node.op].quant is Quant.KEEP_PARAMS:
                        new = set(node.outputs) - members
                        members |= new
                        pending += new
            self._views[name] = members

    def item(self, tensor: str, how: str, nodes: Iterable[str] = ()) -> Wide:
        """One raised item (`budget.Raised`'s fields) in the graph's terms: an ONNX tensor's
        values (those derived from it or from its int16 group, and their views) int16, a
        layer's weights int16, or nodes kept in fp32."""
        if how == "int16 weights":
            return Wide(weights=frozenset(nodes))
        if how == "fp32":
            return Wide(host=frozenset(nodes))
        origin = self.graph.origin
        names = {tensor}
        if self.fp32 is not None and tensor in self.fp32.values and \
                not self.fp32.values[tensor].is_const:
            names.update(wide_group(self.fp32, tensor))
        found = {name for name in self.graph.values if origin.get(name, name) in names
                 and not self.graph.values[name].is_const}
        return Wide(values=frozenset(v for name in found for v in self._views[name]))

    def cycles(self, wide: Wide = Wide()) -> int:
        """The graph's estimated cycles with `wide` raised besides what it holds."""
        return sum(self.node_cycles(node, wide) for node in self.nodes)

    def node_cycles(self, node: Node, wide: Wide) -> int:
        g, arch = self.graph, self.arch
        acts = [name for name in node.inputs if name and not g.values[name].is_const]
        outs = [name for name in node.outputs if name]

        def size(name: str) -> int:
            return self._bytes(name, name in wide.values)

        def planes(name: str) -> int:
            return 2 if name in wide.values or g.type_of(name).dtype == "int16" else 1

        moved = sum(size(name) for name in acts + outs)
        if node.name in wide.host or not any(g.type_of(name).quant is not None for name in outs):
            return self._host[node.name] + ceil_div(moved, arch.dma.bytes_per_cycle)
        lower = OPS[node.op].lower
        weight = self._weight(node)
        wide_weights = False
        if weight is not None and weight in g.values:
            wide_weights = node.name in wide.weights or g.type_of(weight).dtype == "int16"
            moved += g.type_of(weight).size * (2 if wide_weights else 1)
        dma = ceil_div(moved, arch.dma.bytes_per_cycle)
        out_rows = sum(self._elements(name) for name in outs)
        out_planes = max((planes(name) for name in outs), default=1)
        if node.name in self._array:
            # A pass per pair of planes: of the input and the weights' parts, or of the two
            # activations (`numerics.wide_passes`, `numerics.activation_passes`).
            second = planes(acts[1]) if weight is None else (2 if wide_weights else 1)
            passes = planes(acts[0]) * second
            vector = out_planes * out_rows
            return max(self._array[node.name] * passes, ceil_div(vector, arch.vector.lanes), dma)
        in_planes = [planes(name) for name in acts] or [1]
        if lower is Lower.MUL:
            passes = math.prod(in_planes) + out_planes - 1
        elif lower in (Lower.LUT, Lower.CHANNEL_LUT):
            passes = out_planes + 2 * (in_planes[0] - 1)
        elif lower in (Lower.SOFTMAX, Lower.LAYER_NORM):  # three passes over each row
            passes = 3 + 2 * (in_planes[0] - 1) + out_planes - 1
        else:  # ADD and the like: a pass more for each second plane
            passes = out_planes + sum(p - 1 for p in in_planes)
        rows = max([out_rows, *(self._elements(name) for name in acts)])
        return max(ceil_div(passes * rows, arch.vector.lanes), dma)

    def _weight(self, node: Node) -> str | None:
        """The constant weight an array node reads (its second input), or None."""
        if len(node.inputs) < 2 or not node.inputs[1]:
            return None
        value = self.graph.values.get(node.inputs[1])
        return node.inputs[1] if value is not None and value.is_const else None

    def _array_cycles(self, node: Node) -> int:
        """One pass of the node over the array: a cycle per output pixel (input pixel for a
        ConvTranspose) per tile of rows x cols channels per tap."""
        g, rows, cols = self.graph, self.arch.array.rows, self.arch.array.cols
        w = g.type_of(node.inputs[1]).shape
        x, y = g.type_of(node.inputs[0]).shape, g.type_of(node.outputs[0]).shape
        lower = OPS[node.op].lower
        if self._weight(node) is None:  # a MatMul of two activations: a GEMM per head
            k = x[-2] if node.attrs.get("transA") else x[-1]
            n = y[-1]
            return math.prod(y) // max(1, n) * ceil_div(k, rows) * ceil_div(n, cols)
        if lower in (Lower.GEMM, Lower.MATMUL):
            k, n = (w[1], w[0]) if node.attrs.get("transB") else (w[-2], w[-1])
            pixels = math.prod(x) // max(1, x[-1]) if lower is Lower.MATMUL else x[0]
            return pixels * ceil_div(k, rows) * ceil_div(n, cols)
        group = int(node.attrs.get("group", 1))
        if lower is Lower.CONV_TRANSPOSE:  # w: (Cin, Cout/group, taps...)
            cin_g, cout_g, pixels = w[0] // group, w[1], math.prod(x) // max(1, x[1])
        else:  # w: (Cout, Cin/group, taps...)
            cin_g, cout_g, pixels = w[1], w[0] // group, math.prod(y) // max(1, y[1])
        taps = math.prod(w[2:])
        packed = max(1, min(group, rows // max(1, cin_g), cols // max(1, cout_g)))
        tiles = ceil_div(group, packed) * ceil_div(cin_g * packed, rows) * \
            ceil_div(cout_g * packed, cols)
        return pixels * taps * tiles

    def _elements(self, name: str) -> int:
        """Elements of a value as local memory holds them: the channels (a 4-D map's second
        axis, else the last) padded to the array's lanes."""
        shape, lanes = self.graph.type_of(name).shape, self.arch.lanes
        if not shape:
            return lanes
        axis = 1 if len(shape) == 4 else len(shape) - 1
        return math.prod(shape) // max(1, shape[axis]) * ceil_div(shape[axis], lanes) * lanes

    def _bytes(self, name: str, raised: bool) -> int:
        t = self.graph.type_of(name)
        return self._elements(name) * (2 if raised and t.dtype in ("int8", "uint8")
                                       else np.dtype(t.dtype).itemsize)


def marginal(model: CycleModel, items: Mapping[object, Wide]) -> dict[object, int]:
    """Each item's estimated cost among the others: the cycles saved by dropping it alone
    (int16 inputs and weights of one layer cost more together than apart: four passes)."""
    everything = Wide()
    for wide in items.values():
        everything = everything | wide
    total = model.cycles(everything)
    costs = {}
    for key in items:
        rest = Wide()
        for other, wide in items.items():
            if other != key:
                rest = rest | wide
        costs[key] = total - model.cycles(rest)
    return costs
