"""Casts of integers to float moved onto the integers they start from.

Exporters unsqueeze, reshape or expand an integer mask (BERT's attention_mask) before casting it
to float. Casting integers commutes exactly with moving them, so the Cast moves before each
such node, onto the integer value itself, and equal Casts of one value then merge
(`eliminate_common`). On a model input the quantizer makes that Cast the input's quantization:
the host turns the integers into int8 codes as it does a float input's values, and the moves
after it are of int8 codes, which the accelerator's views and broadcasts already handle. The
moved node keeps the Cast's output name, so profiles still match.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import CAST, OPS, moves_elements
from compiler.passes.util import prune_values


def cast_early(graph: Graph) -> Graph:
    """After this pass no Cast of integers (or booleans) to float32 reads a node that only
    moves integers (`moves_elements`)."""
    while True:
        producers = graph.producers()
        node = next((n for n in graph.nodes if _moves_back(graph, producers, n)), None)
        if node is None:
            return graph
        mover = producers[node.inputs[0]]
        source = mover.inputs[0]
        base, k = node.name.split("/early")[0], 0
        while f"{base}/early{k or ''}" in graph.values:
            k += 1
        early = f"{base}/early{k or ''}"
        cast = Node(node.op, early, (source,), (early,), node.attrs)
        moved = mover.with_(name=f"{mover.name}/{node.name}",
                            inputs=(early, *mover.inputs[1:]), outputs=node.outputs)
        nodes = [m for n in graph.nodes for m in ((cast, moved) if n is node else (n,))]
        value = Value(early, Type("float32", graph.type_of(source).shape))
        graph = prune_values(graph, nodes, {early: value},
                             {early: graph.origin.get(node.outputs[0], node.outputs[0])})


def _moves_back(graph: Graph, producers: dict, node: Node) -> bool:
    """Whether `node` casts integers to float32 straight after a move of integers."""
    if node.op != CAST.name or graph.type_of(node.outputs[0]).dtype != "float32":
        return False
    mover = producers.get(node.inputs[0])
    return mover is not None and moves_elements(OPS[mover.op]) and \
        np.dtype(graph.type_of(mover.inputs[0]).dtype).kind in "iub"
