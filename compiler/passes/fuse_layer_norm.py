"""LayerNorm written out in primitive operators becomes one LayerNormalization, as
onnxruntime's transformer optimizer fuses it. Exporters without the operator (PaddlePaddle's,
torch before opset 17) write, over the last axis:

    mean = ReduceMean(x);  d = x - mean;  var = ReduceMean(d^2)   (Pow(d, 2) or d * d)
    y = d / Sqrt(var + eps)   [* gamma]  [+ beta]

Fused, the int8 form normalizes with integer mean, variance and square root in one kernel
(`numerics.layer_norm`); written out, each step would round to int8, and the square of the
centred values alone loses half its bits.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import ADD, DIV, LAYER_NORMALIZATION, MUL, POW, REDUCE_MEAN, SQRT, SUB
from compiler.passes.util import prune_values


def fuse_layer_norm(graph: Graph) -> Graph:
    """After this pass no written-out LayerNorm over the last axis remains."""
    producers, users = graph.producers(), graph.users()
    replaced: dict[str, Node] = {}  # the last node of a match → the LayerNormalization
    dropped: set[str] = set()
    new_values: dict[str, Value] = {}
    for div in graph.nodes:
        match = _match(graph, div, producers, users)
        if match is None:
            continue
        x, eps, nodes, last, gamma, beta = match
        width = graph.type_of(x).shape[-1]
        dtype = graph.type_of(x).dtype

        def const(name: str, value) -> str:
            array = np.broadcast_to(np.asarray(value, dtype), (width,)).copy()
            new_values[name] = Value(name, Type(dtype, (width,)), array)
            return name

        scale = const(f"{div.name}/gamma", 1.0 if gamma is None else gamma)
        bias = const(f"{div.name}/beta", 0.0 if beta is None else beta)
        replaced[last.name] = Node(LAYER_NORMALIZATION.name, f"{last.name}/layer_norm",
                                   (x, scale, bias), (last.outputs[0],),
                                   {"axis": -1, "epsilon": float(eps)})
        dropped |= {n.name for n in nodes} - {last.name}
    if not replaced:
        return graph
    out = [replaced.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    return prune_values(graph, out, new_values)


def _last_axis_mean(graph: Graph, node: Node | None, of: str) -> bool:
    if node is None or node.op != REDUCE_MEAN.name or node.inputs[0] != of:
        return False
    rank = graph.type_of(of).rank
    axes = graph.const_of(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
    keep = node.attrs.get("keepdims", 1)
    return axes is not None and [int(a) % rank for a in axes.reshape(-1)] == [rank - 1] \
        and keep == 1


def _only_user(users, name: str) -> Node | None:
    readers = users.get(name, ())
    return readers[0] if len(readers) == 1 else None


def _match(graph: Graph, div: Node, producers, users):
    """(x, eps, the matched nodes, the last one, gamma, beta) when `div` ends a written-out
    LayerNorm's normalization, else None."""
    if div.op != DIV.name:
        return None
    sub, sqrt = producers.get(div.inputs[0]), producers.get(div.inputs[1])
    if sub is None or sqrt is None or sub.op != SUB.name or sqrt.op != SQRT.name:
        return None
    x = sub.inputs[0]
    mean = producers.get(sub.inputs[1])
    if not _last_axis_mean(graph, mean, x):
        return None
    add_eps = producers.get(sqrt.inputs[0])
    if add_eps is None or add_eps.op != ADD.name:
        return None
    eps = graph.const_of(add_eps.inputs[1])
    var = producers.get(add_eps.inputs[0])
    if eps is None or eps.size != 1 or var is None:
        return None
    square = producers.get(var.inputs[0])
    if not _last_axis_mean(graph, var, var.inputs[0]) or square is None:
        return None
    d = sub.outputs[0]
    squared = (square.op == POW.name and square.inputs[0] == d and
               (e := graph.const_of(square.inputs[1])) is not None and e.size == 1
               and float(e) == 2.0) or (square.op == MUL.name and square.inputs[:2] == (d, d))
    if not squared:
        return None
    nodes = [mean, sub, square, var, add_eps, sqrt, div]
    inner = {n.outputs[0] for n in nodes[:-1]}
    readers = {u.name for name in inner for u in users.get(name, ())}
    if not readers <= {n.name for n in nodes} or any(o in graph.outputs for o in inner):
        return None
    last, gamma, beta = div, None, None
    width = graph.type_of(x).shape[-1]
    for op in (MUL, ADD):
        follower = _only_user(users, last.outputs[0])
        if follower is None or follower.op != op.name or last.outputs[0] in graph.outputs:
            break
        other = [i for i in follower.inputs if i != last.outputs[0]]
        value = graph.const_of(other[0]) if len(other) == 1 else None
        if value is None or value.size not in (1, width) or \
                (value.ndim and value.shape[-1] != value.size):
            break
        if op is MUL:
            gamma = value.reshape(-1)
        else:
            beta = value.reshape(-1)
        nodes.append(follower)
        last = follower
    return x, float(eps.reshape(-1)[0]), nodes, last, gamma, beta
