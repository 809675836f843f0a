"""Dead-code elimination."""

from __future__ import annotations

from compiler.graph.ir import Graph
from compiler.passes.util import prune_values


def eliminate_dead(graph: Graph) -> Graph:
    """After this pass every node contributes to a graph output and every constant is read."""
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(out in live for out in node.outputs):
            kept.append(node)
            live.update(n for n in node.inputs if n)
    kept.reverse()
    pruned = prune_values(graph, kept)
    if len(kept) == len(graph.nodes) and len(pruned.values) == len(graph.values):
        return graph
    return pruned
