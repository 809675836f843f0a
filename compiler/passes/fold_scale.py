"""Attention's score scale folded into the query projection's weights.

Attention scales its scores, Q·Kᵀ, by 1/√Dh: a Mul (or Div) by a scalar constant of the output
of a MatMul of two activations, which on the accelerator is a pass of the vector unit over all
B·H·S² scores. The scale commutes with the product, the views before it (Reshape, Transpose)
and a constant bias Add, so it moves into the constant weight (and bias) of the MatMul or Gemm
that computes an operand, where it costs nothing. The product takes the Mul's output name, so
profiles and per-layer reports still match it.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Value
from compiler.graph.ops import OPS, Lower
from compiler.passes.util import prune_values, single_user

# Nodes the scale passes through on its way to a weight: same values, another order.
_VIEWS = (Lower.VIEW, Lower.TRANSPOSE)


def fold_scale(graph: Graph) -> Graph:
    """After this pass no scalar constant Mul or Div follows, alone, a MatMul of two
    activations one of whose operands comes (through views and a constant Add) from a
    single-use MatMul or Gemm by a constant weight."""
    producers = graph.producers()
    changed: dict[str, Node] = {}
    dropped: set[str] = set()
    new_values: dict[str, Value] = {}
    for node in graph.nodes:
        scale = _scalar_scale(graph, node)
        if scale is None:
            continue
        x = next(n for n in node.inputs if not graph.values[n].is_const)
        product = producers.get(x)
        if product is None or not _activation_product(graph, product) or \
                not single_user(graph, x) or product.name in changed:
            continue
        for operand in product.inputs[:2]:
            path = _path_to_weight(graph, producers, operand)
            if path is None or any(n.name in changed for n in path):
                continue
            for step in path:
                changed[step.name], value = _scaled(graph, step, scale)
                if value is not None:
                    new_values[value.name] = value
            changed[product.name] = product.with_(outputs=(node.outputs[0],))
            dropped.add(node.name)
            break
    if not dropped:
        return graph
    nodes = [changed.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    return prune_values(graph, nodes, new_values)


def _scalar_scale(graph: Graph, node: Node) -> float | None:
    """c when `node` is x * c or x / c for a float scalar constant c (not 0), else None."""
    kind = OPS[node.op].lower
    if kind not in (Lower.MUL, Lower.DIVIDE) or len(node.inputs) != 2:
        return None
    constant = [graph.values[n].is_const for n in node.inputs]
    if (kind is Lower.DIVIDE and not constant[1]) or sum(constant) != 1:
        return None
    c = graph.values[node.inputs[constant.index(True)]].const
    x = node.inputs[constant.index(False)]
    if c.size != 1 or graph.type_of(x).dtype != "float32" or \
            graph.type_of(node.outputs[0]).shape != graph.type_of(x).shape:
        return None
    value = float(np.asarray(c).reshape(()))
    if value == 0.0 or not np.isfinite(value):
        return None
    return 1.0 / value if kind is Lower.DIVIDE else value


def _activation_product(graph: Graph, node: Node) -> bool:
    return OPS[node.op].lower is Lower.MATMUL and \
        not any(graph.values[n].is_const for n in node.inputs[:2])


def _path_to_weight(graph: Graph, producers: dict, name: str) -> list[Node] | None:
    """The constant Adds and the MatMul/Gemm by a constant weight to scale so that value
    `name` is scaled, through views, every value on the way used once; None if there is none."""
    path: list[Node] = []
    while True:
        node = producers.get(name)
        if node is None or not single_user(graph, name):
            return None
        kind = OPS[node.op].lower
        if kind in _VIEWS:
            name = node.inputs[0]
        elif kind is Lower.ADD and sum(graph.values[n].is_const for n in node.inputs) == 1:
            path.append(node)
            name = next(n for n in node.inputs if not graph.values[n].is_const)
        elif kind in (Lower.MATMUL, Lower.GEMM) and graph.values[node.inputs[1]].is_const \
                and not graph.values[node.inputs[0]].is_const:
            return path + [node]
        else:
            return None


def _scaled(graph: Graph, node: Node, scale: float) -> tuple[Node, Value | None]:
    """`node` with its output multiplied by `scale`: a Gemm's alpha and beta, or a new constant
    (a MatMul's weight, an Add's constant operand)."""
    if OPS[node.op].lower is Lower.GEMM:
        attrs = OPS[node.op].bind(node.name, node.attrs)
        return node.with_(attrs={**node.attrs, "alpha": float(attrs["alpha"]) * scale,
                                 "beta": float(attrs["beta"]) * scale}), None
    index = 1 if OPS[node.op].lower is Lower.MATMUL else \
        next(i for i, n in enumerate(node.inputs) if graph.values[n].is_const)
    old = graph.values[node.inputs[index]]
    name = f"{node.name}/scaled"
    value = Value(name, old.type, (old.const.astype(np.float64) * scale).astype(old.const.dtype))
    inputs = list(node.inputs)
    inputs[index] = name
    return node.with_(inputs=tuple(inputs)), value
