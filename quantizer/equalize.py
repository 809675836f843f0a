"""Cross-layer equalization (Nagel et al., "Data-Free Quantization Through Weight Equalization
and Bias Correction", ICCV 2019), on the ONNX model before it is profiled and quantized.

In a chain Conv1 → f → Conv2 where f is positively homogeneous (f(x / s) = f(x) / s for s > 0:
ReLU, LeakyReLU, or no activation), dividing Conv1's output channel c (its weights and bias)
by s_c and multiplying Conv2's input channel c by s_c leaves the model's function unchanged.
With s_c = sqrt(r1_c / r2_c), r1_c the largest |weight| of Conv1's output channel c and r2_c
that of Conv2's input channel c, both become sqrt(r1_c * r2_c): per-tensor int8 weights then
lose far less on the channels whose range was small beside the tensor's largest (depthwise
convolutions after BatchNorm folding are the known case: one int8 step can exceed a whole
channel). Chains that share a Conv (Conv → depthwise → Conv) are equalized in turns until
the scales settle.

ReLU6 is not homogeneous: its bound would become 6 / s_c per channel. Mode "relu6" does what
the paper does and equalizes through it as through a ReLU, replacing those ReLU6 by ReLU, which
changes the fp32 model where an activation exceeded 6 (ember's accuracy report measures that
against the model as given); mode "exact" leaves ReLU6 chains alone.

The rewrite works on ONNX so that `ember quantize-profile` profiles the equalized model and the
profile's fingerprint names it; `ember compile` and `ember accuracy` apply the same rewrite
before they check the profile. BatchNormalization after a Conv is folded into it first (the
ranges that matter are the folded weights').
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.graph.ops import BATCH_NORMALIZATION, CLIP, CONSTANT, CONV, MIN, OPS, RELU

MODES = ("off", "exact", "relu6")
# Turns over all chains; each turn equalizes every chain once. Stop early once no scale moves
# by more than SETTLED (relative).
MAX_TURNS = 20
SETTLED = 1e-3


def equalize(model: onnx.ModelProto, mode: str = "exact") -> onnx.ModelProto:
    """A copy of `model` with BatchNorms folded into their Convs and every equalizable chain
    equalized (`mode` "exact" or "relu6"; "off" returns the model itself)."""
    if mode == "off":
        return model
    if mode not in MODES:
        raise ValueError(f"equalization mode {mode!r} is unknown; choose one of {MODES}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    weights = _Weights(out.graph)
    _fold_batchnorms(out.graph, weights)
    chains = _chains(out.graph, weights, mode)
    for _ in range(MAX_TURNS):
        moved = max((_equalize_pair(first, second, weights,
                                    bounded=between is not None
                                    and between.op_type == CLIP.name)
                     for first, second, between in chains), default=0.0)
        if moved <= SETTLED:
            break
    for first, _, between in chains:
        scale = weights.scales.get(first.output[0])
        if between is not None and between.op_type == CLIP.name and scale is not None \
                and np.any(scale != 1.0):  # (a chain left as it was keeps its ReLU6)
            _per_channel_bound(out.graph, first, between, weights)
    weights.write()
    return out


def _per_channel_bound(graph: onnx.GraphProto, first: onnx.NodeProto, clip: onnx.NodeProto,
                       weights: _Weights) -> None:
    """ReLU6 after a Conv whose output channels were divided by s: Clip(x, 0, 6) becomes
    Min(Relu(x), 6 / s) with 6 / s per channel, the same function on the scaled values."""
    scale = weights.scales[first.output[0]]
    bound = _fresh(f"{clip.output[0]}/bound", weights)
    shape = (1, -1) + (1,) * (weights.arrays[first.input[1]].ndim - 2)
    weights.uses[bound] = 1
    weights.set(bound, (6.0 / scale).reshape(shape).astype(np.float32))
    relu_out = f"{clip.output[0]}/relu"
    relu = onnx.helper.make_node(RELU.name, [clip.input[0]], [relu_out],
                                 name=f"{clip.output[0]}/relu")
    clip.op_type, clip.name = MIN.name, f"{clip.output[0]}/min"
    del clip.input[:]
    clip.input.extend([relu_out, bound])
    del clip.attribute[:]
    graph.node.insert(list(graph.node).index(clip), relu)


class _Weights:
    """The graph's initializers as float arrays, written back (under the same names) once."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        # Constant nodes' values, read (a Clip's bounds) but never changed.
        self.constants = {node.output[0]: numpy_helper.to_array(a.t) for node in graph.node
                          if node.op_type == CONSTANT.name for a in node.attribute
                          if a.name == "value"}
        self.changed: set[str] = set()
        self.released: set[str] = set()  # initializers a folded BatchNorm no longer reads
        self.scales: dict[str, np.ndarray] = {}  # each first Conv's output divided by these
        self.uses: dict[str, int] = {}
        for node in graph.node:
            for name in node.input:
                self.uses[name] = self.uses.get(name, 0) + 1

    def value(self, name: str) -> np.ndarray | None:
        """A constant input's value: an initializer's or a Constant node's."""
        return self.arrays.get(name, self.constants.get(name)) if name else None

    def own(self, name: str) -> bool:
        """Whether `name` is a float initializer only one node reads (safe to change)."""
        array = self.arrays.get(name)
        return array is not None and array.dtype.kind == "f" and self.uses.get(name) == 1

    def set(self, name: str, array: np.ndarray) -> None:
        self.arrays[name] = array.astype(self.arrays.get(name, array).dtype)
        self.changed.add(name)

    def write(self) -> None:
        kept = [t for t in self.graph.initializer if t.name not in self.changed and
                not (t.name in self.released and self.uses.get(t.name) == 0)]
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept)
        for name in sorted(self.changed):
            if self.uses.get(name):
                self.graph.initializer.append(numpy_helper.from_array(self.arrays[name], name))


