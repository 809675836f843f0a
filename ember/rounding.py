"""`ember round-weights`: each layer's weight codes chosen for its output on calibration data
(`quantizer.rounding`), written once to a file that `--weight-rounding FILE` reads.

The fp32 model (the quantizer's optimized graph: BatchNorm folded, equalized if asked) runs on
the calibration samples; for every Conv, Gemm and MatMul by a constant weight, the inputs it
reads give H = X X^T (im2col windows for a convolution, per group), and the codes are chosen
at the quantizer's own scales for the same options. Compensation fits the inputs it is shown:
with few samples and many input dimensions (a Gemm of 1,280 inputs read once per image, 8
images) it fits those samples and can raise the error on others. So H is accumulated in two
halves (alternate batches): codes chosen on one half are kept only if they cut the layer's
error on the other, and then chosen again on both; a layer that fails the check keeps its
nearest codes. Layers are taken in chunks whose H fit in `MEMORY_BYTES`, the model run again
for each chunk, so that memory stays bounded on any model.

The file holds, per weight (by its name in the optimized graph): its codes, the scales they
are on, and the sha256 of its float values, so that a file made for another model, or with
other options, is caught (`quantizer.quantize` checks both).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from compiler.backend.progress import Progress, quiet
from compiler.graph.evaluate import evaluate
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, Lower
from compiler.graph.reference import conv_windows
from ember.errors import EmberError
from ember.files import atomic_path
from ember.flow import quantize_model
from profiler import batching
from profiler import format as profile_format
from profiler.model_inputs import input_specs
from profiler.sources import open_data
from profiler.sources.images import ImageOptions
from quantizer.options import QuantOptions
from quantizer.quantize import WEIGHT_QMAX
from quantizer.rounding import (RoundedWeight, compensated_codes, output_error,
                                save_rounding, weight_digest)

MEMORY_BYTES = 512 << 20  # H of the layers accumulated in one run of the model


@dataclass(frozen=True)
class LayerRounding:
    """One weight: its node, the shape of its rounding problem, and the layer's squared output
    error on the calibration inputs with nearest codes and with the chosen ones."""

    weight: str
    node: str
    groups: int
    rows: int
    columns: int
    nearest_error: float
    chosen_error: float
    # whether codes chosen on half the samples also cut the error on the other half (else
    # the layer keeps its nearest codes: too few samples for its inputs' dimensions)
    compensated: bool = True

    @property
    def gain_db(self) -> float:
        """How much smaller the layer's output error is, in dB."""
        if self.chosen_error <= 0:
            return math.inf if self.nearest_error > 0 else 0.0
        return 10 * math.log10(max(self.nearest_error, 1e-300) / self.chosen_error)


@dataclass(frozen=True)
class Rounding:
    layers: tuple[LayerRounding, ...]
    samples: int
    seconds: float


@dataclass(frozen=True)
class _Layer:
    node: Node  # the float graph's node (its attributes as the model gives them)
    weight: str  # the float weight's name in the optimized graph
    x: str  # the float input's name in the optimized graph
    scales: np.ndarray  # per output channel (rows), the quantizer's
    axis: int | None

    def hessian_bytes(self, graph: Graph) -> int:
        """Two halves' H, in float64."""
        groups, _, k = _problem_shape(self.node, graph.values[self.weight].const)
        return 2 * 8 * groups * k * k


def round_weights(model_path: str, profile_path: str, data: str, options: QuantOptions,
                  output: str, input_shapes: Mapping[str, Sequence[int]] | None = None,
                  samples: int | None = None, images: ImageOptions | None = None,
                  progress: Progress = quiet) -> Rounding:
    """Choose every layer's codes on `data` and write them to `output` (see the module
    docstring); the report says, per layer, how much its output error shrank."""
    started = time.perf_counter()
    progress("quantizing", 0, None)
    quantized = quantize_model(model_path, profile_format.load(profile_path),
                               dataclasses.replace(options, weight_rounding=None),
                               input_shapes)
    graph, qgraph = quantized.graph, quantized.qgraph
    layers = _layers(graph, qgraph)
    if not layers:
        raise EmberError(f"{model_path}: no Conv, Gemm or MatMul by a constant weight to round")
    specs = input_specs(quantized.model, {})
    batch = specs[0].fixed_batch or 1
    chunks, chunk, size = [], [], 0
    for layer in layers:
        need = layer.hessian_bytes(graph)
        if chunk and size + need > MEMORY_BYTES:
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(layer)
        size += need
    chunks.append(chunk)
    codes: dict[str, np.ndarray] = {}
    found, seen = [], 0
    for number, chunk in enumerate(chunks):
        hessians: dict[str, np.ndarray] = {}
        tally = batching.Tally()
        source = open_data(data, specs, images)
        for k, feeds in enumerate(batching.stream(source, specs, batch, False, samples, False,
                                                  tally)):
            progress(f"inputs of the layers (pass {number + 1} of {len(chunks)})",
                     tally.samples, samples)
            env = evaluate(graph, feeds, keep_all=True)
            for layer in chunk:  # alternate batches in two halves: one chooses, one checks
                h = _hessian(layer.node, graph.values[layer.weight].const, env[layer.x])
                key = (layer.weight, k % 2)
                hessians[key] = hessians[key] + h if key in hessians else h
        seen = tally.samples
        if seen < 2 * batch:
            raise EmberError(f"--data {data}: {seen} sample(s); rounding needs two batches at "
                             f"least (one to choose the codes on, one to check them)")
        for done, layer in enumerate(chunk):
            progress("rounding weights", len(found) + done, len(layers))
            weight = np.asarray(graph.values[layer.weight].const, np.float64)
            w, s = _as_rows(layer.node, weight, layer.scales, layer.axis)
            choose, check = hessians.pop((layer.weight, 0)), hessians.pop((layer.weight, 1))
            nearest = np.clip(np.rint(w / s), -WEIGHT_QMAX, WEIGHT_QMAX)
            trial = compensated_codes(w, choose, s, WEIGHT_QMAX)
            kept = output_error(w, trial, s, check) < output_error(w, nearest, s, check)
            whole = choose + check
            chosen = compensated_codes(w, whole, s, WEIGHT_QMAX) if kept else nearest
            found.append(LayerRounding(layer.weight, layer.node.name, *w.shape,
                                       output_error(w, nearest, s, whole),
                                       output_error(w, chosen, s, whole), kept))
            codes[layer.weight] = _from_rows(layer.node, chosen, weight.shape)
        del hessians
    _write(output, graph, layers, codes, model_path, seen)
    return Rounding(tuple(found), seen, time.perf_counter() - started)


