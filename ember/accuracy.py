"""Measure int8 against fp32 onnxruntime over an evaluation set: the accuracy report's data.

fp32 comes from onnxruntime (the reference users trust); int8 from the quantizer's integer
reference interpreter, which the compiled program matches bit for bit. Per layer, each
quantized tensor is compared with ember's fp32 interpreter on the same graph (same names,
same BatchNorm folding), which agrees with onnxruntime to ~1e-6.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from compiler.backend.codegen.host import check_segments, run_segment
from compiler.backend.progress import Progress, quiet
from compiler.graph.evaluate import evaluate
from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph, QuantParams
from compiler.graph.ops import OPS
from ember import ort, preprocessing
from ember.errors import EmberError, user_error_types
from ember.flow import CompileOptions, compile_model, quantize_model
from ember.loading import check_array_file
from ember.reports.accuracy import AccuracyReport, LayerAccuracy, OutputAccuracy
from ember.reports.metrics import ErrorStats, Top1, is_classifier
from ember.sensitivity import sensitivities
from profiler import batching
from profiler import format as profile_format
from profiler.model_inputs import input_specs
from profiler.sources import open_data
from profiler.sources.images import ImageOptions
from quantizer.options import QuantOptions
from quantizer.qdq import export_qdq
from quantizer.reference import dequantized, run_int8
from simulator import machine, numerics
from simulator.program import Program
from simulator.stats import Stats


@dataclass(frozen=True)
class Evaluation:
    data: str
    labels: str | None = None
    samples: int | None = None
    per_layer: bool = False
    # With per_layer: each tensor's effect on the output, kept at full precision and alone
    # quantized (`ember.sensitivity`).
    sensitivity: bool = False
    program: str | None = None  # a compiled .ember: also run it and check it bit for bit
    batch: int | None = None  # samples the simulator runs at once (None: `Machine.batch`)
    images: ImageOptions = ImageOptions()  # preprocessing, when `data` is a folder of images


def program_options(program: Program, profile_path: str) -> QuantOptions:
    """The quantizer options a program was compiled with; its profile must be this one."""
    recorded = program.metadata.get("inputs", {}).get("profile_sha256")
    if recorded and recorded != hashlib.sha256(Path(profile_path).read_bytes()).hexdigest():
        raise EmberError(f"{profile_path}: the program was compiled with another profile; give "
                         "the one `ember compile` used")
    try:
        return CompileOptions.from_header(program.metadata.get("options", {})).quant
    except (TypeError, ValueError) as err:  # a forged header: "percentile": "x"
        raise EmberError(f"the program's recorded options are malformed: {err}") from None


def program_input_shapes(program: Program, path: str, given: Mapping[str, Sequence[int]]
                         ) -> dict[str, tuple[int, ...]]:
    """The shapes the program fixed its dynamic inputs at; --input-shape may repeat them,
    not change them."""
    try:
        recorded = dict(CompileOptions.from_header(program.metadata.get("options", {}))
                        .input_shapes)
    except (TypeError, ValueError) as err:
        raise EmberError(f"{path}: the program's recorded options are malformed: {err}") \
            from None
    for name, shape in given.items():
        if name in recorded and tuple(shape) != recorded[name]:
            raise EmberError(f"--input-shape {name}={','.join(map(str, shape))} differs from "
                             f"{path}, compiled for {name}="
                             f"{','.join(map(str, recorded[name]))}; give the program's shape "
                             f"or recompile with yours")
    return {**recorded, **{name: tuple(shape) for name, shape in given.items()}}


def compiles_again_to(program_path: str, model_path: str, profile_path: str) -> bool:
    """Whether `model_path` compiled again, with the options and architecture the program
    records, gives the program at `program_path` byte for byte. When a program's outputs
    differ from the integer reference, this tells a bug in ember (the same program) from an
    edited or forged file, whose checksum anyone can recompute."""
    program = Program.load(program_path)
    try:
        options = CompileOptions.from_header(program.metadata.get("options", {}))
        built = compile_model(model_path, profile_path, options, program.arch)
    except (TypeError, ValueError, *user_error_types()):  # options a compile cannot take
        return False
    return built.compiled.program.to_bytes() == Path(program_path).read_bytes()


# The bindings of a model value as it is, not of its quantized codes: float32 (a value the
# host reads or writes in fp32) and int32 (a model input of integer indices).
_AS_GIVEN = ("float32", "int32")


class BitExactness:
    """Runs the program on the simulator beside the integer reference and keeps the first
    difference: the accelerator must equal `run_int8` bit for bit on every sample. The program
    is timed (and its races checked) once, then run on batches of `batch` samples
    (`machine.Machine`; None: `Machine.batch`)."""

    def __init__(self, program: Program, qgraph: Graph, name: str = "the program",
                 batch: int | None = None):
        self.program, self.qgraph = program, qgraph
        producers = {out: node for node in qgraph.nodes for out in node.outputs}
        self.quantized_input = {}
        for node in qgraph.nodes:
            if OPS[node.op].quant is Quant.QUANTIZE and node.inputs[0] in qgraph.inputs:
                self.quantized_input[node.inputs[0]] = node.outputs[0]
        self.raw_output = {name: producers[name].inputs[0] for name in qgraph.outputs
                           if OPS[producers[name].op].quant is Quant.DEQUANTIZE}
        # Each binding must be one of the model's values, of its size: a program compiled from
        # another model, or edited, is refused by name before any sample runs.
        for kind, bindings, model_value in (("input", program.inputs, self.quantized_input),
                                            ("output", program.outputs, self.raw_output)):
            for b in bindings:
                value = b.name if b.dtype in _AS_GIVEN else model_value.get(b.name)
                if value not in qgraph.values or \
                        math.prod(qgraph.type_of(value).shape) != math.prod(b.shape):
                    raise EmberError(f"{name}: its {kind} {b.name!r} of shape {list(b.shape)} "
                                     f"matches none of the model's {kind}s (a program "
                                     f"compiled from another model, or edited)")
        self.machine = machine.Machine(program, host=run_segment)
        self.batch = batch or self.machine.batch
        self.first_difference: dict | None = None
        self.samples = 0  # checked so far
        self._waiting: list[tuple[dict, dict]] = []  # (program inputs, expected outputs)
        self._queued = 0  # samples handed to a batch so far
        self._pool: ThreadPoolExecutor | None = None
        self._running: Future | None = None  # the batch on the simulator's thread

    def program_inputs(self, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The program's inputs for one sample, from `env` (`run_int8(..., keep_all=True)`'s
        values): a float32 binding is a model input the host reads as it is, an int32 one a
        model input of integer indices, the others the reference's quantized inputs."""
        return {b.name: b.quantize(env[b.name]) if b.dtype in _AS_GIVEN
                else np.asarray(env[self.quantized_input[b.name]]) for b in self.program.inputs}

    def expected_outputs(self, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What the program must write for that sample: the reference's raw outputs (a float32
        one as the host computes it)."""
        return {b.name: np.asarray(env[b.name if b.dtype == "float32"
                                       else self.raw_output[b.name]])
                for b in self.program.outputs}

    def add(self, env: Mapping[str, np.ndarray]) -> None:
        """Queue one sample from `env`; a full batch starts running."""
        self._waiting.append((self.program_inputs(env), self.expected_outputs(env)))
        if len(self._waiting) >= self.batch:
            self.flush(wait=False)

    def flush(self, wait: bool = True) -> None:
        """Start the queued samples as one batch, on a thread of its own: the simulator works
        while the caller computes the next samples' references (numpy leaves the
        interpreter's lock in its loops, so both cores work). One batch runs at a time. With
        `wait`, return once every sample queued so far is compared (and raise what it
        raised)."""
        if self._waiting:
            self._wait()
            waiting, self._waiting = self._waiting, []
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="ember-simulator")
            self._running = self._pool.submit(self._compare, waiting, self._queued)
            self._queued += len(waiting)
        if wait:
            self._wait()
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None

    def _wait(self) -> None:
        if self._running is not None:
            running, self._running = self._running, None
            running.result()

    def _compare(self, waiting: list[tuple[dict, dict]], first: int) -> None:
        """Run one batch of samples (the first of them sample `first`) and compare each."""
        inputs = {b.name: np.stack([w[0][b.name] for w in waiting])
                  for b in self.program.inputs}
        outputs = self.machine.outputs(inputs, first=first)
        for n, (_, expected) in enumerate(waiting):
            for binding in self.program.outputs:
                want = expected[binding.name]
                got = outputs[binding.name][n].reshape(want.shape)
                # Bit for bit, floats too (an fp32 output the host computes): compare the
                # bytes. (tobytes: a 0-d value too, which np.ascontiguousarray makes 1-d.)
                same = got.dtype == want.dtype and got.tobytes() == want.tobytes()
                if self.first_difference is None and not same:
                    index = tuple(int(i) for i in np.argwhere(got != want)[0]) \
                        if np.any(got != want) else (0,) * got.ndim
                    self.first_difference = {"sample": first + n, "output": binding.name,
                                             "element": list(index),
                                             "simulator": got[index].item(),
                                             "reference": want[index].item()}
        self.samples = first + len(waiting)

    def check(self, env: Mapping[str, np.ndarray]) -> Stats:
        """Run one sample now and compare it; the program's performance figures."""
        self.add(env)
        self.flush()
        return self.machine.stats


