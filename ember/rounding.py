"""`ember round-weights`: each layer's weight codes chosen for its output on calibration data
(`quantizer.rounding`), written once to a file that `--weight-rounding FILE` reads.

For every Conv, Gemm and MatMul by a constant weight of the quantizer's optimized graph
(BatchNorm folded, equalized if asked), the codes are chosen at the quantizer's own scales for
the same options, from the inputs the layer reads on the calibration samples (im2col windows for
a convolution, per group). Which inputs (`INPUTS`):

- fp32 (the default): the fp32 model's inputs (H = X X^T); layers are taken in chunks whose H
  fit in `MEMORY_BYTES`, the model run again for each chunk, so that memory stays bounded.
- quantized: the layer's inputs in the quantized model, the layers before it already rounded
  (H~ = X~ X~^T: GPTQ's sequential form).
- matched: the same inputs, and the codes fitted to the fp32 layer's output (|W X - W_q X~|):
  they also correct part of the error the earlier layers left, as far as the calibration
  samples show it.

For the last two, the fp32 graph and the integer reference are replayed side by side, a node
at a time, over all the calibration batches at once (their live activations are held), and
the model is quantized again after each layer whose codes a later layer's inputs depend on.
Measured by `benchmarks/real_models.py --round-weights INPUTS` on 8 calibration and 24
evaluation samples (output SQNR; nearest / fp32 / quantized / matched): EfficientNet-Lite0
17.7 / 23.2 / 23.5 / 26.9 dB, ddddocr 18.2 / 17.3 / 18.7 / 14.9 dB; neither quantized form wins
everywhere, so the default stays fp32.

Compensation fits the inputs it is shown: with few samples and many input dimensions (a Gemm
of 1,280 inputs read once per image, 8 images) it fits those samples and can raise the error
on others. So the inputs' moments are accumulated in two halves (alternate batches): codes
chosen on one half are kept only if they cut the layer's error on the other, and then chosen
again on both; a layer that fails the check keeps its nearest codes.

The file holds, per weight (by its name in the optimized graph): its codes, the scales they
are on, and the sha256 of its float values, so that a file made for another model, or with
other options, is caught (`quantizer.quantize` checks both).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

from compiler.backend.progress import Progress, quiet
from compiler.graph.evaluate import check_feeds, evaluate, run_node
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, Lower, run_fp32
from compiler.graph.reference import conv_windows
from ember.errors import EmberError
from ember.files import atomic_path
from ember.flow import Quantizer
from profiler import batching
from profiler import format as profile_format
from profiler.model_inputs import input_specs
from profiler.sources import open_data
from profiler.sources.images import ImageOptions
from quantizer.options import QuantOptions
from quantizer.quantize import WEIGHT_QMAX
from quantizer.rounding import (Moments, RoundedWeight, compensated_codes, output_error,
                                quantized_codes, quantized_output_error, save_rounding,
                                weight_digest)
from simulator import numerics

MEMORY_BYTES = 512 << 20  # H of the layers accumulated in one run of the model
# What each layer's codes are fitted to (see the module docstring): its inputs in the fp32 model;
# its inputs in the quantized model (the layers before it already rounded, the activations
# quantized); or those, with the fp32 layer's output as the target.
INPUTS = ("fp32", "quantized", "matched")


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
    qnode: str  # the node in the int8 graph
    qx: str  # its input there

    def hessian_bytes(self, graph: Graph) -> int:
        """Two halves' H, in float64."""
        groups, _, k = _problem_shape(self.node, graph.values[self.weight].const)
        return 2 * 8 * groups * k * k


