"""Per-channel affine maps that no producer absorbed become depthwise 1x1 convolutions.

A BatchNormalization that BN folding could not merge (it follows a MaxPool, say), and an Add,
Sub, Mul or Div of a feature map by a constant with one value per channel, are each
y = x * scale + offset along the channel axis (the operator table's `channel_affine` column).
As a Conv of kernel 1x1 with one group per channel (weight = scale, bias = offset), the
quantizer gives it per-channel weights and requantization and the array and the vector unit run
it, bit-exactly, with the machinery every convolution uses. The Conv keeps the node's name and
output, so profiles and per-layer reports still match it.

A scalar map stays as it is (the vector unit runs it as one table), except a Div, whose int8
form divides by an activation (a table of its reciprocal, then a product): by a constant it
becomes a Mul by the reciprocal, one exact rescale; so does a Div by a constant of any other
shape (a map over the pixels), whose reciprocal the quantizer quantizes as an int8 tensor.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph, Node, Value
from compiler.graph.ops import CONV, MUL, OPS
from compiler.passes.util import prune_values

FEATURE_MAP_RANK = 4  # N x C x H x W: what a 2-D depthwise convolution reads


def channel_affine(graph: Graph) -> Graph:
    """After this pass no BatchNormalization reads a float feature map, no Div a float value by
    a constant, and no Add, Sub or Mul a float feature map with a per-channel (non-scalar)
    constant operand."""
    nodes: list[Node] = []
    new_values: dict[str, Value] = {}
    for node in graph.nodes:
        mapped = _affine_of(graph, node)
        if mapped is None:
            reciprocal = _reciprocal_of(graph, node)
            if reciprocal is not None:
                x, scale = reciprocal
                name = f"{node.name}/scale"
                new_values[name] = _const(name, scale)
                node = Node(MUL.name, node.name, (x, name), node.outputs, {})
            nodes.append(node)
            continue
        x, scale, offset = mapped
        channels = graph.type_of(x).shape[1]
        scalar = scale.size == 1 and offset.size == 1
        if scalar and OPS[node.op].int8 is not None and OPS[node.op].quant is not Quant.DIVIDE:
            nodes.append(node)  # the vector unit's table does it
        elif scalar and not np.any(offset):
            name = f"{node.name}/scale"
            new_values[name] = _const(name, scale.reshape(()))
            nodes.append(Node(MUL.name, node.name, (x, name), node.outputs, {}))
        else:
            weight, bias = f"{node.name}/W_affine", f"{node.name}/B_affine"
            per_channel = [np.broadcast_to(v, (1, channels, 1, 1)).reshape(channels)
                           for v in (scale, offset)]
            new_values[weight] = _const(weight, per_channel[0].reshape(channels, 1, 1, 1))
            new_values[bias] = _const(bias, per_channel[1])
            nodes.append(Node(CONV.name, node.name, (x, weight, bias), node.outputs,
                              {"group": channels, "kernel_shape": [1, 1]}))
    if not new_values:
        return graph
    return prune_values(graph, nodes, new_values)


def _affine_of(graph: Graph, node: Node) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(x, scale, offset) when `node` is a per-channel affine map of one float feature map x
    (scale and offset in float64, broadcastable to 1 x C x 1 x 1), else None."""
    row = OPS[node.op]
    if row.channel_affine is None or len(node.outputs) != 1:
        return None
    consts = [graph.values[n].const if n and graph.values[n].is_const else None
              for n in node.inputs]
    run_time = [n for n, c in zip(node.inputs, consts) if n and c is None]
    if len(run_time) != 1 or node.inputs.index(run_time[0]) >= row.run_time_inputs:
        return None
    x = run_time[0]
    x_type = graph.type_of(x)
    if x_type.rank != FEATURE_MAP_RANK or x_type.dtype != "float32" or \
            graph.type_of(node.outputs[0]).shape != x_type.shape:
        return None
    mapped = row.channel_affine(row.bind(node.name, node.attrs), consts, x_type.rank)
    if mapped is None:
        return None
    scale, offset = (np.asarray(v, np.float64) for v in mapped)
    per_channel = (1, x_type.shape[1], 1, 1)
    try:
        if np.broadcast_shapes(scale.shape, offset.shape, per_channel) != per_channel:
            return None
    except ValueError:
        return None
    return x, scale, offset


def _reciprocal_of(graph: Graph, node: Node) -> tuple[str, np.ndarray] | None:
    """(x, 1 / k) when `node` divides a float value x by a constant k (of any shape), else
    None."""
    row = OPS[node.op]
    if row.quant is not Quant.DIVIDE or row.channel_affine is None or len(node.inputs) != 2:
        return None
    x, k = node.inputs
    if graph.values[x].is_const or not graph.values[k].is_const or \
            graph.type_of(x).dtype != "float32":
        return None
    scale, _ = row.channel_affine(row.bind(node.name, node.attrs), [None, graph.values[k].const],
                                  graph.type_of(x).rank)
    return x, scale


def _const(name: str, array: np.ndarray) -> Value:
    return Value.constant(name, np.asarray(array, np.float32))
