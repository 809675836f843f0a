"""A magnitude written out, sqrt(a^2 + b^2), becomes one Hypot (ember's operator). Signal models
write a spectrum's magnitude so: silero-vad squares the real and the imaginary parts of its STFT
(`Pow(x, 2)` or `x * x`), adds them and takes the root. Written out, the power rounds to int8
before its root, and its range does not fit 8 bits (a quiet bin's power is a thousandth of a
loud one's: zero in int8, where its magnitude is a few percent). Fused, the integer kernel
squares and sums the codes exactly and takes an integer root (`numerics.hypot`), one ADD of the
vector unit (op hypot).
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node
from compiler.graph.ops import ADD, HYPOT, MUL, POW, SQRT
from compiler.passes.util import prune_values


def fuse_hypot(graph: Graph) -> Graph:
    """After this pass no Sqrt of a sum of two squares (each read by the sum alone) remains."""
    producers, users = graph.producers(), graph.users()
    replaced: dict[str, Node] = {}
    dropped: set[str] = set()
    for root in graph.nodes:
        match = _match(graph, root, producers, users)
        if match is None:
            continue
        (a, b), nodes = match
        replaced[root.name] = Node(HYPOT.name, root.name, (a, b), root.outputs, {})
        dropped |= {n.name for n in nodes}
    if not replaced:
        return graph
    out = [replaced.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    return prune_values(graph, out, {})


def _square_of(graph: Graph, node: Node | None) -> str | None:
    """x when `node` is Pow(x, 2) or Mul(x, x), else None."""
    if node is None:
        return None
    if node.op == MUL.name and node.inputs[0] == node.inputs[1]:
        return node.inputs[0]
    if node.op == POW.name and graph.values[node.inputs[1]].is_const:
        exponent = np.asarray(graph.values[node.inputs[1]].const)
        if exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0:
            return node.inputs[0]
    return None


def _match(graph: Graph, root: Node, producers, users):
    """((a, b), the nodes it replaces besides the root) when `root` is Sqrt(a^2 + b^2) over
    two activations of its shape, else None."""
    if root.op != SQRT.name:
        return None
    total = producers.get(root.inputs[0])
    if total is None or total.op != ADD.name:
        return None
    squares = [producers.get(name) for name in total.inputs]
    parts = [_square_of(graph, node) for node in squares]
    if any(p is None or graph.values[p].is_const for p in parts):
        return None
    inner = [total.outputs[0]] + [node.outputs[0] for node in squares]
    if len(set(inner)) != 3 or any(name in graph.outputs or len(users.get(name, ())) != 1
                                   for name in inner):
        return None
    shape = graph.type_of(root.outputs[0]).shape
    if any(graph.type_of(p).shape != shape for p in parts):
        return None
    return tuple(parts), [total, *squares]
