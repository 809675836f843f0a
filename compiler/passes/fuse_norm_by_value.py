"""A LayerNorm written in any other form, over any one axis, becomes one LayerNormalization:
recognized by what the region of nodes computes, not by its shape.

`fuse_layer_norm` matches the common exporters' form. Others write the same function
differently: JAX and Keras through tf2onnx (Magika's byte classifier) take the mean and the
mean of squares with ReduceSum and a Mul by 1/n, the variance as Max(0, E[x²] - E[x]²), its
reciprocal root as Sqrt then Reciprocal, and broadcast each statistic back with Reshape and
Expand; some normalize over an axis other than the last. This pass takes every region that
starts at one activation x, reduces it along one axis, takes a square root and ends in a value
of x's shape, whose other inputs are constants and whose inner values nothing else reads; it
evaluates the region with the fp32 reference and keeps it as LayerNormalization(x, gamma,
beta, epsilon) when that is what it computes: beta is its output on a constant x (zero
variance), gamma its slope on random x, epsilon the constant the region adds under the root,
and the fitted norm must reproduce the region on fresh random inputs to 1e-4. A norm over
another axis becomes a Transpose to the last axis, the LayerNormalization and the Transpose
back (copies on the accelerator, where LAYERNORM normalizes the contiguous axis).
"""

from __future__ import annotations

import numpy as np

from compiler.graph.evaluate import evaluate
from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import (ADD, EXPAND, LAYER_NORMALIZATION, OPS, REDUCE_MEAN, REDUCE_SUM,
                                SQRT, TRANSPOSE, ViewKind)
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.util import prune_values

# How far (in nodes) from the square root a written-out norm's statistics and its end may be.
REACH = 12
TOLERANCE = 1e-4


def fuse_norm_by_value(graph: Graph) -> Graph:
    """After this pass no region that computes a LayerNorm of one activation over one axis
    (as above) remains written out."""
    graph = eliminate_dead(graph)  # a dead reader (an Expand sunk past) is no reader
    replaced: dict[str, list[Node]] = {}
    dropped: set[str] = set()
    values: dict[str, Value] = {}
    origin: dict[str, str] = {}
    taken: set[str] = set()
    producers, users = graph.producers(), graph.users()
    order = {node.name: i for i, node in enumerate(graph.nodes)}
    for root in graph.nodes:
        if root.op != SQRT.name or root.name in taken:
            continue
        match = _match(graph, root, producers, users, order)
        if match is None:
            continue
        x, axis, y, region, gamma, beta, eps = match
        taken |= {n.name for n in region}
        last = max(region, key=lambda n: order[n.name])
        replaced[last.name] = _norm_nodes(graph, last.name, x, axis, y, gamma, beta, eps,
                                          values, origin)
        dropped |= {n.name for n in region} - {last.name}
    if not replaced:
        return graph
    nodes = [m for n in graph.nodes if n.name not in dropped for m in replaced.get(n.name, [n])]
    return prune_values(graph, nodes, values, origin)


def _norm_nodes(graph: Graph, base: str, x: str, axis: int, y: str, gamma, beta, eps: float,
                values: dict, origin: dict) -> list[Node]:
    shape = graph.type_of(x).shape
    dtype = graph.type_of(x).dtype

    def const(name: str, array) -> str:
        values[name] = Value.constant(name, np.asarray(array, dtype))
        return name

    params = (const(f"{base}/gamma", gamma), const(f"{base}/beta", beta))
    attrs = {"axis": -1, "epsilon": eps}
    if axis == len(shape) - 1:
        return [Node(LAYER_NORMALIZATION.name, f"{base}/layer_norm", (x, *params), (y,), attrs)]
    perm = [i for i in range(len(shape)) if i != axis] + [axis]
    back = [perm.index(i) for i in range(len(shape))]
    moved = tuple(shape[i] for i in perm)
    into, normed = f"{base}/to_last", f"{base}/normalized"
    values[into] = Value(into, Type(dtype, moved))
    values[normed] = Value(normed, Type(dtype, moved))
    # Their values are x's and y's, moved: the profile's ranges of x and y are theirs.
    origin[into], origin[normed] = graph.origin.get(x, x), graph.origin.get(y, y)
    return [Node(TRANSPOSE.name, f"{base}/to_last", (x,), (into,), {"perm": perm}),
            Node(LAYER_NORMALIZATION.name, f"{base}/layer_norm", (into, *params), (normed,),
                 attrs),
            Node(TRANSPOSE.name, f"{base}/back", (normed,), (y,), {"perm": back})]


def _reduced_axis(graph: Graph, node: Node) -> int | None:
    """The one axis a ReduceSum or ReduceMean reduces, or None."""
    if node.op not in (REDUCE_SUM.name, REDUCE_MEAN.name):
        return None
    given = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    axes = graph.values[given].const if given else node.attrs.get("axes")
    if axes is None or np.size(axes) != 1:
        return None
    return int(np.asarray(axes).reshape(-1)[0]) % graph.type_of(node.inputs[0]).rank


def _ancestors(producers: dict, start: str, depth: int) -> list[Node]:
    seen, frontier, found = set(), [start], []
    for _ in range(depth):
        nxt = []
        for name in frontier:
            node = producers.get(name)
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            found.append(node)
            nxt += [i for i in node.inputs if i]
        frontier = nxt
    return found


