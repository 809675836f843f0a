"""The integer reference interpreter: runs a quantized Graph with simulator.numerics only.

It is the oracle the compiled program must match bit for bit. Quantized nodes run their int8
kernels (the operator table's int8 column), which use integer arithmetic only; floats appear only
in QuantizeLinear and DequantizeLinear (ONNX semantics) and in nodes kept in fp32, which run
their fp32 references. The node step, `compiler.graph.evaluate.run_node`, is shared with the
host segments of compiled programs.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from compiler.graph.evaluate import check_feeds, run_node
from compiler.graph.ir import Graph
from simulator import numerics


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
    lines up with `evaluate(fp32_graph, feeds, keep_all=True)`. A name several values carry is
    the first's, the value the node computing the tensor writes: a Rescale's copy of it in a
    reader's parameters (a Concat's) comes later and carries the name too. (Reporting only:
    the float arithmetic here never feeds back into the integer run.)
    """
    out = {}
    for name, value in qgraph.values.items():
        params = value.type.quant
        origin = qgraph.origin.get(name, name)
        if value.is_const or params is None or params.axis is not None or name not in env \
                or origin in out:
            continue
        real = numerics.dequantize(env[name], params.scale[0], params.zero_point[0],
                                   arithmetic=np.float64)
        out[origin] = real.astype(np.float32)
    return out