def read_labels(evaluation: Evaluation) -> np.ndarray | None:
    """Ground truth as stored: --labels FILE (.npy, or .npz key `labels`), else the data .npz's
    `labels`. `class_labels` checks it against each classifier output."""
    source = evaluation.labels or (evaluation.data if evaluation.data.endswith(".npz") else None)
    if source is None:
        return None
    path = Path(source)
    if not path.is_file():
        raise EmberError(f"--labels {source}: no such file")
    check_array_file(path)
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        with np.load(path, allow_pickle=False) as npz:
            if "labels" not in npz.files:
                if evaluation.labels:
                    raise EmberError(f"{path}: no array named 'labels'")
                return None
            return npz["labels"]
    except (ValueError, OSError, EOFError) as err:  # EOFError: an empty file
        raise EmberError(f"{path}: not a readable .npy/.npz file ({err})") from None


def class_labels(labels: np.ndarray, classes: int, where: str) -> np.ndarray:
    """One class index per sample: integers in [0, classes) of shape [N] (or [N, 1]), or
    one-hot rows [N, classes], each exactly one 1, read by their argmax. Anything else would
    give a silently wrong top-1 (one-hot rows flattened into N·classes labels), so it is refused."""
    expected = (f"expected one class index in [0, {classes}) per sample, shape [N], or one-hot "
                f"rows of shape [N, {classes}]")
    labels = np.asarray(labels)
    if labels.dtype.kind not in "biuf":
        raise EmberError(f"{where}: labels of type {labels.dtype}; {expected}")
    if labels.ndim == 2 and labels.shape[1] == classes and classes > 1:
        if not np.all((labels == 0) | (labels == 1)) or np.any(labels.sum(axis=1) != 1):
            raise EmberError(f"{where}: labels of shape {list(labels.shape)} are not one-hot "
                             f"(each row exactly one 1, the rest 0); {expected}")
        return labels.argmax(axis=1)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise EmberError(f"{where}: labels of shape {list(labels.shape)}; {expected}")
    bad = ~np.isfinite(labels) | (labels != np.round(labels)) if labels.dtype.kind == "f" \
        else np.zeros(labels.shape, bool)
    bad |= ~bad & ((labels < 0) | (labels >= classes))
    if np.any(bad):
        index = int(np.argmax(bad))
        raise EmberError(f"{where}: label {labels[index].item()!r} at sample {index}; {expected}")
    return labels.astype(np.int64)