def round_weights(model_path: str, profile_path: str, data: str, options: QuantOptions,
                  output: str, input_shapes: Mapping[str, Sequence[int]] | None = None,
                  samples: int | None = None, images: ImageOptions | None = None,
                  progress: Progress = quiet, inputs: str = "fp32") -> Rounding:
    """Choose every layer's codes on `data` and write them to `output` (see the module
    docstring); `inputs` says what each layer is fitted to (`INPUTS`). The report says, per layer, how much its output error
    shrank."""
    if inputs not in INPUTS:
        raise ValueError(f"inputs {inputs!r}: expected one of {INPUTS}")
    started = time.perf_counter()
    progress("quantizing", 0, None)
    quantizer = Quantizer(model_path, profile_format.load(profile_path), input_shapes,
                          options.equalize)
    nearest_options = dataclasses.replace(options, weight_rounding=None)
    quantized = quantizer(nearest_options)
    graph, qgraph = quantized.graph, quantized.qgraph
    layers = _layers(graph, qgraph)
    if not layers:
        raise EmberError(f"{model_path}: no Conv, Gemm or MatMul by a constant weight to round")
    specs = input_specs(quantized.model, {})
    batch = specs[0].fixed_batch or 1
    read = _Reader(data, specs, batch, samples, images)
    if inputs == "fp32":
        found, codes = _on_fp32_inputs(graph, layers, read, progress)
    else:
        found, codes = _on_quantized_inputs(quantizer, nearest_options, layers, read,
                                            model_path, progress, inputs == "matched")
    _write(output, graph, layers, codes, model_path, read.samples, inputs)
    return Rounding(tuple(found), read.samples, time.perf_counter() - started)


@dataclass
class _Reader:
    """The calibration batches, read again for each pass over them; `samples` is how many a
    pass read."""

    data: str
    specs: list
    batch: int
    limit: int | None
    images: ImageOptions | None
    samples: int = 0

    def __call__(self) -> Iterator[dict[str, np.ndarray]]:
        tally = batching.Tally()
        yield from batching.stream(open_data(self.data, self.specs, self.images), self.specs,
                                   self.batch, False, self.limit, False, tally)
        self.samples = tally.samples
        if self.samples < 2 * self.batch:
            raise EmberError(f"--data {self.data}: {self.samples} sample(s); rounding needs two "
                             f"batches at least (one to choose the codes on, one to check "
                             f"them)")


def _on_fp32_inputs(graph: Graph, layers: list[_Layer], read: _Reader, progress: Progress
                    ) -> tuple[list[LayerRounding], dict[str, np.ndarray]]:
    """Each layer's codes for the fp32 model's inputs: the model runs once per chunk of
    layers whose H fit in `MEMORY_BYTES`."""
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
    found: list[LayerRounding] = []
    for number, chunk in enumerate(chunks):
        hessians: dict[tuple[str, int], np.ndarray] = {}
        for k, feeds in enumerate(read()):
            progress(f"inputs of the layers (pass {number + 1} of {len(chunks)})",
                     k * read.batch, read.limit)
            env = evaluate(graph, feeds, keep_all=True)
            for layer in chunk:  # alternate batches in two halves: one chooses, one checks
                h = _hessian(layer.node, graph.values[layer.weight].const, env[layer.x])
                key = (layer.weight, k % 2)
                hessians[key] = hessians[key] + h if key in hessians else h
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
    return found, codes


