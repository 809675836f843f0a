"""Smoothing a LayerNorm's outlier channels into the Gemms that read it (SmoothQuant, Xiao et
al., ICML 2023, for the norm's own affine).

A trained transformer's LayerNorm output carries a few channels twenty times larger than the
rest; one int8 step fitted to them leaves the others a handful of steps, and every projection
that reads the output (attention's Q, K and V, the feed-forward's first layer) loses them. The
norm's gamma and beta are per channel, and so are the rows of the weights that read it: with
y' = y / f (gamma / f, beta / f) and W' = diag(f) W, every product is the same in real numbers,
while y' has its channels' ranges evened out (f_k = sqrt(max|y_k| / max_n |W_kn|): half the
spread moves into the weights, which are quantized per output channel). The profile records
each LayerNorm output's range per channel (`TensorStats.channel_min`), so the quantizer
measures the spread: a norm whose largest channel is under `MIN_SPREAD` times its median one
stays as it is.

Only a norm whose every reader is such a Gemm or MatMul (through Reshapes that keep the
channel axis) is smoothed: a residual Add reads the int16 copy of `quantizer.wide`, which is
not smoothed. The smoothed values get names of their own (`<name>/smooth`), which no ONNX
tensor has: the per-layer report does not compare y' with y.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from compiler.graph.ir import Graph, Node, Value
from compiler.graph.ops import LAYER_NORMALIZATION, OPS, Lower, ViewKind
from profiler.format import TensorStats

MODES = ("auto", "never")
# The largest channel's range under this many times the median channel's: not smoothed.
MIN_SPREAD = 4.0
# SmoothQuant's migration strength: the share of the spread the weights take.
ALPHA = 0.5


def smoothed_name(name: str) -> str:
    """The name of value (or constant) `name` smoothed: its values are no longer the model's."""
    return f"{name}/smooth"


def smooth_norms(graph: Graph, mode: str, stats_of: Callable[[str], TensorStats | None]
                 ) -> tuple[Graph, dict[str, tuple[float, float]]]:
    """`graph` with each qualifying LayerNorm smoothed into its readers, and the real range
    of each smoothed output (by its new name, `smoothed_name`: the profile has none)."""
    if mode == "never":
        return graph, {}
    users = graph.users()
    nodes = {node.name: node for node in graph.nodes}
    values = dict(graph.values)
    ranges: dict[str, tuple[float, float]] = {}
    for node in graph.nodes:
        if node.op != LAYER_NORMALIZATION.name or len(node.inputs) < 2 or \
                not graph.values[node.inputs[1]].is_const or \
                (len(node.inputs) > 2 and node.inputs[2] and
                 not graph.values[node.inputs[2]].is_const):
            continue
        y = node.outputs[0]
        stats = stats_of(y)
        if y in graph.outputs or stats is None or stats.channel_min is None:
            continue
        chain = _linear_readers(graph, users, y)
        channels = graph.type_of(y).shape[-1]
        if chain is None or stats.channel_min.shape != (channels,):
            continue
        reach = np.maximum(np.abs(stats.channel_min), np.abs(stats.channel_max))
        if reach.max() < MIN_SPREAD * max(float(np.median(reach)), 1e-30):
            continue
        views, readers = chain
        weights = [_weight_rows(graph, reader) for reader in readers]
        w_reach = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
        f = (np.maximum(reach, 1e-12) ** ALPHA /
             np.maximum(w_reach, 1e-12) ** (1 - ALPHA)).astype(np.float64)
        rename = {y: smoothed_name(y), **{v.outputs[0]: smoothed_name(v.outputs[0]) for v in views}}
        for old, new in rename.items():
            values[new] = dataclasses.replace(graph.values[old], name=new)
        gamma = _const(values, smoothed_name(node.inputs[1]),
                       graph.values[node.inputs[1]].const / f)
        inputs = [node.inputs[0], gamma]
        if len(node.inputs) > 2 and node.inputs[2]:
            inputs.append(_const(values, smoothed_name(node.inputs[2]),
                                 graph.values[node.inputs[2]].const / f))
        nodes[node.name] = node.with_(name=smoothed_name(node.name), inputs=tuple(inputs),
                                      outputs=(rename[y],))
        for view in views:
            nodes[view.name] = view.with_(inputs=(rename[view.inputs[0]], *view.inputs[1:]),
                                          outputs=(rename[view.outputs[0]],))
        for reader, rows in zip(readers, weights):
            nodes[reader.name] = _scaled_reader(graph, values, reader, rename, rows * f[:, None])
        low, high = stats.channel_min / f, stats.channel_max / f
        ranges[rename[y]] = (float(low.min()), float(high.max()))
    if not ranges:
        return graph, {}
    return dataclasses.replace(graph, nodes=tuple(nodes[node.name] for node in graph.nodes),
                               values=values), ranges


def _linear_readers(graph: Graph, users: dict, y: str) -> tuple[list[Node], list[Node]] | None:
    """(the Reshapes on the way, the Gemms and MatMuls by a constant weight) that read y
    with its last axis as their reduction axis; None if any other node reads it."""
    channels = graph.type_of(y).shape[-1]
    views, readers, pending = [], [], [y]
    while pending:
        name = pending.pop()
        if name in graph.outputs or not users.get(name):
            return None
        for reader in users[name]:
            row = OPS[reader.op]
            if row.view is ViewKind.RESHAPE and reader.inputs[0] == name and \
                    graph.type_of(reader.outputs[0]).shape[-1:] == (channels,):
                views.append(reader)
                pending.append(reader.outputs[0])
            elif _by_constant(graph, reader, name, channels):
                readers.append(reader)
            else:
                return None
    return views, readers


def _by_constant(graph: Graph, node: Node, x: str, channels: int) -> bool:
    row = OPS[node.op]
    if row.lower not in (Lower.GEMM, Lower.MATMUL) or len(node.inputs) < 2 or \
            node.inputs[0] != x or x in node.inputs[1:]:
        return False
    w = graph.values[node.inputs[1]]
    if not w.is_const or w.const.ndim != 2 or node.attrs.get("transA", 0):
        return False
    rows = w.const.shape[1] if node.attrs.get("transB", 0) else w.const.shape[0]
    return rows == channels


def _weight_rows(graph: Graph, node: Node) -> np.ndarray:
    """The weight with one row per input channel ([K, N])."""
    w = np.asarray(graph.values[node.inputs[1]].const, np.float64)
    return w.T if node.attrs.get("transB", 0) else w


def _scaled_reader(graph: Graph, values: dict, node: Node, rename: dict,
                   rows: np.ndarray) -> Node:
    weight = node.inputs[1]
    dtype = graph.values[weight].const.dtype
    scaled = rows.T if node.attrs.get("transB", 0) else rows
    name = _const(values, smoothed_name(weight), scaled.astype(dtype))
    return node.with_(inputs=(rename.get(node.inputs[0], node.inputs[0]), name,
                              *node.inputs[2:]))


def _const(values: dict, name: str, array: np.ndarray) -> str:
    base, k = name, 1
    while name in values:
        name, k = f"{base}_{k}", k + 1
    values[name] = Value.constant(name, np.asarray(array, np.float32))
    return name
