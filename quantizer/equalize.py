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

Mode "all" also equalizes through any other activation f between the two Convs, one elementwise
function of one value (HardSwish, SiLU, GELU, Sigmoid, as one node or written out in primitive
operators): f becomes Mul(x, s) → f → Mul(·, 1/s), the same function of the scaled values, and
the compiler fuses the three into one 256-entry table per channel (`fuse_channel_map`), so
only the equalized values are rounded to 8 bits. Depthwise-heavy nets with HardSwish
(MobileNetV3, PP-LCNet, PicoDet) are where this pays: a Conv's output channel whose range is
small beside the tensor's, read by a depthwise Conv that amplifies it, loses its signal to one
int8 step of the shared activation scale; equalized, its range is the others'. Into a
depthwise Conv, whose per-channel weights take any scale, mode "all" evens the activation's
channel ranges, estimated from the first Conv's BatchNorm (|beta| + 3 |gamma|), rather than
the weights' (`_spread`): what per-channel activation scales would give.

The rewrite works on ONNX so that `ember quantize-profile` profiles the equalized model and the
profile's fingerprint names it; `ember compile` and `ember accuracy` apply the same rewrite
before they check the profile. BatchNormalization after a Conv is folded into it first (the
ranges that matter are the folded weights').
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.graph.int8 import Quant
from compiler.graph.ops import (BATCH_NORMALIZATION, CLIP, CONSTANT, CONV, GRID, MIN, MUL, OPS,
                                RELU, recognised)

MODES = ("off", "exact", "relu6", "all")
# Mode "all" into a depthwise Conv: no channel is scaled up by more than 1000 (one whose
# estimated range is below a thousandth of the widest's is a dead channel).
ACTIVATION_FLOOR = 1e-3
# An activation written out in primitive operators has at most this many nodes.
MAX_REGION = 12
# The operator kinds an activation between two Convs may be made of: maps of one value.
_ELEMENTWISE = (Quant.LOOKUP, Quant.CLAMP, Quant.ADD, Quant.MUL, Quant.DIVIDE)
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
    _lift_constants(out.graph)
    weights = _Weights(out.graph)
    _fold_batchnorms(out.graph, weights)
    chains = _chains(out.graph, weights, mode)
    for _ in range(MAX_TURNS):
        moved = max((_equalize_pair(chain.first, chain.second, weights, chain.bounded,
                                    _spread(chain, weights, mode))
                     for chain in chains), default=0.0)
        if moved <= SETTLED:
            break
    for chain in chains:
        scale = weights.scales.get(chain.first.output[0])
        if scale is None or not np.any(scale != 1.0):  # (a chain left as it was keeps its f)
            continue
        if chain.bounded:
            _per_channel_bound(out.graph, chain.first, chain.region[0], weights)
        elif chain.tabled:
            _between_scales(out.graph, chain, scale, weights)
    weights.write()
    return out


def chain_count(model: onnx.ModelProto, mode: str) -> int:
    """How many Conv → Conv chains `equalize(model, mode)` would equalize (0: it would only
    fold BatchNorms)."""
    if mode == "off":
        return 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _lift_constants(out.graph)
    weights = _Weights(out.graph)
    _fold_batchnorms(out.graph, weights)
    return len(_chains(out.graph, weights, mode))


def _spread(chain: "_Chain", weights: "_Weights", mode: str) -> np.ndarray | None:
    """In mode "all", a chain into a depthwise Conv whose first Conv had a BatchNorm: the
    ranges of the first's output channels, |beta| + 3 |gamma| (the BatchNorm's output is
    about N(beta, gamma^2): Nagel et al.'s estimate). With per-channel weights (the default)
    a depthwise Conv's weights take any scale per channel, so what is left to equalize is the
    activation between, read in one int8 scale: each channel's range made the widest's
    gives it the steps a scale of its own would (the depthwise Conv reads channel c alone).
    None for any other chain, which equalizes its weights."""
    spread = weights.spreads.get(chain.first.output[0])
    if mode != "all" or chain.bounded or spread is None or \
            _attr(chain.second, "group", 1) == 1 or not np.all(np.isfinite(spread)) or \
            not spread.max() > 0:
        return None
    return spread


@dataclass(frozen=True)
class _Chain:
    """Conv1 → the activation between (its nodes, none for a direct pair; `exit` the value
    Conv2 reads) → Conv2. bounded: a ReLU6, which equalization bounds per channel; tabled: an
    activation that takes Mul(x, s) → f → Mul(·, 1/s) (mode "all")."""

    first: onnx.NodeProto
    second: onnx.NodeProto
    region: tuple[onnx.NodeProto, ...]
    exit: str
    bounded: bool = False
    tabled: bool = False


def _between_scales(graph: onnx.GraphProto, chain: _Chain, scale: np.ndarray,
                    weights: _Weights) -> None:
    """Conv1's output divided by s per channel: the activation between reads it times s and
    its output, divided by s, keeps its name for Conv2 (the profile's name for the equalized
    values)."""
    value = chain.first.output[0]
    shape = (1, -1) + (1,) * (weights.arrays[chain.first.input[1]].ndim - 2)
    up, down = (_fresh(f"{name}/channel_scale", weights) for name in (value, chain.exit))
    for name, factor in ((up, scale), (down, 1.0 / scale)):
        weights.uses[name] = 1
        weights.set(name, factor.reshape(shape).astype(np.float32))
    restored, unscaled = f"{value}/unequalized", f"{chain.exit}/unequalized"
    for node in chain.region:
        for i, name in enumerate(node.input):
            if name == value:
                node.input[i] = restored
        for i, name in enumerate(node.output):
            if name == chain.exit:
                node.output[i] = unscaled
    nodes = list(graph.node)
    last = max(nodes.index(node) for node in chain.region)
    graph.node.insert(last + 1, onnx.helper.make_node(
        MUL.name, [unscaled, down], [chain.exit], name=f"{chain.exit}/equalize"))
    graph.node.insert(min(nodes.index(node) for node in chain.region), onnx.helper.make_node(
        MUL.name, [value, up], [restored], name=f"{value}/unequalize"))


def _lift_constants(graph: onnx.GraphProto) -> None:
    """Constant nodes holding a float tensor (exporters such as paddle2onnx put the weights
    there) become initializers of the same name, which equalization can rescale."""
    lifted = []
    for node in graph.node:
        if node.op_type != CONSTANT.name or node.domain not in ("", "ai.onnx") or \
                len(node.attribute) != 1 or node.attribute[0].name != "value":
            continue
        tensor = onnx.TensorProto()
        tensor.CopyFrom(node.attribute[0].t)
        if tensor.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                                    onnx.TensorProto.FLOAT16):
            continue
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        lifted.append(node)
    for node in lifted:
        graph.node.remove(node)


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
        # A folded BatchNorm's output: each channel's estimated range (`_spread`).
        self.spreads: dict[str, np.ndarray] = {}
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
        weights.spreads[bn.output[0]] = np.abs(beta) + 3 * np.abs(gamma)
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
    return mode in ("relu6", "all") and _relu6(node, weights)