def _on_quantized_inputs(quantizer: Quantizer, options: QuantOptions, layers: list[_Layer],
                         read: _Reader, model_path: str, progress: Progress,
                         match_fp32_output: bool
                         ) -> tuple[list[LayerRounding], dict[str, np.ndarray]]:
    """Each layer's codes for its inputs in the quantized model with the layers before it
    already rounded (`quantizer.rounding.quantized_codes`). The fp32 graph and the integer
    reference are replayed side by side over all calibration batches, a node at a time,
    stopping at each layer in the int8 graph's order; once a layer's codes are chosen, the
    model is quantized again with them (its bias and folded zero points follow its codes)
    before any node reads them."""
    graph = quantizer.graph
    batches = list(read())
    fp32 = _Replay(graph, batches, _run_fp32, {layer.x for layer in layers})
    int8 = _Replay(quantizer(options).qgraph, batches, run_node,
                   {layer.qx for layer in layers})
    codes: dict[str, np.ndarray] = {}
    found: list[LayerRounding] = []
    pending: set[str] = set()  # layers whose codes the int8 graph does not hold yet
    with tempfile.TemporaryDirectory() as folder:
        for done, layer in enumerate(layers):
            progress("rounding weights on the quantized model's inputs", done, len(layers))
            if pending & int8.ancestors(layer.qx):
                int8.swap(_requantized(quantizer, options, graph, layers, codes, model_path,
                                          f"{folder}/so-far.npz"))
                pending.clear()
            weight = np.asarray(graph.values[layer.weight].const, np.float64)
            halves: list[Moments | None] = [None, None]
            for k, (x, qx) in enumerate(zip(fp32.value(layer.x), int8.value(layer.qx))):
                moments = _moments(layer, weight, x, _real(int8.graph, layer.qx, qx))
                halves[k % 2] = moments if halves[k % 2] is None else halves[k % 2] + moments
            fp32.release(layer.x)
            int8.release(layer.qx)
            w, s = _as_rows(layer.node, weight, layer.scales, layer.axis)
            choose, check = halves
            nearest = np.clip(np.rint(w / s), -WEIGHT_QMAX, WEIGHT_QMAX)
            trial = quantized_codes(w, choose, s, WEIGHT_QMAX, match_fp32_output)
            kept = quantized_output_error(w, trial, s, check) < \
                quantized_output_error(w, nearest, s, check)
            whole = choose + check
            chosen = quantized_codes(w, whole, s, WEIGHT_QMAX, match_fp32_output) if kept \
                else nearest
            found.append(LayerRounding(layer.weight, layer.node.name, *w.shape,
                                       quantized_output_error(w, nearest, s, whole),
                                       quantized_output_error(w, chosen, s, whole), kept))
            codes[layer.weight] = _from_rows(layer.node, chosen, weight.shape)
            pending.add(layer.qnode)
    return found, codes


def _requantized(quantizer: Quantizer, options: QuantOptions, graph: Graph,
                 layers: list[_Layer], codes: dict[str, np.ndarray], model_path: str,
                 path: str) -> Graph:
    """The int8 graph with the codes chosen so far, through the quantizer's own reading of a
    rounding file (so that everything the codes decide, the bias too, is what a compile with
    the finished file makes)."""
    _write(path, graph, [layer for layer in layers if layer.weight in codes], codes,
           model_path, 0, "so far")
    with warnings.catch_warnings():  # the first quantization said them already
        warnings.simplefilter("ignore")
        return quantizer(dataclasses.replace(options, weight_rounding=path)).qgraph


def _run_fp32(graph: Graph, node: Node, args: list) -> tuple[np.ndarray, ...]:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return run_fp32(node, args)


