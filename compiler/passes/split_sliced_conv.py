"""A convolution whose output only Slices read becomes one convolution per slice, each computing
just its slice: of the channels (the weight's rows) or of the last spatial axis (the input's
window, where that axis has no padding). silero-vad's STFT computes the real and the imaginary
parts as the two halves of one Conv's channels and drops its first frame; the magnitude reads
each part apart. Apart, each part is a whole tensor of its own: its own scale, and an int16
value the vector unit can read as two planes (a strided part of another buffer cannot be one).
No MAC is added.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import CONV, SLICE
from compiler.passes.util import prune_values


def split_sliced_conv(graph: Graph) -> Graph:
    """After this pass no Conv by a constant weight is read only by unit-step Slices of one
    axis each: its channels, or its last spatial axis where the Conv has no padding."""
    while True:
        changed = _split_once(graph)
        if changed is graph:
            return graph
        graph = changed


def _split_once(graph: Graph) -> Graph:
    users = graph.users()
    for conv in graph.nodes:
        parts = _slices(graph, conv, users)
        if parts is None:
            continue
        values: dict[str, Value] = {}
        replaced: dict[str, list[Node]] = {}
        for k, (reader, axis, start, end) in enumerate(parts):
            replaced[reader.name] = _part(graph, conv, reader, axis, start, end,
                                          f"{conv.name}/part{k}", values)
        nodes = [m for n in graph.nodes if n is not conv for m in replaced.get(n.name, [n])]
        return prune_values(graph, nodes, values)
    return graph


def _const(values: dict, name: str, array) -> str:
    values[name] = Value.constant(name, array)
    return name


def _part(graph: Graph, conv: Node, reader: Node, axis: int, start: int, end: int, name: str,
          values: dict) -> list[Node]:
    """The nodes computing `reader`'s slice: the Conv on its rows of the weight, or on the
    input window its frames read."""
    weight = graph.values[conv.inputs[1]].const
    if axis == 1:
        inputs = [conv.inputs[0], _const(values, f"{name}/W",
                                         np.ascontiguousarray(weight[start:end]))]
        if len(conv.inputs) > 2 and conv.inputs[2]:
            bias = graph.values[conv.inputs[2]].const
            inputs.append(_const(values, f"{name}/B", np.ascontiguousarray(bias[start:end])))
        return [conv.with_(name=name, inputs=tuple(inputs), outputs=reader.outputs)]
    # The last spatial axis: frames [start, end) read inputs [start s, (end - 1) s + k).
    x = conv.inputs[0]
    stride = (conv.attrs.get("strides") or [1] * (weight.ndim - 2))[-1]
    first, last = start * stride, (end - 1) * stride + weight.shape[-1]
    shape = list(graph.type_of(x).shape)
    shape[-1] = last - first
    window = f"{name}/x"
    values[window] = Value(window, Type(graph.type_of(x).dtype, tuple(shape)))
    bounds = [_const(values, f"{name}/{key}", np.array([v], np.int64))
              for key, v in (("starts", first), ("ends", last), ("axes", len(shape) - 1))]
    return [Node(SLICE.name, f"{name}/window", (x, *bounds), (window,), {}),
            conv.with_(name=name, inputs=(window, *conv.inputs[1:]), outputs=reader.outputs)]


def _slices(graph: Graph, conv: Node, users: dict):
    """[(the Slice, its axis, start, end)] when only unit-step Slices of one axis each read the
    output of `conv` (a Conv by a constant weight, one group), each a proper part: of the
    channel axis, or of the last spatial axis when the Conv neither pads nor dilates it;
    else None."""
    if conv.op != CONV.name or not graph.values[conv.inputs[1]].is_const or \
            conv.attrs.get("group", 1) != 1 or conv.outputs[0] in graph.outputs or \
            conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    if len(conv.inputs) > 2 and conv.inputs[2] and not graph.values[conv.inputs[2]].is_const:
        return None
    out_shape = graph.type_of(conv.outputs[0]).shape
    rank = len(out_shape)
    pads = conv.attrs.get("pads") or [0] * (2 * (rank - 2))
    dilations = conv.attrs.get("dilations") or [1] * (rank - 2)
    last_ok = pads[rank - 3] == 0 and pads[-1] == 0 and dilations[-1] == 1
    found = []
    for reader in users.get(conv.outputs[0], []):
        if reader.op != SLICE.name or reader.inputs[0] != conv.outputs[0]:
            return None
        consts = [graph.values[n].const if n else None for n in reader.inputs[1:5]]
        starts, ends, axes, steps = consts + [None] * (4 - len(consts))
        if starts is None or ends is None or np.size(starts) != 1 or \
                (steps is not None and int(np.reshape(steps, -1)[0]) != 1):
            return None
        axis = int(np.reshape(axes, -1)[0]) % rank if axes is not None else 0
        if axis != 1 and not (axis == rank - 1 and last_ok):
            return None
        size = out_shape[axis]
        start, end = (int(np.reshape(v, -1)[0]) for v in (starts, ends))
        start, end = (v + size if v < 0 else v for v in (start, end))
        start, end = max(0, min(start, size)), max(0, min(end, size))
        if end <= start or (start, end) == (0, size):
            return None
        found.append((reader, axis, start, end))
    return found or None