def _relu6(node: onnx.NodeProto, weights: _Weights) -> bool:
    """Whether `node` is a Clip to [0, 6] by constant bounds."""
    if node.op_type != CLIP.name:
        return False
    bounds = [weights.value(n) for n in node.input[1:3]]
    low = bounds[0] if bounds else _attr(node, "min", None)
    high = bounds[1] if len(bounds) > 1 else _attr(node, "max", None)
    return low is not None and high is not None and float(np.asarray(low)) == 0.0 \
        and float(np.asarray(high)) == 6.0


def _chains(graph: onnx.GraphProto, weights: _Weights, mode: str) -> list[_Chain]:
    """Every equalizable Conv → (activation) → Conv chain."""
    users = _users(graph)
    outputs = {o.name for o in graph.output}
    chains = []
    for first in graph.node:
        if not _conv_weights(first, weights):
            continue
        found = _activation(first.output[0], users, outputs, weights)
        if found is None:
            continue
        region, exit = found
        second = _only_reader(exit, graph, users)
        if second is None or not _conv_weights(second, weights) or second.input[0] != exit:
            continue
        one = region[0] if len(region) == 1 else None
        bounded = one is not None and one.op_type == CLIP.name and mode in ("relu6", "all") \
            and _relu6(one, weights)
        tabled = False
        if region and not (one is not None and _homogeneous(one, weights, mode)):
            tabled = mode == "all" and _one_table(region, first.output[0], weights)
            if not tabled:
                continue
        channels = weights.arrays[first.input[1]].shape[0]
        w2 = weights.arrays[second.input[1]]
        group = _attr(second, "group", 1)
        if group == 1 and w2.shape[1] == channels or \
                group == channels and w2.shape[1] == 1 and w2.shape[0] % channels == 0:
            chains.append(_Chain(first, second, region, exit, bounded, tabled))
    return chains


