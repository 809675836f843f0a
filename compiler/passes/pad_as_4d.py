"""A Pad of a rank-2 or rank-3 value (an audio signal framed for an STFT, a sequence) becomes a
Pad of a one-channel map: Reshape [A, B] → [1, 1, A, B] or [A, B, L] → [A, 1, B, L], Pad of H
and W, Reshape back. A one-channel map's channels-last bytes are the row-major bytes of the
value, so both Reshapes are views, and the accelerator pads H and W in every mode.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Type, Value
from compiler.graph.ops import PAD, RESHAPE
from compiler.passes.util import prune_values


def pad_as_4d(graph: Graph) -> Graph:
    """After this pass no Pad with constant pads of a rank-2 or rank-3 value pads an axis the
    lifted map's H and W do not hold."""
    nodes, new_values, origin = [], {}, {}
    for node in graph.nodes:
        lifted = _lifted(graph, node) if node.op == PAD.name else None
        if lifted is None:
            nodes.append(node)
            continue
        shape4, pads4 = lifted
        x, y = graph.values[node.inputs[0]], graph.values[node.outputs[0]]
        out4 = tuple(s + b + e for s, b, e in zip(shape4, pads4[:4], pads4[4:]))

        def value(name: str, shape: tuple[int, ...], const=None, dtype=None) -> str:
            new_values[name] = Value(name, Type(dtype or x.type.dtype, shape), const)
            return name

        def ints(name: str, values) -> str:
            array = np.array(values, np.int64)
            return value(name, array.shape, array, "int64")

        x4 = value(f"{node.name}/x_4d", shape4)
        y4 = value(f"{node.name}/y_4d", out4)
        origin.update({x4: graph.origin.get(x.name, x.name),
                       y4: graph.origin.get(y.name, y.name)})
        fill = node.inputs[2:3] if len(node.inputs) > 2 else ()
        nodes.append(node.with_(op=RESHAPE.name, name=f"{node.name}/to_4d",
                                inputs=(x.name, ints(f"{node.name}/x_shape", shape4)),
                                outputs=(x4,), attrs={}))
        nodes.append(node.with_(inputs=(x4, ints(f"{node.name}/pads_4d", pads4), *fill),
                                outputs=(y4,)))
        nodes.append(node.with_(op=RESHAPE.name, name=f"{node.name}/back",
                                inputs=(y4, ints(f"{node.name}/y_shape", y.type.shape)),
                                outputs=(y.name,), attrs={}))
    if not new_values:
        return graph
    return prune_values(graph, nodes, new_values, origin)


def _lifted(graph: Graph, node) -> tuple[tuple[int, ...], list[int]] | None:
    """The one-channel map's shape and its 4-D pads, or None when the Pad is not of rank 2 or 3
    with constant pads on the axes that become H and W only."""
    x = graph.values[node.inputs[0]]
    rank = x.type.rank
    pads = graph.values[node.inputs[1]].const if len(node.inputs) > 1 else None
    axes_input = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
    axes = graph.values[axes_input].const if axes_input else None
    if rank not in (2, 3) or pads is None or (axes_input and axes is None):
        return None
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = int(pads[k]), int(pads[k + len(axes)])
    shape = x.type.shape
    if rank == 2:
        return (1, 1, *shape), [0, 0, *begin, 0, 0, *end]
    if begin[0] or end[0]:
        return None
    return (shape[0], 1, *shape[1:]), [0, 0, *begin[1:], 0, 0, *end[1:]]
