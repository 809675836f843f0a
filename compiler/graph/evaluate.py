"""The reference interpreters' node step and the fp32 interpreter: runs a Graph node by node
with the operator table's references.

`run_node` is the one definition of what a node of a quantized graph computes: its int8 kernel for
integer nodes, its fp32 reference otherwise. The integer reference (`quantizer.reference.run_int8`)
and the host segments of a compiled program (`compiler.backend.codegen.host.run_segment`) both call
it, so the host runs exactly what the oracle runs."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from compiler.errors import CompileError
from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, data_errors, int8_attrs, is_integer_node, run_fp32
from simulator.errors import listing


def check_feeds(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds as arrays of the graph's input types; a mismatch names the input."""
    missing = [name for name in graph.inputs if name not in feeds]
    if missing:
        raise CompileError(f"missing input(s) {listing(missing, quote=True)}; the model takes "
                           f"{listing(graph.inputs, quote=True)}")
    checked = {}
    for name in graph.inputs:
        want = graph.type_of(name)
        array = np.asarray(feeds[name])
        if array.shape != want.shape:
            raise CompileError(f"input {name!r}: expected shape {want.shape}, got {array.shape}")
        if array.dtype != np.dtype(want.dtype):
            if not np.can_cast(array.dtype, want.dtype, casting="same_kind"):
                raise CompileError(f"input {name!r}: expected {want.dtype}, got {array.dtype}")
            array = array.astype(want.dtype)
        checked[name] = array
    return checked


def evaluate(graph: Graph, feeds: Mapping[str, np.ndarray],
             keep_all: bool = False) -> dict[str, np.ndarray]:
    """Run the graph; returns its outputs, or with keep_all every value it computed."""
    env: dict[str, np.ndarray] = {n: v.const for n, v in graph.values.items() if v.is_const}
    env.update(check_feeds(graph, feeds))
    for node in graph.nodes:
        args = [env[name] if name else None for name in node.inputs]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            results = run_fp32(node, args)
        for name, result in zip(node.outputs, results):
            env[name] = result
    if keep_all:
        return env
    return {name: env[name] for name in graph.outputs}


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
    with data_errors(node):
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
