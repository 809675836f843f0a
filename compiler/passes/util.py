"""Small graph-editing helpers shared by the passes."""

from __future__ import annotations

from typing import Iterable, Mapping

from compiler.graph.ir import Graph, Node, Value


def rename_uses(nodes: Iterable[Node], mapping: Mapping[str, str]) -> list[Node]:
    """Nodes with every input renamed through `mapping` (names not in it stay)."""
    renamed = []
    for node in nodes:
        inputs = tuple(mapping.get(name, name) for name in node.inputs)
        renamed.append(node if inputs == node.inputs else node.with_(inputs=inputs))
    return renamed


def prune_values(graph: Graph, nodes: Iterable[Node], extra: Mapping[str, Value] = {},
                 origin: Mapping[str, str] = {}) -> Graph:
    """A graph over `nodes` whose value table holds exactly the names still in use."""
    nodes = tuple(nodes)
    table = {**graph.values, **extra}
    used = set(graph.inputs) | set(graph.outputs)
    for node in nodes:
        used.update(n for n in node.inputs if n)
        used.update(node.outputs)
    values = {name: value for name, value in table.items() if name in used}
    merged_origin = {**graph.origin, **origin}
    return graph.replace(nodes=nodes, values=values,
                         origin={k: v for k, v in merged_origin.items() if k in values})


def single_user(graph: Graph, name: str) -> bool:
    return name not in graph.outputs and len(graph.users().get(name, [])) == 1
