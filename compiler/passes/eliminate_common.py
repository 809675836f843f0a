"""Common-subexpression elimination."""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node
from compiler.passes.util import prune_values, rename_uses


def _attr_key(value):
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, dict):  # a fused node's inner attributes (ChannelMap's map_attrs)
        return ("dict", tuple(sorted((k, _attr_key(v)) for k, v in value.items())))
    return value


def _key(node: Node):
    return (node.op, node.inputs, len(node.outputs),
            tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())))


def eliminate_common(graph: Graph) -> Graph:
    """After this pass no two nodes apply the same operator to the same inputs and attributes.

    The first of equal nodes stays; readers of a later one read the first's outputs. A node
    whose output is a graph output stays as it is (the output name is part of the model).
    """
    seen: dict[tuple, Node] = {}
    mapping: dict[str, str] = {}
    kept = []
    for node in graph.nodes:
        node = rename_uses([node], mapping)[0]
        key = _key(node)
        first = seen.get(key)
        if first is not None and not any(o in graph.outputs for o in node.outputs):
            mapping.update(zip(node.outputs, first.outputs))
            continue
        seen.setdefault(key, node)
        kept.append(node)
    if not mapping:
        return graph
    return prune_values(graph, kept)
