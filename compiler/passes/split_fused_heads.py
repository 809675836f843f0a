"""A fused Q/K/V projection split per part before its heads are formed, so no rank-5 value is
left: PaddleOCR's SVTR (and timm's ViT) write `qkv = x @ W` [B, S, 3C], Reshape to
[B, S, 3, H, Dh], Transpose to [3, B, H, S, Dh], then Slice + Squeeze of part i along axis 0.

Part i of that is the channel range [i C, (i + 1) C) of qkv, Reshaped to [B, S, H, Dh] and
Transposed to [B, H, S, Dh]: a channel Slice (a view), a Reshape (a view) and the rank-4
Transpose attention's other exporters write. The accelerator's values are of rank 4 at most,
so without this pass the Transpose, its Slices and Squeezes run on the host.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import RESHAPE, SLICE, SQUEEZE, TRANSPOSE
from compiler.passes.util import prune_values


def split_fused_heads(graph: Graph) -> Graph:
    """After this pass no Transpose of a rank-5 Reshape of a rank-3 value is read only by
    one-element Slices, each squeezed on its axis."""
    producers, users = graph.producers(), graph.users()
    replaced: dict[str, list[Node]] = {}  # the Squeeze's name → its replacement
    dropped: set[str] = set()
    new_values: dict[str, Value] = {}
    for node in graph.nodes:
        parts = _parts(graph, node, producers, users)
        if parts is None:
            continue
        reshape = producers[node.inputs[0]]
        source = reshape.inputs[0]
        shape5 = graph.type_of(node.inputs[0]).shape
        perm = [int(p) for p in node.attrs["perm"]]
        for slice_node, squeeze, axis, index in parts:
            axis_in = perm[axis]
            width = int(np.prod(shape5[axis_in + 1:], dtype=np.int64))
            shape4 = shape5[:axis_in] + shape5[axis_in + 1:]
            perm4 = [p - (p > axis_in) for p in perm if p != axis_in]
            base = f"{squeeze.name}/part"

            def value(name: str, shape, const=None, dtype=None) -> str:
                new_values[name] = Value(name, Type(dtype or graph.type_of(source).dtype,
                                                    tuple(shape)), const)
                return name

            def ints(name: str, values) -> str:
                array = np.array(values, np.int64)
                return value(name, array.shape, array, "int64")

            rank3 = graph.type_of(source).shape
            part = value(f"{base}/channels", rank3[:-1] + (width,))
            heads = value(f"{base}/heads", shape4)
            replaced[squeeze.name] = [
                Node(SLICE.name, f"{base}/slice",
                     (source, ints(f"{base}/start", [index * width]),
                      ints(f"{base}/end", [(index + 1) * width]), ints(f"{base}/axis", [-1])),
                     (part,)),
                Node(RESHAPE.name, f"{base}/reshape", (part, ints(f"{base}/shape", shape4)),
                     (heads,)),
                Node(TRANSPOSE.name, f"{base}/transpose", (heads,), squeeze.outputs,
                     {"perm": perm4})]
            dropped.add(slice_node.name)
    if not replaced:
        return graph
    nodes = []
    for node in graph.nodes:
        if node.name in replaced:
            nodes += replaced[node.name]
        elif node.name not in dropped:
            nodes.append(node)
    return prune_values(graph, nodes, new_values)


def _parts(graph: Graph, node: Node, producers, users):
    """[(Slice, Squeeze, axis, index)] when `node` is such a Transpose, else None."""
    if node.op != TRANSPOSE.name or graph.type_of(node.outputs[0]).rank != 5:
        return None
    reshape = producers.get(node.inputs[0])
    if reshape is None or reshape.op != RESHAPE.name or \
            len(users.get(node.inputs[0], ())) != 1:
        return None
    rank3 = graph.type_of(reshape.inputs[0]).shape
    shape5 = graph.type_of(node.inputs[0]).shape
    perm = [int(p) for p in node.attrs.get("perm") or ()]
    found = []
    for slice_node in users.get(node.outputs[0], ()):
        if slice_node.op != SLICE.name or node.outputs[0] in graph.outputs:
            return None
        params = [graph.values[n].const if n else None for n in slice_node.inputs[1:]]
        if len(params) < 3 or any(p is None for p in params[:3]) or \
                np.size(params[2]) != 1 or (len(params) > 3 and params[3] is not None
                                            and np.any(np.asarray(params[3]) != 1)):
            return None
        axis = int(np.asarray(params[2]).reshape(-1)[0]) % 5
        start = int(np.asarray(params[0]).reshape(-1)[0])
        size = graph.type_of(slice_node.outputs[0]).shape[axis]
        squeezes = users.get(slice_node.outputs[0], ())
        if size != 1 or len(squeezes) != 1 or squeezes[0].op != SQUEEZE.name:
            return None
        squeeze = squeezes[0]
        axes = graph.values[squeeze.inputs[1]].const if len(squeeze.inputs) > 1 else None
        if axes is None or [int(a) % 5 for a in np.asarray(axes).reshape(-1)] != [axis]:
            return None
        axis_in = perm[axis]
        if len(rank3) != 3 or tuple(rank3[:-1]) != tuple(shape5[:axis_in]) or \
                rank3[-1] != int(np.prod(shape5[axis_in:], dtype=np.int64)):
            return None
        found.append((slice_node, squeeze, axis, start % shape5[axis_in]))
    return found or None
