"""Gated activations written out in primitive operators, fused into one lookup operator.

Exporters write SiLU as x * Sigmoid(x), hard-swish as x * HardSigmoid(x) or
x * Clip(x + 3, 0, 6) / 6, Mish as x * Tanh(Softplus(x)) and GELU as
x * 0.5 * (1 + Erf(x / √2)). Each is one value computed elementwise from one input x, so in
int8 it is exactly one 256-entry table of x: quantizing each primitive (and running an
activation × activation product) would cost accuracy and a host segment. This pass finds every
such region (nodes that map values elementwise: tables, clamps, scalar-constant affine maps,
and products or sums of two values of the same x), evaluates it on a dense grid of x and, when
it equals an operator the table recognises (`recognised_forms`), replaces it by that operator.
The fused node takes the region's last node's name and output, so profiles still match.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import GRID, OPS, recognised, run_fp32
from compiler.passes.util import prune_values


_ELEMENTWISE = (Quant.LOOKUP, Quant.CLAMP, Quant.ADD, Quant.MUL)


def fuse_gates(graph: Graph) -> Graph:
    """After this pass no region computing a recognised activation from one value is left in
    primitive operators."""
    producers = graph.producers()
    users = graph.users()
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    root: dict[str, str] = {}
    for node in graph.nodes:
        inputs = _elementwise_inputs(graph, node)
        if inputs is None:
            continue
        roots = {root.get(name, name) for name in inputs}
        if len(roots) == 1:
            root[node.outputs[0]] = roots.pop()
    fused: dict[str, Node] = {}   # the region's last node's name → the fused node
    dropped: set[str] = set()
    for node in reversed(graph.nodes):
        out = node.outputs[0] if node.outputs else None
        if out not in root or node.name in dropped:
            continue
        # The widest region first (from the farthest root), then narrower ones from the values
        # inside it: SiLU of an Elu's output is a region of its own inside Elu-then-SiLU.
        widest = _region(graph, root[out], out, producers, order, root)
        for x in [root[out]] + [n.outputs[0] for n in (widest or [])[:-1]]:
            region = _region(graph, x, out, producers, order, root)
            if region is None or len(region) < 2 or dropped & {n.name for n in region}:
                continue
            inner = [n.outputs[0] for n in region[:-1]]
            if any(v in graph.outputs or any(u not in region for u in users.get(v, ()))
                   for v in inner):
                continue  # an intermediate value is read elsewhere: the region must stay
            match = _recognise(graph, x, region)
            if match is None:
                continue
            op, attrs = match
            fused[node.name] = Node(op, node.name, (x,), (out,), dict(attrs))
            dropped.update(n.name for n in region)
            break
    if not fused:
        return graph
    nodes = [fused[n.name] if n.name in fused else n for n in graph.nodes
             if n.name in fused or n.name not in dropped]
    return prune_values(graph, nodes)


def _elementwise_inputs(graph: Graph, node: Node) -> list[str] | None:
    """The run-time inputs of a node that maps values elementwise with no broadcast (its
    constants scalars), or None when it is not such a node."""
    row = OPS[node.op]
    if row.quant not in _ELEMENTWISE and row.channel_affine is None or len(node.outputs) != 1:
        return None
    shape = graph.type_of(node.outputs[0]).shape
    values = [graph.values[n] for n in node.inputs if n]
    if any(v.is_const and v.const.size != 1 for v in values):
        return None
    run_time = [v.name for v in values if not v.is_const]
    if not run_time or any(graph.type_of(n).shape != shape or graph.type_of(n).dtype != "float32"
                           for n in run_time):
        return None
    return run_time


def _region(graph: Graph, x: str, out: str, producers, order, root) -> list[Node] | None:
    """The elementwise nodes between x and out (constants aside), in graph order (out's
    producer last); None when a path from out leads elsewhere than to x."""
    seen: dict[str, Node] = {}
    stack = [out]
    while stack:
        name = stack.pop()
        if name == x or graph.values[name].is_const:
            continue
        node = producers.get(name)
        if node is None or name not in root:
            return None
        if node.name not in seen:
            seen[node.name] = node
            stack.extend(n for n in node.inputs if n)
    return sorted(seen.values(), key=lambda n: order[n.name])


def _recognise(graph: Graph, x: str, region: list[Node]) -> tuple[str, dict] | None:
    """The (operator, attributes) the region computes on the grid, if the table knows one."""
    env = {x: GRID}
    with np.errstate(all="ignore"):
        for node in region:
            args = [env[n] if n in env else (graph.values[n].const if n else None)
                    for n in node.inputs]
            env[node.outputs[0]] = run_fp32(node, args)[0]
    return recognised(env[region[-1].outputs[0]])
