"""The integer reference interpreter: runs a quantized Graph with simulator.numerics only.

It is the oracle the compiled program must match bit for bit. Quantized nodes run their int8
kernels (the operator table's int8 column), which use integer arithmetic only; floats appear only
in QuantizeLinear and DequantizeLinear (ONNX semantics) and in nodes kept in fp32, which run
their fp32 references.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from compiler.errors import CompileError
from compiler.graph.evaluate import check_feeds
from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, int8_attrs, is_integer_node, run_fp32


def run_node(graph: Graph, node: Node, args: list[np.ndarray | None]) -> tuple[np.ndarray, ...]:
    """One node's results: the int8 kernel for integer nodes, else the fp32 reference."""
    if not is_integer_node(graph, node):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return run_fp32(node, args)
    op = OPS[node.op]
    if op.int8 is None:
        raise CompileError(f"node {node.name!r}: operator {node.op!r} has no int8 kernel")
    while args and args[-1] is None:
        args = args[:-1]
    result = op.int8(*args, **int8_attrs(node))
    results = result if isinstance(result, tuple) else (result,)
    outs = []
    for name, value in zip(node.outputs, results):
        want = graph.values[name].type.dtype
        value = np.asarray(value)
        if op.quant is not Quant.DEQUANTIZE and value.dtype != np.dtype(want):
            raise CompileError(f"node {node.name!r} ({node.op}): the int8 kernel gave "
                               f"{value.dtype} for {name!r}, typed {want}")
        outs.append(value)
    return tuple(outs)


def run_int8(qgraph: Graph, feeds: Mapping[str, np.ndarray],
             keep_all: bool = False) -> dict[str, np.ndarray]:
    """Run the quantized graph on float feeds; returns its (dequantized, float) outputs.

    With keep_all, every value computed (raw integers for quantized values), by value name.
    """
    env: dict[str, np.ndarray] = {n: v.const for n, v in qgraph.values.items() if v.is_const}
    env.update(check_feeds(qgraph, feeds))
    for node in qgraph.nodes:
        args = [env[name] if name else None for name in node.inputs]
        for name, result in zip(node.outputs, run_node(qgraph, node, args)):
            env[name] = result
    if keep_all:
        return env
    return {name: env[name] for name in qgraph.outputs}


def dequantized(qgraph: Graph, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float views of the quantized activations of a keep_all run, keyed by ONNX name.

    For per-layer reports: `Graph.origin` gives each integer value's ONNX name, so the result
    lines up with `evaluate(fp32_graph, feeds, keep_all=True)`. (Reporting only: the float
    arithmetic here never feeds back into the integer run.)
    """
    out = {}
    for name, value in qgraph.values.items():
        params = value.type.quant
        if value.is_const or params is None or params.axis is not None or name not in env:
            continue
        real = (np.asarray(env[name], np.float64) - params.zero_point[0]) * params.scale[0]
        out[qgraph.origin.get(name, name)] = real.astype(np.float32)
    return out