def _descendants(users: dict, start: Node, depth: int) -> list[Node]:
    seen, frontier, found = {start.name}, [start], []
    for _ in range(depth):
        nxt = []
        for node in frontier:
            for reader in users.get(node.outputs[0], ()):
                if reader.name not in seen:
                    seen.add(reader.name)
                    found.append(reader)
                    nxt.append(reader)
        frontier = nxt
    return found


def _region(graph: Graph, producers: dict, users: dict, x: str, y: str) -> list[Node] | None:
    """The nodes on paths from x to y, when every other input they read is a constant and
    nothing outside them reads their values (but y); None otherwise."""
    region: dict[str, Node] = {}
    pending = [y]
    while pending:
        name = pending.pop()
        if name == x:
            continue
        node = producers.get(name)
        if node is None:
            return None  # another model input
        if node.name in region:
            continue
        region[node.name] = node
        for i in node.inputs:
            if i and not graph.values[i].is_const:
                pending.append(i)
        if len(region) > 4 * REACH:
            return None
    inner = {out for node in region.values() for out in node.outputs} - {y}
    names = set(region)
    for name in inner:
        if name in graph.outputs or any(u.name not in names for u in users.get(name, ())):
            return None
    return list(region.values())


def _epsilon(graph: Graph, producers: dict, root: Node) -> float:
    """The constant added under the root (through moves of elements), or 0."""
    name = root.inputs[0]
    while name in producers:
        node = producers[name]
        if node.op == ADD.name:
            for i in node.inputs:
                value = graph.values[i]
                if value.is_const and value.const.size == 1:
                    return float(np.asarray(value.const).reshape(-1)[0])
            return 0.0
        if OPS[node.op].view is not ViewKind.RESHAPE and node.op != EXPAND.name:
            return 0.0
        name = node.inputs[0]
    return 0.0


def _layer_norm(x: np.ndarray, axis: int, gamma, beta, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * _along(gamma, x.ndim, axis) + \
        _along(beta, x.ndim, axis)


def _along(v, ndim: int, axis: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = -1
    return np.asarray(v, np.float64).reshape(shape)


def _fit(graph: Graph, x: str, y: str, region: list[Node], axis: int, eps: float):
    """(gamma, beta) when the region computes LayerNorm(x) over `axis`, else None."""
    shape = graph.type_of(x).shape
    order = {node.name: i for i, node in enumerate(graph.nodes)}
    nodes = tuple(sorted(region, key=lambda n: order[n.name]))
    used = {i for n in nodes for i in n.inputs if i} | {o for n in nodes for o in n.outputs}
    sub = graph.replace(inputs=(x,), outputs=(y,), nodes=nodes,
                        values={k: v for k, v in graph.values.items() if k in used})

    def run(array: np.ndarray) -> np.ndarray:
        return evaluate(sub, {x: array.astype(graph.type_of(x).dtype)})[y].astype(np.float64)

    rng = np.random.default_rng(0)
    index = tuple(slice(None) if i == axis else 0 for i in range(len(shape)))
    try:
        beta_full = run(np.ones(shape))
        if beta_full.shape != tuple(shape):
            return None
        beta = beta_full[index]
        z = rng.normal(1.0, 3.0, shape)
        centred = z - z.mean(axis=axis, keepdims=True)
        normed = centred / np.sqrt((centred ** 2).mean(axis=axis, keepdims=True) + eps)
        with np.errstate(divide="ignore", invalid="ignore"):
            slopes = (run(z) - beta_full) / normed
        gamma = np.median(np.moveaxis(slopes, axis, -1).reshape(-1, shape[axis]), axis=0)
        for scale in (1.0, 0.05):
            probe = rng.normal(0.3, scale, shape)
            want = _layer_norm(probe, axis, gamma, beta, eps)
            got = run(probe)
            if not np.all(np.isfinite(got)) or \
                    np.max(np.abs(got - want)) > TOLERANCE * (1 + np.max(np.abs(want))):
                return None
    except Exception:  # a region the reference cannot run alone: not a norm
        return None
    return gamma, beta


def _match(graph: Graph, root: Node, producers: dict, users: dict, order: dict):
    """(x, axis, y, region, gamma, beta, eps) for the norm around square root `root`."""
    candidates = []
    for node in _ancestors(producers, root.inputs[0], REACH):
        axis = _reduced_axis(graph, node)
        if axis is not None:
            candidates.append((node.inputs[0], axis))
    if not candidates:
        return None
    ends = [n for n in _descendants(users, root, REACH)
            if len(n.outputs) == 1 and graph.type_of(n.outputs[0]).dtype == "float32"]
    ends.sort(key=lambda n: -order[n.name])
    eps = _epsilon(graph, producers, root)
    for x, axis in dict.fromkeys(candidates):
        shape = graph.type_of(x).shape
        if graph.type_of(x).dtype != "float32" or graph.values[x].is_const:
            continue
        for end in ends:
            y = end.outputs[0]
            if graph.type_of(y).shape != shape:
                continue
            region = _region(graph, producers, users, x, y)
            if region is None or root not in region:
                continue
            fitted = _fit(graph, x, y, region, axis, eps)
            if fitted is not None:
                return (x, axis, y, region, *fitted, eps)
    return None
