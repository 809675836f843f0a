"""Constant folding: evaluate every node whose inputs are all known, and Shape of static shapes."""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Value
from compiler.graph.ops import OPS, run_fp32
from compiler.passes.util import prune_values


def fold_constants(graph: Graph) -> Graph:
    """After this pass no node has only constant inputs, and no Shape node remains.

    Shapes are static in ember, so Shape always folds; the Shape → Gather → Concat → Reshape
    chains that exporters emit then fold to a constant target shape. Graph outputs that become
    constant stay computed by their node, so the graph keeps its outputs.
    """
    consts = {name: v.const for name, v in graph.values.items() if v.is_const}
    kept, new_values = [], {}
    for node in graph.nodes:
        op = OPS[node.op]
        if op.shape_only:
            start, end = node.attrs.get("start", 0), node.attrs.get("end")
            args = [np.empty(graph.type_of(node.inputs[0]).shape, dtype=np.uint8)]
            results = run_fp32(node.with_(attrs={"start": start, "end": end}), args)
        elif node.inputs and all(not n or n in consts for n in node.inputs) or (
                not op.inputs):  # Constant: its value is its attribute
            results = run_fp32(node, [consts[n] if n else None for n in node.inputs])
        else:
            kept.append(node)
            continue
        if any(out in graph.outputs for out in node.outputs):
            kept.append(node)
            continue
        for name, array in zip(node.outputs, results):
            array = np.array(array, copy=True, order="C")
            consts[name] = array
            new_values[name] = Value.constant(name, array)
    if len(kept) == len(graph.nodes):
        return graph
    return prune_values(graph, kept, new_values)
