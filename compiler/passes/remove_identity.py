"""Identity and inference-time Dropout removal."""

from __future__ import annotations

from compiler.graph.ir import Graph
from compiler.graph.ops import OPS, ViewKind
from compiler.passes.util import prune_values, rename_uses


def remove_identity(graph: Graph) -> Graph:
    """After this pass no Identity or Dropout node remains, unless it alone names a graph output.

    Readers of the removed node's output read its input instead. A Dropout whose mask is used
    keeps running (the mask is all ones in inference, so folding it is a later pass's job).
    """
    mapping: dict[str, str] = {}
    kept = []
    users = graph.users()
    for node in graph.nodes:
        removable = (OPS[node.op].view is ViewKind.SAME and node.outputs[0] not in graph.outputs
                     and (len(node.outputs) < 2 or not users.get(node.outputs[1])))
        if removable:
            source = node.inputs[0]
            mapping[node.outputs[0]] = mapping.get(source, source)
        else:
            kept.append(node)
    if not mapping:
        return graph
    return prune_values(graph, rename_uses(kept, mapping))
