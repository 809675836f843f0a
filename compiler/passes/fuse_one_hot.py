"""A one-hot encoding multiplied by a constant matrix becomes the row lookup it is: Gather.

Models that embed integer tokens without a Gather (JAX's `one_hot` and `Dense`, as Magika's
byte classifier exports it) compare each id with a range, cast the booleans to float and
multiply by the embedding table:

    onehot = Cast(Equal(ids[..., None], arange(K)))      (or OneHot(ids, K, [0, 1]))
    y = onehot @ W   [+ b]                                W: [K, N]

For an id in [0, K) that is row id of W (plus b): one `Gather` of the table, the indexed DMA
on the accelerator, where the written-out form would be a [..., K] float tensor and a K-deep
product per token. A bias added after the product folds into the table's rows. The forms
differ for ids outside [0, K): the one-hot row is zero there, where the lookup refuses the id
in one line naming it (the GATHER instruction checks every index), so the pass needs the ids
to be a model input's integers or a move of them.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import (ADD, CAST, EQUAL, EXPAND, GATHER, MATMUL, ONE_HOT, OPS, RESHAPE,
                                ViewKind)
from compiler.passes.util import prune_values


def fuse_one_hot(graph: Graph) -> Graph:
    """After this pass no product of a constant matrix by a one-hot encoding of a model
    input's integers remains."""
    producers, users = graph.producers(), graph.users()
    replaced: dict[str, list[Node]] = {}
    dropped: set[str] = set()
    values: dict[str, Value] = {}
    for matmul in graph.nodes:
        match = _match(graph, matmul, producers, users)
        if match is None:
            continue
        ids, table, last, nodes = match
        name = f"{matmul.name}/embedding"
        table_name = f"{name}/table"
        values[table_name] = Value.constant(table_name, table)
        out = last.outputs[0]
        out_shape = graph.type_of(out).shape
        gathered = (*graph.type_of(ids).shape, table.shape[1])
        if tuple(gathered) == tuple(out_shape):
            replaced[last.name] = [Node(GATHER.name, name, (table_name, ids), (out,),
                                        {"axis": 0})]
        else:  # the ids' own shape, then the product's (its size the same)
            rows = f"{name}/rows"
            shape_name = f"{name}/shape"
            values[rows] = Value(rows, Type("float32", gathered))
            values[shape_name] = Value.constant(shape_name, np.asarray(out_shape, np.int64))
            replaced[last.name] = [
                Node(GATHER.name, name, (table_name, ids), (rows,), {"axis": 0}),
                Node(RESHAPE.name, f"{name}/reshape", (rows, shape_name), (out,), {})]
        dropped |= {n.name for n in nodes} - {last.name}
    if not replaced:
        return graph
    out_nodes = [m for n in graph.nodes if n.name not in dropped
                 for m in replaced.get(n.name, [n])]
    return prune_values(graph, out_nodes, values)


def _integer_source(graph: Graph, producers: dict, name: str) -> str | None:
    """The model input whose integers `name` holds in their order, through Reshapes (and
    Unsqueeze, Squeeze...) and Expands that keep their count; None otherwise."""
    size = int(np.prod(graph.type_of(name).shape))
    while name in producers:
        node = producers[name]
        row = OPS[node.op]
        if not (row.view in (ViewKind.RESHAPE, ViewKind.SAME) or row is EXPAND) or \
                int(np.prod(graph.type_of(node.inputs[0]).shape)) != size:
            return None
        name = node.inputs[0]
    ok = name in graph.inputs and np.dtype(graph.type_of(name).dtype).kind in "iu"
    return name if ok else None


def _one_hot(graph: Graph, producers: dict, name: str) -> tuple[str, int, list[Node]] | None:
    """(the ids, K, the nodes) when `name` is a float one-hot encoding of a model input's
    integers along its last axis: Cast(Equal(ids[..., None], arange(K))) or OneHot(ids, K,
    [0, 1]) on the last axis."""
    node = producers.get(name)
    if node is None:
        return None
    shape = graph.type_of(name).shape
    if node.op == ONE_HOT.name:
        depth, on_off = graph.const_of(node.inputs[1]), graph.const_of(node.inputs[2])
        axis = node.attrs.get("axis", -1) % len(shape)
        ids = _integer_source(graph, producers, node.inputs[0])
        if ids is None or depth is None or on_off is None or axis != len(shape) - 1 or \
                on_off.reshape(-1).tolist() != [0, 1] or \
                graph.type_of(ids).shape != tuple(shape[:-1]):
            return None
        return ids, int(depth.reshape(-1)[0]), [node]
    if node.op != CAST.name:
        return None
    equal = producers.get(node.inputs[0])
    if equal is None or equal.op != EQUAL.name:
        return None
    k = shape[-1]
    for side in (0, 1):
        codes, other = equal.inputs[side], equal.inputs[1 - side]
        span = graph.const_of(other)
        if span is None or graph.type_of(codes).shape[-1:] != (1,) or \
                span.size != k or (span.ndim and span.shape[-1] != k) or \
                not np.array_equal(span.reshape(-1), np.arange(k)):
            continue
        ids = _integer_source(graph, producers, codes)
        if ids is not None and int(np.prod(graph.type_of(ids).shape)) * k == \
                int(np.prod(shape)):
            return ids, k, [equal, node]
    return None


def _match(graph: Graph, matmul: Node, producers: dict, users: dict):
    """(ids, the table [K, N] with the bias folded in, the last node, the matched nodes)."""
    if matmul.op != MATMUL.name:
        return None
    found = _one_hot(graph, producers, matmul.inputs[0])
    weight = graph.const_of(matmul.inputs[1])
    if found is None or weight is None or weight.ndim != 2:
        return None
    ids, k, nodes = found
    inner = [n.outputs[0] for n in nodes]
    if weight.shape[0] != k or any(name in graph.outputs or len(users.get(name, ())) != 1
                                   for name in inner):
        return None
    table, last = weight.astype(np.float32), matmul
    follower = users.get(matmul.outputs[0], [])
    if len(follower) == 1 and follower[0].op == ADD.name and \
            matmul.outputs[0] not in graph.outputs:
        add = follower[0]
        other = [i for i in add.inputs if i != matmul.outputs[0]]
        bias = graph.const_of(other[0]) if len(other) == 1 else None
        if bias is not None and bias.size in (1, table.shape[1]) and \
                (bias.ndim == 0 or bias.shape[-1] == bias.size) and \
                graph.type_of(add.outputs[0]).shape == graph.type_of(matmul.outputs[0]).shape:
            table = (table + bias.reshape(-1)).astype(np.float32)
            last = add
    return ids, table, last, [*nodes, matmul, *([last] if last is not matmul else [])]
