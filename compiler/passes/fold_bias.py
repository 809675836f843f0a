"""A constant bias added after a Conv, Gemm or MatMul, folded into that node's own bias.

TensorFlow exports a layer's bias as its own node (tf2onnx's MatMul + Add "BiasAdd", a Conv
without a bias followed by Add). An Add (or Sub) of a constant with one value per output
channel to the sole-used output of a node that absorbs a per-channel affine map (the table's
`absorbs_channel_affine`) becomes that node's bias; a MatMul of a rank-2 activation by a
constant becomes the Gemm it is, and one of a higher-rank activation (a transformer's
projections, [B, S, D] by [D, N], the bias one value per last-axis channel) the Gemm of its
rows between two Reshapes, which are views. The folded node takes the Add's output name, so
profiles and per-layer reports still match it.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import GEMM, OPS, RESHAPE, Lower
from compiler.passes.util import prune_values, single_user


def fold_bias(graph: Graph) -> Graph:
    """After this pass no per-channel constant Add or Sub follows, alone, a node whose own bias
    can hold it."""
    producers = graph.producers()
    replaced: dict[str, Node] = {}
    dropped: set[str] = set()
    new_values: dict[str, Value] = {}
    origin: dict[str, str] = {}
    for node in graph.nodes:
        offset = _offset(graph, node)
        if offset is None:
            continue
        x, values = offset
        producer = producers.get(x)
        if producer is None or producer.name in replaced or not single_user(graph, x):
            continue
        folded = _fold(graph, producer, values, node.outputs[0])
        if folded is None:
            folded = _fold_rows(graph, producer, values, node.outputs[0])
        if folded is None:
            continue
        replaced[producer.name], values_made, made_from = folded
        new_values.update((v.name, v) for v in values_made)
        origin.update(made_from)
        dropped.add(node.name)
    if not replaced:
        return graph
    nodes = [m for n in graph.nodes if n.name not in dropped
             for m in replaced.get(n.name, (n,))]
    return prune_values(graph, nodes, new_values, origin)


def _offset(graph: Graph, node: Node) -> tuple[str, np.ndarray] | None:
    """(x, offset) when `node` is x + offset with a constant offset (its table row's
    `channel_affine` with a scale of one), else None."""
    row = OPS[node.op]
    if row.channel_affine is None or row.folds_into_producer or len(node.outputs) != 1:
        return None
    consts = [graph.values[n].const if n and graph.values[n].is_const else None
              for n in node.inputs]
    run_time = [n for n, c in zip(node.inputs, consts) if n and c is None]
    if len(run_time) != 1 or graph.type_of(run_time[0]).dtype != "float32":
        return None
    x_type = graph.type_of(run_time[0])
    if graph.type_of(node.outputs[0]).shape != x_type.shape:
        return None  # the constant broadcasts x to a larger shape
    mapped = row.channel_affine(row.bind(node.name, node.attrs), consts, x_type.rank)
    if mapped is None or np.any(np.asarray(mapped[0]) != 1.0):
        return None
    return run_time[0], np.asarray(mapped[1], np.float64)


def _fold(graph: Graph, producer: Node, offset: np.ndarray, out: str
          ) -> tuple[tuple[Node, ...], tuple[Value, ...], dict] | None:
    """The producer with `offset` added to its bias (a MatMul becomes a Gemm), or None when
    the offset is not one value per output channel or the producer's bias cannot take it."""
    shape = graph.type_of(producer.outputs[0]).shape
    if len(shape) < 2:
        return None
    channels = shape[1]
    # One value per output channel: broadcast over every other axis of the output.
    per_channel = [1] * len(shape)
    per_channel[1] = channels
    try:
        if np.broadcast_shapes(offset.shape, tuple(per_channel)) != tuple(per_channel):
            return None
    except ValueError:
        return None
    offset = np.broadcast_to(offset, per_channel).reshape(channels)
    row = OPS[producer.op]
    weight = producer.inputs[1] if len(producer.inputs) > 1 else ""
    if not weight or not graph.values[weight].is_const:
        return None
    if row.absorbs_channel_affine:
        attrs = row.bind(producer.name, producer.attrs)
        beta = float(attrs.get("beta", 1.0))
        old = producer.inputs[2] if len(producer.inputs) > 2 else ""
        if old and (not graph.values[old].is_const or graph.values[old].const.size != channels):
            return None
        if beta == 0.0:
            return None
        base = graph.values[old].const.reshape(channels).astype(np.float64) if old else 0.0
        node = producer
    elif row.lower is Lower.MATMUL and len(shape) == 2 and graph.type_of(weight).rank == 2:
        base, beta, node = 0.0, 1.0, Node(GEMM.name, producer.name, producer.inputs[:2],
                                          producer.outputs, {})
    else:
        return None
    name = f"{producer.name}/B_add"
    dtype = graph.type_of(out).dtype
    bias = ((base * beta + offset) / beta).astype(dtype)
    value = Value(name, Type(dtype, (channels,)), bias)
    return (node.with_(inputs=(node.inputs[0], node.inputs[1], name), outputs=(out,)),), \
        (value,), {}


def _fold_rows(graph: Graph, producer: Node, offset: np.ndarray, out: str
               ) -> tuple[tuple[Node, ...], tuple[Value, ...], dict] | None:
    """A MatMul of a rank-3+ activation by a constant [D, N] weight, plus one offset per
    last-axis channel: Reshape to rows [-1, D], the Gemm with the offset as its bias, Reshape
    back to the output's shape under `out`; None when it is not that."""
    if OPS[producer.op].lower is not Lower.MATMUL or len(producer.inputs) != 2:
        return None
    x, weight = producer.inputs
    shape = graph.type_of(producer.outputs[0]).shape
    if not graph.values[weight].is_const or graph.type_of(weight).rank != 2 or \
            graph.values[x].is_const or len(shape) < 3:
        return None
    d, n = graph.type_of(weight).shape
    try:
        if np.broadcast_shapes(offset.shape, (n,)) != (n,):
            return None
    except ValueError:
        return None
    rows = f"{producer.name}/rows"
    dtype = graph.type_of(out).dtype
    values = (Value(f"{rows}/shape", Type("int64", (2,)), np.array([-1, d], np.int64)),
              Value(rows, Type(dtype, (int(np.prod(shape[:-1])), d))),
              Value(f"{producer.name}/B_add", Type(dtype, (n,)),
                    np.broadcast_to(offset, (n,)).astype(dtype)),
              Value(f"{producer.name}/gemm", Type(dtype, (int(np.prod(shape[:-1])), n))),
              Value(f"{out}/shape", Type("int64", (len(shape),)), np.array(shape, np.int64)))
    nodes = (Node(RESHAPE.name, f"{producer.name}/to_rows", (x, values[0].name), (rows,)),
             Node(GEMM.name, producer.name, (rows, weight, values[2].name),
                  (values[3].name,), {}),
             Node(RESHAPE.name, f"{producer.name}/from_rows", (values[3].name, values[4].name),
                  (out,)))
    # The rows are x's values and the Gemm's are out's, reshaped: the profile's ranges.
    return nodes, values, {rows: graph.origin.get(x, x),
                           values[3].name: graph.origin.get(out, out)}
