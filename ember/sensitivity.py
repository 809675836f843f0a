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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime
from onnx import numpy_helper

from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph
from compiler.graph.ops import CLIP, DEQUANTIZE_LINEAR, OPS, QUANTIZE_LINEAR
from quantizer.qdq import export_qdq


@dataclass(frozen=True)
class Sensitivity:
    alone_sqnr_db: float  # the output's SQNR with this tensor alone quantized
    gain_db: float  # the output SQNR gained by keeping this tensor at full precision


def sensitivities(qgraph: Graph, samples: Sequence[Mapping[str, np.ndarray]],
                  references: Sequence[Mapping[str, np.ndarray]],
                  on_group: Callable[[int, int], None] = lambda done, total: None
                  ) -> dict[str, Sensitivity]:
    """Each quantized tensor's Sensitivity, by its ONNX name, over `samples` against the fp32
    outputs `references` (one mapping of output name to array per sample)."""
    model = export_qdq(qgraph)
    floats = {node.output[0]: node.input[0] for node in model.graph.node
              if node.op_type == QUANTIZE_LINEAR.name}
    groups = _groups(qgraph, floats)
    inputs = [i.name for i in model.graph.input]

    def score(full_precision: set[str]) -> float:
        session = _session(_without_quantization(model, full_precision, floats))
        signal = noise = 0.0
        for feeds, reference in zip(samples, references):
            outputs = session.run(None, {k: v for k, v in feeds.items() if k in inputs})
            for name, got in zip([o.name for o in model.graph.output], outputs):
                want = np.asarray(reference[name], np.float64)
                got = np.asarray(got, np.float64)
                signal += float((want ** 2).sum())
                noise += float(((want - got) ** 2).sum())
        return 10 * np.log10(max(signal, 1e-30) / max(noise, 1e-30))

    everything = set().union(*groups.values()) if groups else set()
    base = score(set())
    found = {}
    for k, (name, members) in enumerate(groups.items()):
        found[name] = Sensitivity(score(everything - members), score(members) - base)
        on_group(k + 1, len(groups))
    return found


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


def _without_quantization(model: onnx.ModelProto, values: set[str],
                          floats: Mapping[str, str]) -> onnx.ModelProto:
    """`model` with every DequantizeLinear of the integer `values` a Clip of the float value
    their QuantizeLinear read to the codes' real range: those tensors at full precision in
    their range (their rounding gone, their saturation and a ReLU their range implies kept),
    as an int16 value of the same range would be."""
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    inits = {i.name: i for i in changed.graph.initializer}
    for node in changed.graph.node:
        if node.op_type == DEQUANTIZE_LINEAR.name and node.input[0] in values:
            scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
            zero = numpy_helper.to_array(inits[node.input[2]])
            if scale.ndim:  # per-channel parameters: weights only, never an activation
                continue
            info = np.iinfo(zero.dtype)
            bounds = [(np.float64(code) - zero.astype(np.float64)) * scale
                      for code in (info.min, info.max)]
            names = []
            for which, bound in zip(("low", "high"), bounds):
                name = f"{node.output[0]}/full_precision_{which}"
                changed.graph.initializer.append(
                    numpy_helper.from_array(np.asarray(bound, np.float32), name))
                names.append(name)
            source = floats[node.input[0]]
            node.op_type = CLIP.name
            del node.input[:]
            node.input.extend([source, *names])
            del node.attribute[:]
    return changed


def _session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    # No fusion into integer kernels: the export's fp32 arithmetic as written.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])
