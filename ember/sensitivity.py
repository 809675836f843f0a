"""Which tensor's quantization the model's output pays for: each quantized tensor left at full
precision, and each alone quantized, in ember's QDQ export run by onnxruntime (as AIMET's
QuantAnalyzer and onnxruntime's qdq_loss_debug do).

The per-layer report's accumulated SQNR says where the error is, not where it comes from: a
tensor late in the graph carries every earlier one's error. Here each tensor is a group: its
integer value and the views that keep its grid (a Reshape or Transpose re-quantizes to the same
codes, so leaving the tensor alone unquantized would change nothing past its view). For each
group, the export with that group's DequantizeLinear nodes reading the float value instead,
clipped to the codes' real range (the tensor kept at full precision in its range, as int16
would keep it: its rounding gone, its saturation and any ReLU its range implies kept), gives
the output SQNR *gained*; the export with every other
group so treated gives the output SQNR with that tensor *alone* quantized. Both against fp32
onnxruntime on the evaluation samples. The export computes each integer kernel in fp32
between its Dequantize and Quantize nodes, so these are estimates of the integer program's
behaviour, good for ranking: keeping the top-ranked tensor at higher precision is the fix
most likely to pay.

A layer's weights are a group of their own (`weights`: the int8 weight and its float values):
switched, their DequantizeLinear gives the float weight instead. Per-channel int8 weights alone
cap some real networks' output near 20 dB (EfficientNet-Lite0's stem: 24 dB by itself), which
no activation raised to int16 recovers; this says which layers' weights to raise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph
from compiler.graph.ops import CLIP, DEQUANTIZE_LINEAR, OPS, QUANTIZE_LINEAR, WHERE
from ember import cluster, ort
from ember.reports.metrics import ErrorStats
from quantizer.qdq import export_qdq


@dataclass(frozen=True)
class Sensitivity:
    alone_sqnr_db: float | None  # the output's SQNR with this tensor alone quantized
    gain_db: float  # the output SQNR gained by keeping this tensor at full precision


def sensitivities(qgraph: Graph, samples: Sequence[Mapping[str, np.ndarray]],
                  references: Sequence[Mapping[str, np.ndarray]],
                  on_group: Callable[[int, int], None] = lambda done, total: None,
                  weights: Mapping[str, np.ndarray] | None = None, alone: bool = True,
                  where: cluster.Where = cluster.Where()
                  ) -> tuple[dict[str, Sensitivity], dict[str, Sensitivity]]:
    """Each quantized tensor's Sensitivity, by its ONNX name, over `samples` against the fp32
    outputs `references` (one mapping of output name to array per sample); and each weight's
    in `weights` (an integer weight of `qgraph` by name -> its float values), by that name;
    without `alone`, the gains only (alone_sqnr_db None: half the runs).
    One onnxruntime session serves every run: each group's DequantizeLinear outputs are
    chosen at run time between the codes and the full-precision value by a boolean input of
    the group's. The runs are shards for `where` (--cluster), each process with its own
    one-thread session, so the figures are the same wherever they run."""
    model = export_qdq(qgraph)
    floats = {node.output[0]: node.input[0] for node in model.graph.node
              if node.op_type == QUANTIZE_LINEAR.name}
    groups = _groups(qgraph, floats)
    weights = {name: np.asarray(w, np.float32) for name, w in (weights or {}).items()
               if name not in groups}
    groups.update({name: {name} for name in weights})
    names = list(groups)
    switched = _constants_dequantized(
        _switchable(model, [groups[name] for name in names], floats, weights))
    inputs = {i.name for i in model.graph.input}
    scoring = _Scoring(switched.SerializeToString(), len(names),
                       [{k: v for k, v in feeds.items() if k in inputs} for feeds in samples],
                       list(references), [o.name for o in model.graph.output])
    everything = frozenset(range(len(names)))
    # Each run: the groups at full precision. The first is none (the base).
    runs = [frozenset()] + [frozenset({k}) for k in range(len(names))]
    if alone:
        runs += [everything - {k} for k in range(len(names))]
    scores: list[float | None] = [None] * len(runs)
    chunk = max(1, min(RUNS_PER_SHARD, len(runs) // (4 * max(1, where.processes))))
    shards = [runs[i:i + chunk] for i in range(0, len(runs), chunk)]
    done = 0
    with cluster.Cluster(where) as running:
        for index, found in running.run(_score_shard, cluster.Shared(scoring), shards):
            scores[index * chunk:index * chunk + len(found)] = found
            done += len(found)
            on_group(min(len(names), done * len(names) // len(runs)), len(names))
    base = scores[0]
    tensors, by_weight = {}, {}
    for k, name in enumerate(names):
        found = tensors if name not in weights else by_weight
        found[name] = Sensitivity(scores[1 + len(names) + k] if alone else None,
                                  scores[1 + k] - base)
    return tensors, by_weight


# Runs (a model run per sample each) in one shard: few enough to spread over the workers.
RUNS_PER_SHARD = 16


@dataclass(frozen=True)
class _Scoring:
    """What every shard needs: the switchable export, its group count, the samples (the
    model's inputs only) and their fp32 outputs, and the outputs compared."""

    model: bytes
    groups: int
    samples: list
    references: list
    outputs: list


def _score_shard(shared: cluster.Shared, runs: list[frozenset]) -> list[float]:
    """The output SQNR of each run (the groups it names at full precision) over every
    sample, in a one-thread session built once per worker."""
    scoring: _Scoring = shared.payload
    session = cluster.cached(shared, "sensitivity session", lambda: ort.session(
        scoring.model, threads=1, name="the QDQ export", optimize=False, prepack=False))
    scores = []
    for full_precision in runs:
        flags = {_flag(k): np.array(k in full_precision) for k in range(scoring.groups)}
        error = ErrorStats()
        for feeds, reference in zip(scoring.samples, scoring.references):
            got = ort.run(session, {**feeds, **flags})
            for name in scoring.outputs:
                error.add(reference[name], got[name])
        scores.append(error.sqnr_db)
    return scores


def _groups(qgraph: Graph, floats: Mapping[str, str]) -> dict[str, set[str]]:
    """ONNX name → the integer values of one quantized tensor: the value its node computes and
    the values of the views (rules that keep the input's parameters) reading it."""
    readers: dict[str, list] = {}
    for node in qgraph.nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node)
    keeps = {node.outputs[0] for node in qgraph.nodes
             if OPS[node.op].quant is Quant.KEEP_PARAMS}
    groups: dict[str, set[str]] = {}
    for name in floats:
        value = qgraph.values.get(name)
        if value is None or value.is_const or name in keeps:
            continue
        members, pending = {name}, [name]
        while pending:
            for node in readers.get(pending.pop(), []):
                if OPS[node.op].quant is Quant.KEEP_PARAMS and node.outputs[0] in floats:
                    members.add(node.outputs[0])
                    pending.append(node.outputs[0])
        groups.setdefault(qgraph.origin.get(name, name), set()).update(members)
    return groups