class _Replay:
    """A graph run over a list of batches a node at a time, only as far as the values asked
    for need; a value is dropped once every node reading it has run, unless it is pinned (a
    layer's input, kept until `release`). `graph` may be replaced by one of the same nodes
    (a quantization with other weight codes): the nodes already run keep their results."""

    def __init__(self, graph: Graph, batches: list[dict[str, np.ndarray]], step,
                 pinned: set[str]):
        self.graph = graph
        self.step = step
        self.pinned = set(pinned)
        self.envs = [dict(check_feeds(graph, feeds)) for feeds in batches]
        self.ran: set[str] = set()
        self.producer = {out: node for node in graph.nodes for out in node.outputs}
        self.readers: dict[str, int] = {}
        for node in graph.nodes:
            for name in node.inputs:
                if name:
                    self.readers[name] = self.readers.get(name, 0) + 1

    def swap(self, graph: Graph) -> None:
        """Run the remaining nodes from `graph`, the same nodes with other constants."""
        if [node.name for node in graph.nodes] != [node.name for node in self.graph.nodes]:
            raise EmberError("the model quantized again with the chosen codes has other nodes")
        self.graph = graph

    def ancestors(self, name: str) -> set[str]:
        """The nodes not yet run that `name` needs."""
        needed, stack = set(), [name]
        while stack:
            node = self.producer.get(stack.pop())
            if node is None or node.name in self.ran or node.name in needed:
                continue
            needed.add(node.name)
            stack.extend(name for name in node.inputs if name)
        return needed

    def value(self, name: str) -> list[np.ndarray]:
        """`name` in every batch, running what it needs first."""
        needed = self.ancestors(name)
        for node in self.graph.nodes:
            if node.name in needed:
                self._run(node)
        return [env[name] if name in env else self.graph.values[name].const
                for env in self.envs]

    def release(self, name: str) -> None:
        self.pinned.discard(name)
        if self.readers.get(name, 0) == 0:
            for env in self.envs:
                env.pop(name, None)

    def _run(self, node: Node) -> None:
        values = self.graph.values
        for env in self.envs:
            args = [None if not name else env[name] if name in env else values[name].const
                    for name in node.inputs]
            env.update(zip(node.outputs, self.step(self.graph, node, args)))
        self.ran.add(node.name)
        for name in node.inputs:
            if not name:
                continue
            self.readers[name] -= 1
            if self.readers[name] == 0 and name not in self.pinned:
                for env in self.envs:
                    env.pop(name, None)


def _moments(layer: _Layer, weight: np.ndarray, x: np.ndarray, quantized_x: np.ndarray
             ) -> Moments:
    """One batch's H~, C and H (`quantizer.rounding.Moments`)."""
    fp32 = _columns(layer.node, weight, x)
    quantized = _columns(layer.node, weight, quantized_x)
    return Moments(np.einsum("gkm,glm->gkl", quantized, quantized, optimize=True),
                   np.einsum("gkm,glm->gkl", quantized, fp32, optimize=True),
                   np.einsum("gkm,glm->gkl", fp32, fp32, optimize=True))


def _real(qgraph: Graph, name: str, codes: np.ndarray) -> np.ndarray:
    """A value of the int8 graph as the real numbers its codes stand for."""
    quant = qgraph.values[name].type.quant
    if quant is None:
        return np.asarray(codes, np.float64)
    return numerics.dequantize(codes, quant.scale if quant.axis is not None else
                               quant.scale[0], quant.zero_point if quant.axis is not None
                               else quant.zero_point[0], axis=quant.axis,
                               arithmetic=np.float64)


def _write(output: str, graph: Graph, layers: list[_Layer], codes: dict[str, np.ndarray],
           model_path: str, samples: int, inputs: str) -> None:
    weights = {layer.weight: RoundedWeight(codes[layer.weight], layer.scales, layer.axis,
                                           weight_digest(graph.values[layer.weight].const))
               for layer in layers}
    with atomic_path(output) as tmp, open(tmp, "wb") as handle:
        save_rounding(handle, weights, {"model": Path(model_path).name, "samples": samples,
                                          "inputs": inputs})


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
        # The float node's own input: the origin of its int8 input may be a value before a
        # view (silero-vad's 1-D STFT Conv reads its window through a Reshape to 2-D).
        x = by_name[node.name].inputs[0] if node.name in by_name else \
            qgraph.origin.get(node.inputs[0], node.inputs[0])
        if not value.is_const or quant is None or value.type.dtype != "int8" or \
                weight in seen or weight not in graph.values or \
                graph.values[weight].const is None or x not in graph.values or \
                graph.values[x].is_const:
            continue
        seen.add(weight)
        found.append(_Layer(by_name.get(node.name, node), weight, x,
                            np.asarray(quant.scale, np.float64), quant.axis, node.name,
                            node.inputs[0]))
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
