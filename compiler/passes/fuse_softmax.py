"""Softmax written out in primitive operators becomes one Softmax, as onnxruntime's
transformer optimizer fuses it. Exporters and hand-written models compute, along one axis:

    e = Exp(x - ReduceMax(x))   (or Exp(x), without the shift)
    y = e / ReduceSum(e)

Fused, the int8 form is one integer kernel (an exp table and an exact division,
`numerics.softmax`) on the vector unit; written out, the maximum and the sum would each need a
row reduction, and the exponentials, rounded to int8 before they are summed, lose the small
ones that add up.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node
from compiler.graph.ops import (DIV, EXP, EXPAND, MAX, OPS, REDUCE_MAX, REDUCE_SUM, SOFTMAX,
                                SUB, ViewKind)
from compiler.passes.util import prune_values


def fuse_softmax(graph: Graph) -> Graph:
    """After this pass no written-out softmax along one axis remains."""
    producers, users = graph.producers(), graph.users()
    replaced: dict[str, Node] = {}
    dropped: set[str] = set()
    for div in graph.nodes:
        match = _match(graph, div, producers, users)
        if match is None:
            continue
        x, axis, nodes = match
        replaced[div.name] = Node(SOFTMAX.name, div.name, (x,), div.outputs, {"axis": axis})
        dropped |= {n.name for n in nodes} - {div.name}
    if not replaced:
        return graph
    out = [replaced.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    return prune_values(graph, out, {})


def _one_axis(graph: Graph, node: Node | None, op: str, of: str, producers: dict,
              nodes: list[Node]) -> int | None:
    """The axis `node` reduces when it is `op` over one axis of `of`, its result of the
    shape keepdims gives (with keepdims, or through a Reshape back to it, as JAX writes it;
    a row's maximum perhaps through a Max with a constant, which only guards an all -inf row:
    softmax is the same whatever per-row value it subtracts), else None. The nodes on the way
    are appended to `nodes`."""
    found = []
    kept = node.outputs[0] if node is not None else None
    while node is not None and node.op != op:
        if OPS[node.op].view is ViewKind.RESHAPE or node.op == EXPAND.name or (
                op == REDUCE_MAX.name and node.op == MAX.name and
                any(graph.values[i].is_const and graph.values[i].const.size == 1
                    for i in node.inputs)):
            found.append(node)
            inner = [i for i in node.inputs[:1 if node.op != MAX.name else 2]
                     if not graph.values[i].is_const]
            node = producers.get(inner[0]) if len(inner) == 1 else None
        else:
            return None
    if node is None or node.inputs[0] != of:
        return None
    given = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    axes = graph.values[given].const if given else node.attrs.get("axes")
    if axes is None or np.size(axes) != 1:
        return None
    rank = graph.type_of(of).rank
    axis = int(np.asarray(axes).reshape(-1)[0]) % rank
    shape = list(graph.type_of(of).shape)
    shape[axis] = 1
    if graph.type_of(kept).shape != tuple(shape) and not (
            node.attrs.get("keepdims", 1) and not found):
        return None
    nodes += [node, *reversed(found)]
    return axis


def _match(graph: Graph, div: Node, producers, users):
    """(x, axis, the matched nodes) when `div` ends a written-out softmax, else None."""
    if div.op != DIV.name:
        return None
    exp, total = producers.get(div.inputs[0]), producers.get(div.inputs[1])
    if exp is None or exp.op != EXP.name:
        return None
    e = exp.outputs[0]
    summed: list[Node] = []
    axis = _one_axis(graph, total, REDUCE_SUM.name, e, producers, summed)
    if axis is None:
        return None
    nodes = [exp, *summed, div]
    x = exp.inputs[0]
    sub = producers.get(x)
    if sub is not None and sub.op == SUB.name:
        peaked: list[Node] = []
        if _one_axis(graph, producers.get(sub.inputs[1]), REDUCE_MAX.name, sub.inputs[0],
                     producers, peaked) == axis:
            nodes[:0] = [*peaked, sub]
            x = sub.inputs[0]
    inner = {n.outputs[0] for n in nodes[:-1]}
    readers = {u.name for name in inner for u in users.get(name, ())}
    if not readers <= {n.name for n in nodes} or any(o in graph.outputs for o in inner) or \
            graph.type_of(div.outputs[0]).shape != graph.type_of(x).shape:
        return None
    return x, axis, nodes

