"""Zero padding folded into the Conv or AveragePool that reads it.

Exporters write explicit padding as its own node (PyTorch's ZeroPad2d, TensorFlow's asymmetric
SAME padding, a DB head's pad before a strided convolution). A constant zero Pad of the spatial
axes whose only reader pads its window input anyway (the table's `absorbs_zero_pad`) becomes
that reader's own pads, so it costs nothing: no copy, no host segment. In int8 the reader pads
with the zero point, which is the real value 0, as the Pad did.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS
from compiler.passes.util import prune_values, single_user


def _spatial_zero_pads(graph: Graph, pad: Node) -> list[int] | None:
    """The Pad's widths on the axes after N and C (begins, then ends), when it pads only those,
    by non-negative amounts, with constant zeros; else None."""
    attrs = OPS[pad.op].bind(pad.name, pad.attrs)
    consts = [graph.values[n].const if n else None for n in pad.inputs[1:]]
    consts += [None] * (3 - len(consts))
    pads, value, axes = consts
    given = [bool(n) for n in pad.inputs[1:]] + [False] * (3 - len(pad.inputs[1:]))
    if attrs["mode"] != "constant" or pads is None or any(
            g and c is None for g, c in zip(given, consts)):
        return None
    if value is not None and np.asarray(value).item() != 0:
        return None
    rank = graph.type_of(pad.inputs[0]).rank
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    pads = [int(p) for p in np.atleast_1d(pads)]
    width = {a: (pads[i], pads[i + len(axes)]) for i, a in enumerate(axes)}
    begins = [width.get(a, (0, 0))[0] for a in range(rank)]
    ends = [width.get(a, (0, 0))[1] for a in range(rank)]
    if rank < 3 or any(p < 0 for p in begins + ends) or any(begins[:2] + ends[:2]):
        return None
    return begins[2:] + ends[2:]


def fold_pad(graph: Graph) -> Graph:
    """After this pass no constant zero Pad of the spatial axes feeds, alone, an op that can
    take it into its own pads."""
    users = graph.users()
    replaced: dict[str, Node] = {}
    dropped: set[str] = set()
    for node in graph.nodes:
        if not OPS[node.op].folds_into_consumer or not single_user(graph, node.outputs[0]):
            continue
        (reader,) = users[node.outputs[0]]
        absorb = OPS[reader.op].absorbs_zero_pad
        if absorb is None or reader.inputs[0] != node.outputs[0] or reader.name in replaced:
            continue
        pads = _spatial_zero_pads(graph, node)
        if pads is None:
            continue
        changes = absorb(OPS[reader.op].bind(reader.name, reader.attrs), pads)
        if changes is None:
            continue
        replaced[reader.name] = reader.with_(inputs=(node.inputs[0], *reader.inputs[1:]),
                                             attrs={**reader.attrs, **changes})
        dropped.add(node.name)
    if not replaced:
        return graph
    nodes = [replaced.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    return prune_values(graph, nodes)