def _activation(value: str, users: dict[str, list[onnx.NodeProto]], outputs: set[str],
                weights: _Weights) -> tuple[tuple[onnx.NodeProto, ...], str] | None:
    """The elementwise nodes computing one value from `value` alone (scalar constants aside)
    before anything else reads it, and that one value: ((), value) when no such node reads
    it; None when the nodes reading it lead to more than one value read elsewhere."""
    region: list[onnx.NodeProto] = []
    inside, exits = {value}, set()
    frontier = [value]
    while frontier:
        name = frontier.pop()
        if name in outputs:
            return None
        for node in users.get(name, []):
            if node in region:
                continue
            if not _elementwise(node, weights):
                exits.add(name)
                continue
            region.append(node)
            if len(region) > MAX_REGION:
                return None
            inside.add(node.output[0])
            frontier.append(node.output[0])
    if len(exits) != 1 or any(n and n not in inside and not _scalar(n, weights)
                              for node in region for n in node.input):
        return None
    exit = exits.pop()
    if any(exit in node.input for node in region) or (region and exit == value):
        return None
    return tuple(region), exit


def _elementwise(node: onnx.NodeProto, weights: _Weights) -> bool:
    """A node of the standard domain mapping values elementwise, its constants scalars."""
    row = OPS.get(node.op_type)
    return row is not None and row.quant in _ELEMENTWISE and len(node.output) == 1 and \
        node.domain in ("", "ai.onnx") and \
        sum(1 for n in node.input if n and weights.value(n) is None) >= 1


def _scalar(name: str, weights: _Weights) -> bool:
    value = weights.value(name)
    return value is not None and np.size(value) == 1


def _one_table(region: tuple[onnx.NodeProto, ...], value: str, weights: _Weights) -> bool:
    """Whether the region computes, from `value`, one of the table operators the compiler
    fuses into one lookup (`fuse_gates`), or is one such node."""
    if len(region) == 1:
        row = OPS[region[0].op_type]
        return row.quant is Quant.LOOKUP and len([n for n in region[0].input if n]) == 1
    env = {value: GRID}
    ordered = _in_order(region)
    with np.errstate(all="ignore"):
        for node in ordered:
            row = OPS[node.op_type]
            args = [env[n] if n in env else weights.value(n) if n else None for n in node.input]
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            try:
                env[node.output[0]] = np.asarray(row.fp32(*args, **row.bind(node.name, attrs)))
            except Exception:  # an attribute ember's table does not know: not a table op
                return False
    got = env.get(ordered[-1].output[0])
    return got is not None and recognised(got) is not None


def _in_order(region: tuple[onnx.NodeProto, ...]) -> list[onnx.NodeProto]:
    """The region's nodes in an order where each comes after the nodes whose outputs it
    reads (the graph's own order is one)."""
    ordered, done = [], set()
    pending = list(region)
    produced = {node.output[0] for node in region}
    while pending:
        for node in pending:
            if all(n not in produced or n in done for n in node.input):
                ordered.append(node)
                done.add(node.output[0])
                pending.remove(node)
                break
        else:
            return list(region)
    return ordered


def _equalize_pair(first: onnx.NodeProto, second: onnx.NodeProto, weights: _Weights,
                   bounded: bool = False, spread: np.ndarray | None = None) -> float:
    """Equalize one chain's channel ranges; the largest relative change of a scale. With
    `bounded` (a ReLU6 between), a channel is only ever divided (s >= 1 overall), so its
    bound 6 / s stays at or below 6 and the activation's range does not grow. With `spread`
    (each channel's estimated range), the activation's ranges are equalized instead of the
    weights'."""
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
    if spread is not None:  # the activation's channels to one range: s in total spread / max
        s = np.maximum(spread / spread.max(), ACTIVATION_FLOOR) / \
            weights.scales.get(first.output[0], 1.0)
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