def _fake_quant(x: np.ndarray, params: QuantParams, dtype: str) -> np.ndarray:
    """x rounded onto its quantization grid and clamped: the tensor's own quantization error
    (in the evaluation's own float type)."""
    scale, zero_point = params.scale[0], params.zero_point[0]
    q = numerics.quantize(x, scale, zero_point, dtype=dtype, arithmetic=x.dtype)
    return numerics.dequantize(q, scale, zero_point, arithmetic=x.dtype).astype(np.float32)


def measure(model_path: str, profile_path: str, evaluation: Evaluation, options: QuantOptions,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            progress: Progress = quiet,
            emit_onnx: str | None = None,
            check_program_options: Callable[[QuantOptions], None] = lambda fixed: None
            ) -> AccuracyReport:
    """Run the evaluation; with `emit_onnx`, also write the QDQ ONNX export, each node's
    metadata carrying its measured SQNR (accumulated from the input, per-layer runs only).
    With a program, its recorded options replace `options`, once `check_program_options`
    (which may raise) has seen them. `progress` hears how many samples are done
    (`compiler.backend.progress`)."""
    program = Program.load(evaluation.program) if evaluation.program else None
    input_shapes = dict(input_shapes or {})
    if program is not None:
        check_segments(program, evaluation.program)
        options = program_options(program, profile_path)
        check_program_options(options)
        input_shapes = program_input_shapes(program, evaluation.program, input_shapes)
    progress("quantizing", 0, None)
    profile = profile_format.load(profile_path)
    quantized = quantize_model(model_path, profile, options, input_shapes)
    proto, graph, qgraph = quantized.model, quantized.graph, quantized.qgraph
    exactness = BitExactness(program, qgraph, evaluation.program, evaluation.batch) \
        if program is not None else None
    specs = input_specs(proto, {})
    source = open_data(evaluation.data, specs, evaluation.images)
    # The program, if any, was compiled with this profile: its record is the profile's.
    preprocessing.warn_if_differs(preprocessing.profiled(profile), evaluation.images, source,
                                  f"--data {evaluation.data}")
    batch = specs[0].fixed_batch or 1
    labels = read_labels(evaluation)
    where = evaluation.labels or evaluation.data
    session = ort.session(proto, name=model_path)
    outputs = {name: ErrorStats() for name in graph.outputs}
    top1 = {name: Top1() for name in graph.outputs if is_classifier(graph.type_of(name).shape)}
    # Each classifier output's labels, checked against its number of classes.
    truth = {} if labels is None else {
        name: class_labels(labels, graph.type_of(name).shape[1], where) for name in top1}
    layer_own: dict[str, ErrorStats] = {}
    layer_acc: dict[str, ErrorStats] = {}
    kept: list[tuple[dict, dict]] = []  # (feeds, fp32 outputs) per batch, for sensitivities
    params = _params_by_name(qgraph)
    tally = batching.Tally()
    seen = 0
    total = source.count()
    if evaluation.samples is not None and total is not None:
        total = min(total, evaluation.samples)
    progress("evaluating samples", 0, total)
    blas = ExitStack()
    if exactness is not None:  # the simulator's thread and this one share the two cores
        blas.enter_context(threadpool_limits(1, user_api="blas"))
    for feeds in batching.stream(source, specs, batch, True, evaluation.samples, False, tally):
        reference = ort.run(session, feeds)
        env = run_int8(qgraph, feeds, keep_all=evaluation.per_layer or program is not None)
        if exactness is not None:
            exactness.add(env)
        n = len(next(iter(feeds.values())))
        for name in graph.outputs:
            outputs[name].add(reference[name], env[name])
            if name in top1:
                batch_labels = None
                if name in truth:
                    if seen + n > len(truth[name]):
                        raise EmberError(f"{where}: {len(truth[name])} labels for more samples")
                    batch_labels = truth[name][seen:seen + n]
                top1[name].add(reference[name], env[name], batch_labels)
        if evaluation.sensitivity:
            kept.append((dict(feeds), dict(reference)))
        if evaluation.per_layer:
            fp32 = evaluate(graph, feeds, keep_all=True)
            for name, value in dequantized(qgraph, env).items():
                if name not in fp32 or graph.values[name].is_const:
                    continue
                layer_acc.setdefault(name, ErrorStats()).add(fp32[name], value)
                if name in params:
                    layer_own.setdefault(name, ErrorStats()).add(
                        fp32[name], _fake_quant(fp32[name], *params[name]))
        seen += n
        progress("evaluating samples", seen, total)
    if exactness is not None:
        exactness.flush()
    blas.close()
    if seen == 0:
        raise EmberError(f"--data {evaluation.data}: no samples")
    notes = []
    for name in graph.outputs:
        if name not in top1:
            notes.append(f"output {name!r} of shape {graph.type_of(name).shape} is not a "
                         "classifier: top-1 figures omitted, the other metrics kept")
    if evaluation.per_layer:
        unmeasured = [out for node in graph.nodes for out in node.outputs
                      if out not in layer_acc]
        # A smoothed LayerNorm output's int8 value is y / f (`quantizer.smooth`): not y's.
        smoothed = [out for out in unmeasured if f"{out}/smooth" in qgraph.values]
        unmeasured = [out for out in unmeasured if out not in smoothed]
        if smoothed:
            notes.append(f"{len(smoothed)} LayerNorm outputs are smoothed into the Gemms that "
                         f"read them (their int8 values are y / f, not y): {', '.join(smoothed)}")
        if unmeasured:
            notes.append(f"{len(unmeasured)} of the {len(layer_acc) + len(unmeasured)} "
                         f"tensors have no int8 value of their own to measure (fused into the "
                         f"node that reads them, or kept in fp32): {', '.join(unmeasured)}")
    if tally.dropped:
        notes.append(f"{tally.dropped} of {seen + tally.dropped} samples left out: they do not "
                     f"fill a batch of {batch}, the model's batch size")
    counted = len(next(iter(truth.values()))) if truth else \
        None if labels is None else np.size(labels)
    if counted is not None and counted != seen and not evaluation.samples:
        notes.append(f"{counted} labels for {seen} samples")
    results = tuple(
        OutputAccuracy(name, stats.sqnr_db, stats.cosine, stats.max_abs, name in top1,
                       top1[name].agreement if name in top1 else None,
                       top1[name].accuracy("reference") if name in top1 else None,
                       top1[name].accuracy("approx") if name in top1 else None)
        for name, stats in outputs.items())
    layers = _layers(qgraph, layer_own, layer_acc, params)
    if evaluation.sensitivity and layers:
        progress("tensor sensitivities", 0, None)
        found = sensitivities(qgraph, [k[0] for k in kept], [k[1] for k in kept],
                              lambda done, count: progress("tensor sensitivities", done, count))
        layers = tuple(dataclasses.replace(layer, alone_sqnr_db=found[layer.name].alone_sqnr_db,
                                           gain_db=found[layer.name].gain_db)
                       if layer.name in found else layer for layer in layers)
    if emit_onnx:
        if not Path(emit_onnx).parent.is_dir():
            raise EmberError(f"--emit-onnx {emit_onnx}: directory "
                             f"{Path(emit_onnx).parent} does not exist")
        export_qdq(qgraph, emit_onnx,
                   sqnr_by_value={layer.name: layer.accumulated_sqnr_db for layer in layers})
    return AccuracyReport(model=Path(model_path).name, samples=seen, outputs=results,
                          layers=layers,
                          options=_option_record(options, evaluation, profile_path),
                          notes=tuple(notes),
                          bit_exact=None if exactness is None else
                          exactness.first_difference is None,
                          first_difference=None if exactness is None else
                          exactness.first_difference,
                          host_segments=() if program is None else tuple(
                              {"name": s["name"], "nodes": list(s["nodes"])}
                              for s in program.host_segments))


