"""Expand sunk past the nodes that broadcast by themselves.

Exporters expand a mask to the shape of the activations it multiplies (sentence-transformers'
mean pooling expands a [B, S, 1] mask to [B, S, hidden] before the Mul and the sums). That
copy is hidden times larger than the mask, and nothing needs it: an elementwise node of two or
more inputs broadcasts the unexpanded value to the same output; a single-input elementwise map
of the expanded value is the expansion of its map; a sum, mean, max or min over axes the Expand
did not widen is the expansion of the reduction of the unexpanded value. This pass rewrites each
such reader, so the Expand ends up read by nobody (`eliminate_dead` removes it) or only where
its shape matters. A sunk reader keeps its output name, through the Expand after it, so profiles
still match.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.int8 import reduce_axes
from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import EXPAND, OPS, broadcasts, elementwise_map, reduces
from compiler.passes.util import prune_values


def sink_expand(graph: Graph) -> Graph:
    """After this pass no Expand is read by an elementwise node that broadcasts its input to
    the same output, by a single-input map (run-time bounds aside), or by a reduction over
    axes it did not widen."""
    while True:
        found = _next_rewrite(graph)
        if found is None:
            return graph
        reader, new_nodes, new_values, origin = found
        nodes = [m for n in graph.nodes for m in (new_nodes if n is reader else (n,))]
        graph = prune_values(graph, nodes, new_values, origin)


def _next_rewrite(graph: Graph):
    """The first reader of an Expand that can read its input instead: (reader, the nodes that
    replace it, their new values, their origins), or None."""
    producers = graph.producers()
    for node in graph.nodes:
        expand = next((producers[n] for n in node.inputs
                       if n in producers and producers[n].op == EXPAND.name), None)
        if expand is None:
            continue
        wide, narrow = expand.outputs[0], expand.inputs[0]
        row = OPS[node.op]
        if broadcasts(row):
            inputs = tuple(narrow if n == wide else n for n in node.inputs)
            shapes = [graph.type_of(n).shape for n in inputs if n]
            if np.broadcast_shapes(*shapes) == graph.type_of(node.outputs[0]).shape:
                return node, (node.with_(inputs=inputs),), {}, {}
        elif elementwise_map(row) and node.inputs[0] == wide and \
                all(not n or graph.values[n].is_const for n in node.inputs[1:]):
            return _sunk(graph, node, expand, graph.type_of(narrow).shape)
        elif reduces(row) and node.inputs[0] == wide:
            shape = _reduced_shape(graph, node, graph.type_of(narrow).shape,
                                   graph.type_of(wide).shape)
            if shape is not None:
                return _sunk(graph, node, expand, shape)
    return None


def _reduced_shape(graph: Graph, node: Node, narrow: tuple, wide: tuple):
    """The reduction's output shape over the unexpanded value, when it reduces only axes the
    Expand kept (and the Expand added none); else None."""
    axes_input = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    if len(narrow) != len(wide) or (axes_input and not graph.values[axes_input].is_const):
        return None
    axes = reduce_axes(len(wide), graph.values[axes_input].const if axes_input else None,
                       node.attrs.get("noop_with_empty_axes", 0))
    if any(narrow[a] != wide[a] for a in axes):
        return None
    keep = node.attrs.get("keepdims", 1)
    return tuple(1 if a in axes else d for a, d in enumerate(narrow)
                 if keep or a not in axes)


def _sunk(graph: Graph, node: Node, expand: Node, shape: tuple):
    """`node` applied to the Expand's input (a value of `shape`), then expanded to the node's
    own output shape, under the node's output name."""
    out = node.outputs[0]
    early, target = f"{node.name}/narrow", f"{node.name}/narrow/shape"
    out_shape = graph.type_of(out).shape
    first = node.with_(name=early, inputs=(expand.inputs[0], *node.inputs[1:]), outputs=(early,))
    widen = Node(EXPAND.name, f"{node.name}/expand", (early, target), (out,))
    values = {early: Value(early, Type(graph.type_of(out).dtype, shape)),
              target: Value(target, Type("int64", (len(out_shape),)),
                            np.asarray(out_shape, np.int64))}
    return node, (first, widen), values, {early: graph.origin.get(out, out)}