def _flag(k: int) -> str:
    return f"ember/full_precision/{k}"


def _switchable(model: onnx.ModelProto, groups: list[set[str]], floats: Mapping[str, str],
                weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """`model` with a boolean input per group: when it is true, every DequantizeLinear of the
    group's integer values gives the float value their QuantizeLinear read, clipped to the
    codes' real range instead (those tensors at full precision in their range: their rounding
    gone, their saturation and a ReLU their range implies kept, as int16 would keep them); a
    weight's gives its float values."""
    group_of = {value: k for k, members in enumerate(groups) for value in members}
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    inits = {i.name: i for i in changed.graph.initializer}
    nodes = []
    for node in changed.graph.node:
        k = group_of.get(node.input[0]) if node.op_type == DEQUANTIZE_LINEAR.name else None
        if k is not None and node.input[0] in weights:
            out, full = node.output[0], f"{node.output[0]}/full_precision"
            changed.graph.initializer.append(
                numpy_helper.from_array(weights[node.input[0]], full))
            node.output[0] = f"{out}/coded"
            nodes += [node, helper.make_node(WHERE.name, [_flag(k), full, node.output[0]],
                                             [out])]
            continue
        scale = numpy_helper.to_array(inits[node.input[1]]) if k is not None else None
        if k is None or scale.ndim:  # per-channel parameters: weights, never an activation
            nodes.append(node)
            continue
        zero = numpy_helper.to_array(inits[node.input[2]])
        info = np.iinfo(zero.dtype)
        out = node.output[0]
        bounds = []
        for which, code in (("low", info.min), ("high", info.max)):
            bound = (np.float64(code) - zero.astype(np.float64)) * scale.astype(np.float64)
            bounds.append(f"{out}/full_precision_{which}")
            changed.graph.initializer.append(
                numpy_helper.from_array(np.asarray(bound, np.float32), bounds[-1]))
        coded, full = f"{out}/coded", f"{out}/full_precision"
        node.output[0] = coded
        nodes += [node,
                  helper.make_node(CLIP.name, [floats[node.input[0]], *bounds], [full]),
                  helper.make_node(WHERE.name, [_flag(k), full, coded], [out])]
    del changed.graph.node[:]
    changed.graph.node.extend(nodes)
    for k in range(len(groups)):
        changed.graph.input.append(helper.make_tensor_value_info(_flag(k), TensorProto.BOOL, []))
    return changed



def _constants_dequantized(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each DequantizeLinear of constants replaced by the float constant it
    computes. onnxruntime's constant folding leaves Q/DQ nodes alone, so it dequantized every
    weight on every run: 80% of the time of a CRNN's export (its unrolled LSTM's weights), run
    hundreds of times here. The same float32 arithmetic as the operator, (x - z) * scale with
    the scale along `axis`; run without prepacking (`ort.session`), a constant weight sums
    in the order a computed one did, so the outputs do not change (a test holds them bit for
    bit)."""
    inits = {i.name: i for i in model.graph.initializer}
    nodes, folded = [], []
    for node in model.graph.node:
        if node.op_type != DEQUANTIZE_LINEAR.name or \
                not all(name in inits for name in node.input if name):
            nodes.append(node)
            continue
        x, scale, *zero = (numpy_helper.to_array(inits[name]) for name in node.input if name)
        zero_point = zero[0].astype(np.int64) if zero else np.int64(0)
        if scale.ndim:  # per axis: along `axis` of x
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % x.ndim
            shape = [1] * x.ndim
            shape[axis] = -1
            scale, zero_point = scale.reshape(shape), np.reshape(zero_point, shape) \
                if np.ndim(zero_point) else zero_point
        value = (x.astype(np.int64) - zero_point).astype(np.float32) * scale.astype(np.float32)
        folded.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
    used = {name for node in nodes for name in node.input} | \
        {o.name for o in model.graph.output}
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    del changed.graph.node[:], changed.graph.initializer[:]
    changed.graph.node.extend(nodes)
    changed.graph.initializer.extend(i for i in [*model.graph.initializer, *folded]
                                     if i.name in used)
    return changed