def _users(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    return users


def _only_reader(name: str, graph: onnx.GraphProto,
                 users: dict[str, list[onnx.NodeProto]]) -> onnx.NodeProto | None:
    """The one node reading `name`, if exactly one does and it is not a graph output."""
    readers = users.get(name, [])
    if len(readers) != 1 or name in {o.name for o in graph.output}:
        return None
    return readers[0]


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _conv_weights(node: onnx.NodeProto, weights: _Weights) -> bool:
    """A Conv whose weight (and bias, if any) are initializers only it reads."""
    return (node.op_type == CONV.name and node.domain in ("", "ai.onnx") and len(node.input) >= 2
            and weights.own(node.input[1])
            and (len(node.input) < 3 or not node.input[2] or weights.own(node.input[2])))


def _fold_batchnorms(graph: onnx.GraphProto, weights: _Weights) -> None:
    """Conv → BatchNormalization (inference form, its Conv's output read by it alone) becomes
    one Conv writing the BatchNorm's output."""
    users = _users(graph)
    producers = {out: node for node in graph.node for out in node.output}
    removed = []
    for bn in graph.node:
        if bn.op_type != BATCH_NORMALIZATION.name or len(bn.output) != 1 or \
                _attr(bn, "training_mode", 0):
            continue
        conv = producers.get(bn.input[0])
        if conv is None or not _conv_weights(conv, weights) or \
                _only_reader(conv.output[0], graph, users) is not bn or \
                not all(weights.arrays.get(n) is not None for n in bn.input[1:5]):
            continue
        gamma, beta, mean, var = (weights.arrays[n].astype(np.float64) for n in bn.input[1:5])
        factor = gamma / np.sqrt(var + _attr(bn, "epsilon", 1e-5))
        w = weights.arrays[conv.input[1]].astype(np.float64)
        weights.set(conv.input[1], w * factor.reshape((-1,) + (1,) * (w.ndim - 1)))
        bias = weights.arrays[conv.input[2]].astype(np.float64) \
            if len(conv.input) > 2 and conv.input[2] else np.zeros(len(factor))
        bias_name = conv.input[2] if len(conv.input) > 2 and conv.input[2] else \
            _fresh(f"{conv.input[1]}/bias", weights)
        weights.uses[bias_name] = 1
        weights.set(bias_name, (bias - mean) * factor + beta)
        weights.arrays[bias_name] = weights.arrays[bias_name].astype(np.float32)
        if len(conv.input) < 3:
            conv.input.append(bias_name)
        else:
            conv.input[2] = bias_name
        conv.output[0] = bn.output[0]
        for name in bn.input[1:5]:
            weights.uses[name] -= 1
            weights.released.add(name)
        removed.append(bn)
    for bn in removed:
        graph.node.remove(bn)


def _fresh(base: str, weights: _Weights) -> str:
    name, k = base, 1
    while name in weights.arrays or name in weights.uses:
        name, k = f"{base}{k}", k + 1
    return name


def _homogeneous(node: onnx.NodeProto, weights: _Weights, mode: str) -> bool:
    """Whether `node` commutes with a positive per-channel scale (f(x / s) = f(x) / s), or, in
    mode relu6, is a ReLU6 that equalization will turn into a ReLU."""
    row = OPS.get(node.op_type)
    if row is not None and row.scale_invariant and node.domain in ("", "ai.onnx"):
        return True
    if node.op_type != CLIP.name or mode != "relu6":
        return False
    bounds = [weights.value(n) for n in node.input[1:3]]
    low = bounds[0] if bounds else _attr(node, "min", None)
    high = bounds[1] if len(bounds) > 1 else _attr(node, "max", None)
    return low is not None and high is not None and float(np.asarray(low)) == 0.0 \
        and float(np.asarray(high)) == 6.0


def _chains(graph: onnx.GraphProto, weights: _Weights, mode: str
            ) -> list[tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto | None]]:
    """(Conv1, Conv2, the activation between or None) for every equalizable pair."""
    users = _users(graph)
    chains = []
    for first in graph.node:
        if not _conv_weights(first, weights):
            continue
        between = _only_reader(first.output[0], graph, users)
        if between is None:
            continue
        second = between
        if between.op_type != CONV.name:
            if not _homogeneous(between, weights, mode):
                continue
            second = _only_reader(between.output[0], graph, users)
            if second is None:
                continue
        else:
            between = None
        if not _conv_weights(second, weights) or second.input[0] != \
                (between.output[0] if between is not None else first.output[0]):
            continue
        channels = weights.arrays[first.input[1]].shape[0]
        w2 = weights.arrays[second.input[1]]
        group = _attr(second, "group", 1)
        if group == 1 and w2.shape[1] == channels or \
                group == channels and w2.shape[1] == 1 and w2.shape[0] % channels == 0:
            chains.append((first, second, between))
    return chains


