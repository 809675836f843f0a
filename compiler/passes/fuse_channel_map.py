"""A table op between two per-channel scales, fused into one table per channel.

Cross-layer equalization through an activation f that is not homogeneous (HardSwish, SiLU,
GELU: `quantizer.equalize`, mode "all") divides the first Conv's output channel c by s_c and
writes f as Mul(x, s) → f → Mul(·, 1/s): the same function, in ONNX that onnxruntime profiles.
Quantized as written, the two Muls would undo the equalization (their inputs and outputs are
the unequalized values, rounded to 8 bits per tensor). As one node, x → post_c * f(pre_c * x),
the quantizer builds a 256-entry table per channel from the fp32 function with that channel's
scales (PRelu's machinery: `int8.channel_lookup_int8`, a LUT with a table per lane), and only
the equalized values are ever rounded. The fused node takes the second Mul's name and output,
so profiles and per-layer reports still match it.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.int8 import Quant, channel_slopes
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import CHANNEL_MAP, MUL, OPS
from compiler.passes.util import prune_values, single_user


def fuse_channel_map(graph: Graph) -> Graph:
    """After this pass no one-input table op reads a Mul of a float value by per-channel
    constants and is read, alone, by another such Mul."""
    producers = graph.producers()
    users = graph.users()
    fused: dict[str, Node] = {}
    dropped: set[str] = set()
    for node in graph.nodes:
        if OPS[node.op].quant is not Quant.LOOKUP or len(node.inputs) != 1 or \
                len(node.outputs) != 1 or node.name in dropped:
            continue
        before = producers.get(node.inputs[0])
        readers = users.get(node.outputs[0], [])
        if before is None or len(readers) != 1 or not single_user(graph, node.inputs[0]) or \
                not single_user(graph, node.outputs[0]):
            continue
        after = readers[0]
        first, second = _channel_scale(graph, before), _channel_scale(graph, after)
        if first is None or second is None or second[0] != node.outputs[0] or \
                before.name in dropped or after.name in dropped:
            continue
        (x, pre), (_, post) = first, second
        fused[after.name] = Node(CHANNEL_MAP.name, after.name, (x, pre, post), after.outputs,
                                 {"map": node.op, "map_attrs": dict(node.attrs)})
        dropped.update((before.name, node.name))
    if not fused:
        return graph
    nodes = [fused.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    return prune_values(graph, nodes)


def _channel_scale(graph: Graph, node: Node) -> tuple[str, str] | None:
    """(x, scale) of a Mul of a float feature map x by a constant with one value per channel
    (axis 1, more than one channel), else None."""
    if node.op != MUL.name or len(node.inputs) != 2:
        return None
    consts = [n for n in node.inputs if graph.values[n].is_const]
    if len(consts) != 1:
        return None
    scale = consts[0]
    x = node.inputs[1] if node.inputs[0] == scale else node.inputs[0]
    shape = graph.type_of(x).shape
    if graph.type_of(x).dtype != "float32" or graph.type_of(node.outputs[0]).shape != shape:
        return None
    slopes = channel_slopes(graph.values[scale].const, shape)
    if slopes is None or len(slopes) < 2 or not np.all(np.isfinite(slopes)):
        return None
    return x, scale
