"""The fp32 reference interpreter: runs a Graph node by node with the table's references."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from compiler.errors import CompileError
from compiler.graph.ir import Graph
from compiler.graph.ops import run_fp32


def check_feeds(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds as arrays of the graph's input types; a mismatch names the input."""
    missing = [name for name in graph.inputs if name not in feeds]
    if missing:
        raise CompileError(f"missing input(s) {missing}; the model takes {list(graph.inputs)}")
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
