"""Clip by a bound computed at run time, split into Max and Min.

A Clip whose min or max input is a constant (or one constant folding computed) is one table in
int8. A bound computed at run time (a scalar the model derives from an activation, say its mean)
makes Clip a function of two activations, which no table holds; but Clip(x, lo, hi) is
Min(Max(x, lo), hi), and Max and Min of two activations run on the vector unit (ADD with op max
or min). This pass rewrites each such Clip: its run-time bounds become a Max and a Min, a
constant bound stays in a Clip (a table). The last node keeps the Clip's name and output, so
profiles still match.
"""

from __future__ import annotations

from compiler.graph.ir import Graph, Node, Value
from compiler.graph.ops import CLIP, MAX, MIN
from compiler.passes.util import prune_values


def split_clip(graph: Graph) -> Graph:
    """After this pass no Clip has a bound computed at run time."""
    nodes, extra, origin, changed = [], {}, {}, False
    for node in graph.nodes:
        if node.op != CLIP.name or not _run_time_bound(graph, node):
            nodes.append(node)
            continue
        changed = True
        x, lo, hi = (tuple(node.inputs) + ("", ""))[:3]
        # Each step: (row, bound); a constant bound stays a Clip, its slot (min or max) kept.
        steps = [(MAX, lo) if lo and not graph.values[lo].is_const else (CLIP, (lo, "")),
                 (MIN, hi) if hi and not graph.values[hi].is_const else (CLIP, ("", hi))]
        steps = [(row, bound) for row, bound in steps if bound not in ("", ("", ""))]
        value = x
        for i, (row, bound) in enumerate(steps):
            last = i == len(steps) - 1
            out = node.outputs[0] if last else f"{node.name}/{row.name.lower()}"
            name = node.name if last else out
            inputs = (value, bound) if row is not CLIP else (value, *bound)
            while inputs and not inputs[-1]:
                inputs = inputs[:-1]
            nodes.append(Node(row.name, name, inputs, (out,)))
            if not last:
                extra[out] = Value(out, graph.type_of(x))
                origin[out] = node.outputs[0]
            value = out
    return prune_values(graph, nodes, extra, origin) if changed else graph


def _run_time_bound(graph: Graph, node: Node) -> bool:
    return any(name and not graph.values[name].is_const for name in node.inputs[1:3])