def _equalize_pair(first: onnx.NodeProto, second: onnx.NodeProto, weights: _Weights,
                   bounded: bool = False) -> float:
    """Equalize one chain's channel ranges; the largest relative change of a scale. With
    `bounded` (a ReLU6 between), a channel is only ever divided (s >= 1 overall), so its
    bound 6 / s stays at or below 6 and the activation's range does not grow."""
    w1 = weights.arrays[first.input[1]].astype(np.float64)
    w2 = weights.arrays[second.input[1]].astype(np.float64)
    channels = w1.shape[0]
    r1 = np.abs(w1).reshape(channels, -1).max(axis=1)
    depthwise = _attr(second, "group", 1) != 1
    if depthwise:  # output channels c*m .. c*m+m-1 read input channel c
        r2 = np.abs(w2).reshape(channels, -1).max(axis=1)
    else:
        r2 = np.abs(np.moveaxis(w2, 1, 0)).reshape(channels, -1).max(axis=1)
    usable = (r1 > 0) & (r2 > 0)
    s = np.ones(channels)
    s[usable] = np.sqrt(r1[usable] / r2[usable])
    if bounded:
        s = np.maximum(s, 1.0 / weights.scales.get(first.output[0], 1.0))
    shape1 = (-1,) + (1,) * (w1.ndim - 1)
    weights.scales[first.output[0]] = weights.scales.get(first.output[0], 1.0) * s
    weights.set(first.input[1], w1 / s.reshape(shape1))
    if len(first.input) > 2 and first.input[2]:
        weights.set(first.input[2], weights.arrays[first.input[2]].astype(np.float64) / s)
    if depthwise:
        weights.set(second.input[1], w2 * np.repeat(s, w2.shape[0] // channels).reshape(
            (-1,) + (1,) * (w2.ndim - 1)))
    else:
        weights.set(second.input[1], w2 * s.reshape((1, -1) + (1,) * (w2.ndim - 2)))
    return float(np.max(np.abs(s - 1.0)))
