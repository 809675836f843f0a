"""A grouped ConvTranspose becomes one of one group, its weight block-diagonal (zero between
the groups), so that it is quantized per output channel.

Per-channel weight scales lie along one weight axis. A grouped ConvTranspose's weight
(C_in, C_out / group, kh, kw) has no axis with one entry per output channel (output channel
g * C_out / group + j is column j of group g's rows), so the quantizer could give it only one
scale: every channel of a depthwise upsampling at the scale of the largest, as poor as a
per-tensor depthwise Conv. With one group, axis 1 is the output channel. The zeros cost the
accelerator nothing: its lowering expands groups block-diagonally anyway, the array skips the
weight blocks that are all zero (`compiler.backend.tiling.active_blocks`), and the lowering
counts the MACs of the channel pairs that have weights.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Value
from compiler.graph.ops import CONV_TRANSPOSE
from compiler.passes.util import prune_values


def ungroup_conv_transpose(graph: Graph) -> Graph:
    """After this pass no ConvTranspose with a constant weight has more than one group."""
    nodes, new_values = [], {}
    for node in graph.nodes:
        group = int(node.attrs.get("group", 1))
        weight = graph.values[node.inputs[1]] if node.op == CONV_TRANSPOSE.name else None
        if weight is None or group == 1 or not weight.is_const:
            nodes.append(node)
            continue
        w = weight.const
        rows, columns = w.shape[0] // group, w.shape[1]
        dense = np.zeros((w.shape[0], columns * group) + w.shape[2:], w.dtype)
        for g in range(group):
            dense[g * rows:(g + 1) * rows, g * columns:(g + 1) * columns] = \
                w[g * rows:(g + 1) * rows]
        name = f"{node.name}/W_ungrouped"
        new_values[name] = Value.constant(name, dense)
        nodes.append(node.with_(inputs=(node.inputs[0], name, *node.inputs[2:]),
                                attrs={**node.attrs, "group": 1}))
    if not new_values:
        return graph
    return prune_values(graph, nodes, new_values)