def _params_by_name(qgraph: Graph) -> dict[str, tuple[QuantParams, str]]:
    """ONNX name → (per-tensor quantization parameters, element type) of each activation."""
    found = {}
    for name, value in qgraph.values.items():
        quant = value.type.quant
        if not value.is_const and quant is not None and quant.axis is None:
            found.setdefault(qgraph.origin.get(name, name), (quant, value.type.dtype))
    return found


def _layers(qgraph: Graph, own: dict[str, ErrorStats], acc: dict[str, ErrorStats],
            params: dict[str, tuple[QuantParams, str]]
            ) -> tuple[LayerAccuracy, ...]:
    # The first node that writes a name is the one that computes it: a model output's integer
    # node, not the DequantizeLinear after it that carries the same ONNX name.
    producers: dict[str, object] = {}
    for node in qgraph.nodes:
        for out in node.outputs:
            producers.setdefault(qgraph.origin.get(out, out), node)
    layers = []
    for name, stats in acc.items():
        node = producers.get(name)
        layers.append(LayerAccuracy(name, node.name if node else "", node.op if node else "",
                                    params[name][1] if name in params else "int8",
                                    own[name].sqnr_db if name in own else stats.sqnr_db,
                                    stats.sqnr_db))
    return tuple(layers)


def _option_record(options: QuantOptions, evaluation: Evaluation, profile_path: str) -> dict:
    return {"ember_version": profile_format.tool_version(), "calibration": options.calibration,
            "percentile": options.percentile, "per_channel": options.per_channel, "activations": options.activation_dtype,
            "symmetric": options.symmetric_activations, "schema": options.schema,
            "keep_fp32": list(options.keep_fp32), "wide_norm_inputs": options.wide_norm_inputs,
            "smooth_norms": options.smooth_norms,
            **({"int16_tensors": list(options.int16_tensors)} if options.int16_tensors else {}),
            "profile": str(profile_path),
            "data": evaluation.data, "samples": evaluation.samples,
            "program": evaluation.program}