def _write(output: str, graph: Graph, layers: list[_Layer], codes: dict[str, np.ndarray],
           model_path: str, samples: int) -> None:
    weights = {layer.weight: RoundedWeight(codes[layer.weight], layer.scales, layer.axis,
                                           weight_digest(graph.values[layer.weight].const))
               for layer in layers}
    with atomic_path(output) as tmp, open(tmp, "wb") as handle:
        save_rounding(handle, weights, {"model": Path(model_path).name, "samples": samples})


def _layers(graph: Graph, qgraph: Graph) -> list[_Layer]:
    """The quantizer's int8 weights of Convs, Gemms and MatMuls whose float weight and float
    input the optimized graph holds."""
    found, seen = [], set()
    by_name = {node.name: node for node in graph.nodes}
    for node in qgraph.nodes:
        if OPS[node.op].lower not in (Lower.CONV, Lower.GEMM, Lower.MATMUL) or \
                len(node.inputs) < 2:
            continue
        if OPS[node.op].lower is Lower.GEMM and node.attrs.get("transA", 0):
            continue
        value = qgraph.values[node.inputs[1]]
        quant = value.type.quant
        weight = qgraph.origin.get(value.name, value.name)
        x = qgraph.origin.get(node.inputs[0], node.inputs[0])
        if not value.is_const or quant is None or value.type.dtype != "int8" or \
                weight in seen or weight not in graph.values or \
                graph.values[weight].const is None or x not in graph.values or \
                graph.values[x].is_const:
            continue
        seen.add(weight)
        found.append(_Layer(by_name.get(node.name, node), weight, x,
                            np.asarray(quant.scale, np.float64), quant.axis))
    return found


def _matrix(node: Node) -> bool:
    """A Gemm or MatMul (rows of a matrix), not a convolution."""
    return OPS[node.op].lower in (Lower.GEMM, Lower.MATMUL)


def _transposed(node: Node) -> bool:
    """A Gemm whose weight is stored as outputs x inputs (transB)."""
    return OPS[node.op].lower is Lower.GEMM and bool(node.attrs.get("transB", 0))


def _problem_shape(node: Node, weight: np.ndarray) -> tuple[int, int, int]:
    """(groups, rows per group, columns) of the layer's rounding problem."""
    if _matrix(node):
        rows = weight.shape[0] if _transposed(node) else weight.shape[-1]
        return 1, rows, weight.size // rows
    groups = int(node.attrs.get("group", 1))
    return groups, weight.shape[0] // groups, weight[0].size


def _as_rows(node: Node, weight: np.ndarray, scales: np.ndarray, axis: int | None
             ) -> tuple[np.ndarray, np.ndarray]:
    """The weight as groups x rows x columns (each row one output channel, its columns in the
    order `_hessian` lays out the inputs) and the scales as groups x rows x 1."""
    groups, rows, k = _problem_shape(node, weight)
    if _transposed(node):
        w = weight
    elif _matrix(node):
        w = weight.reshape(-1, weight.shape[-1]).T
    else:
        w = weight.reshape(weight.shape[0], -1)
    s = np.broadcast_to(scales if axis is not None else scales[:1], (groups * rows,))
    return w.reshape(groups, rows, k), s.reshape(groups, rows, 1)


def _from_rows(node: Node, codes: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`_as_rows`'s inverse for the codes."""
    flat = codes.reshape(-1, codes.shape[-1])
    if _transposed(node):
        return flat.reshape(shape)
    if _matrix(node):
        return flat.T.reshape(shape)
    return flat.reshape(shape)


def _hessian(node: Node, weight: np.ndarray, x: np.ndarray) -> np.ndarray:
    """X X^T of one batch's inputs, groups x columns x columns, in float64."""
    columns = _columns(node, weight, x)
    return np.einsum("gkm,glm->gkl", columns, columns, optimize=True)


def _columns(node: Node, weight: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The inputs X each row of `_as_rows` multiplies, groups x columns x positions: the
    layer's output is W X per group (im2col windows for a convolution)."""
    x = np.asarray(x, np.float64)
    if _matrix(node):
        return x.reshape(-1, x.shape[-1]).T[None]
    attrs = OPS[node.op].bind(node.name, node.attrs)
    kernel = tuple(np.shape(weight)[2:])
    win = conv_windows(x, kernel, auto_pad=attrs.get("auto_pad", "NOTSET"),
                       dilations=attrs.get("dilations"), pads=attrs.get("pads"),
                       strides=attrs.get("strides"))  # N, C, *out, *kernel
    n = len(kernel)
    # (C, *kernel, N, *out): the columns in the weight's (channel, tap) order
    windows = win.transpose(1, *range(2 + n, 2 + 2 * n), 0, *range(2, 2 + n))
    groups = int(attrs.get("group", 1))
    return windows.reshape(groups, x.shape[1] // groups * math.prod(kernel), -1)
