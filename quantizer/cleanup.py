"""Glow-style cleanup of the Rescales the quantizer inserted, applied to a fixed point.

Rules, each a local rewrite (y is the Rescale's output, x its input):
    Rescale(x) where x and y have the same type        -> x
    Rescale(Rescale(x))                                -> Rescale(x)
    Rescale(P(...)) where P requantizes (Conv, Add...) -> P(...) writing y's type directly
    Rescale(QuantizeLinear(x))                         -> QuantizeLinear(x) at y's scale
The two folds apply only when the inner value has no other reader and is not a graph output;
the folded producer keeps its own output name (an ONNX name), retyped, and keeps the clamp that
its old type's range implied (a fused ReLU may be only that). Removing a rounding moves a code
by at most one; a folded QuantizeLinear no longer clips to its old range.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph, Node, QuantParams, Type, Value
from compiler.graph.ops import OPS
from quantizer.requant import add_ratios, ratio
from simulator import numerics
from simulator.numerics import RANGES


def cleanup(graph: Graph) -> Graph:
    """After this pass no Rescale is an identity, follows a Rescale, or follows a requantizing
    node or QuantizeLinear whose output it alone reads."""
    while True:
        rewritten = _rewrite_one(graph)
        if rewritten is None:
            return graph
        graph = rewritten


def _rewrite_one(graph: Graph) -> Graph | None:
    users = graph.users()
    producers = graph.producers()
    for node in graph.nodes:
        if OPS[node.op].quant is not Quant.RESCALE:
            continue
        x, y = node.inputs[0], node.outputs[0]
        t_in, t_out = graph.type_of(x), graph.type_of(y)
        full = tuple(RANGES[t_out.dtype])
        if (t_in.quant == t_out.quant and t_in.dtype == t_out.dtype
                and tuple(node.attrs.get("qclamp") or full) == full):
            return _replace(graph, node, [], {y: x})
        producer = producers.get(x)
        if producer is None or x in graph.outputs or len(users.get(x, [])) != 1:
            continue
        kind = OPS[producer.op].quant
        if kind is Quant.RESCALE:
            return _replace(graph, producer, [_merged(graph, producer, node)], {}, drop=node)
        if kind is not None and kind.requantizes and "table_of" not in producer.attrs:
            return _fold_into(graph, producer, node)  # not a table (`int8.tabled`)
        if kind is Quant.QUANTIZE:
            return _fold_into_quantize(graph, producer, node)
    return None


def _merged(graph: Graph, first: Node, second: Node) -> Node:
    """One Rescale from first's input to second's output type."""
    source = graph.type_of(first.inputs[0]).quant
    target = graph.type_of(second.outputs[0]).quant
    m, s = ratio(source.scale[0] / target.scale[0], f"node {second.name!r} ({second.op})")
    dtype = graph.type_of(second.outputs[0]).dtype
    clamp = _intersect(_translate(first.attrs.get("qclamp"), graph.type_of(first.outputs[0]),
                                  target, dtype), second.attrs.get("qclamp"), dtype)
    attrs = {**second.attrs, "x_zero_point": source.zero_point[0], "multiplier": (m,),
             "shift": (s,), "qclamp": clamp}
    return second.with_(inputs=first.inputs, attrs=attrs)


def _fold_into(graph: Graph, producer: Node, rescale: Node) -> Graph:
    x, y = rescale.inputs[0], rescale.outputs[0]
    old, new = graph.type_of(x).quant, graph.type_of(y).quant
    factor = old.scale[0] / new.scale[0]
    where = f"node {producer.name!r} ({producer.op})"
    multipliers, shifts = list(producer.attrs["multiplier"]), list(producer.attrs["shift"])
    if OPS[producer.op].quant is Quant.ADD and any(
            graph.type_of(n).dtype == "int16" for n in producer.inputs[:2]):
        # An int16 operand's ADD (`numerics.wide_add`): lanes 0 and 1 scale to the output,
        # at lane 2's shift.
        multipliers, shifts = add_ratios(*(m * 2.0**-(31 + shifts[2]) * factor
                                           for m in multipliers[:2]), where)
    else:
        # Only the entries that scale to the output (ADD's first two rescale its inputs).
        for i in range(len(multipliers))[OPS[producer.op].quant.output_multipliers]:
            real = multipliers[i] * 2.0**-(31 + shifts[i]) * factor
            multipliers[i], shifts[i] = ratio(real, where)
    dtype = graph.type_of(y).dtype
    clamp = _intersect(_translate(producer.attrs.get("qclamp"), graph.type_of(x), new, dtype),
                       rescale.attrs.get("qclamp"), dtype)
    attrs = {**producer.attrs, "multiplier": tuple(multipliers), "shift": tuple(shifts),
             "out_zero_point": new.zero_point[0], "qclamp": clamp}
    retyped = {x: Value(x, Type(dtype, graph.type_of(x).shape, new))}
    return _replace(graph, producer, [producer.with_(attrs=attrs)], {y: x}, drop=rescale,
                    values=retyped)


def _fold_into_quantize(graph: Graph, producer: Node, rescale: Node) -> Graph:
    x, y = rescale.inputs[0], rescale.outputs[0]
    new = graph.type_of(y).quant
    dtype = graph.type_of(y).dtype
    scale_name, zero_name = f"{x}/scale", f"{x}/zero_point"
    values = {
        x: Value(x, Type(dtype, graph.type_of(x).shape, new)),
        scale_name: Value(scale_name, Type("float32", ()), np.float32(new.scale[0])),
        zero_name: Value(zero_name, Type(dtype, ()), np.asarray(new.zero_point[0], dtype)),
    }
    quantize = producer.with_(inputs=(producer.inputs[0], scale_name, zero_name))
    return _replace(graph, producer, [quantize], {y: x}, drop=rescale, values=values)


def _translate(qclamp, t_from: Type, to: QuantParams, dtype: str) -> tuple[int, int]:
    """A clamp in t_from's codes as the nearest codes of `to`.

    The saturation at t_from's own range counts as a clamp too: a ReLU fused into a producer
    whose range starts at 0 is nothing but that saturation, and must survive the retyping.
    """
    src = t_from.quant
    lo, hi = qclamp if qclamp is not None else RANGES[t_from.dtype]
    real = (numerics.dequantize(q, src.scale[0], src.zero_point[0], arithmetic=np.float64)
            for q in (lo, hi))
    new_lo, new_hi = (int(numerics.quantize(r, to.scale[0], to.zero_point[0], dtype=dtype,
                                            arithmetic=np.float64)) for r in real)
    return new_lo, max(new_lo, new_hi)


def _intersect(a, b, dtype: str) -> tuple[int, int]:
    lo, hi = RANGES[dtype]
    for clamp in (a, b):
        if clamp is not None:
            lo, hi = max(lo, clamp[0]), min(hi, clamp[1])
    return lo, max(lo, hi)


def _replace(graph: Graph, old: Node, new: list[Node], renames: dict[str, str],
             drop: Node | None = None, values: dict[str, Value] | None = None) -> Graph:
    """The graph with `old` replaced by `new`, `drop` removed, uses renamed, values pruned."""
    nodes = []
    for node in graph.nodes:
        if node is drop:
            continue
        if node is old:
            nodes.extend(new)
            continue
        inputs = tuple(renames.get(n, n) for n in node.inputs)
        nodes.append(node if inputs == node.inputs else node.with_(inputs=inputs))
    table = {**graph.values, **(values or {})}
    used = set(graph.inputs) | set(graph.outputs)
    for node in nodes:
        used.update(n for n in node.inputs if n)
        used.update(node.outputs)
    kept = {name: value for name, value in table.items() if name in used}
    origin = {k: v for k, v in graph.origin.items() if k in kept}
    return graph.replace(nodes=tuple(nodes), values=kept, origin=origin)
