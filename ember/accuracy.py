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
import threading
import warnings
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
from ember import cluster, ort, preprocessing, shards
from ember.errors import EmberError, user_error_types
from ember.flow import CompileOptions, compile_model, quantize_model
from ember.loading import check_array_file
from ember.reports.accuracy import (AccuracyReport, LayerAccuracy, OutputAccuracy,
                                    TaskMetric, WeightAccuracy)
from ember.reports.metrics import ErrorStats, Top1, is_classifier
from ember.sensitivity import sensitivities
from ember.task_metric import Metric, MetricSpec, MetricSums
from profiler import batching
from profiler import format as profile_format
from profiler.model_inputs import InputSpec, input_specs
from profiler.sources import open_data
from profiler.sources.images import ImageOptions
from quantizer.ideal import Kernel, kernel_outputs, kernels
from quantizer.options import QuantOptions
from quantizer.qdq import export_qdq
from quantizer.reference import dequantized, run_int8
from simulator import machine, numerics
from simulator.program import Program
from simulator.stats import Stats


def _shape_text(shape: Sequence[int]) -> str:
    return f"[{', '.join(map(str, shape))}]"


def _per_output(values: Sequence[str], option: str, what: str, convert: Callable,
                described: str) -> tuple[object, tuple[tuple[str, object], ...]]:
    """An option's values as typed, WHAT for every output or OUTPUT=WHAT for one (the last
    '=' splits, so an output name may hold one): (every, ((output, value), ...))."""
    every = None
    by_output: dict[str, object] = {}
    for value in values:
        name, equals, text = value.rpartition("=")
        try:
            converted = convert(text)
        except ValueError:
            raise EmberError(f"{option} {value!r}: expected {what} or OUTPUT={what}, {what} "
                             f"{described}") from None
        if equals and not name:
            raise EmberError(f"{option} {value!r}: no output name before '='; give "
                             f"OUTPUT={what}, or {what} alone for every output")
        before = by_output.get(name) if equals else every
        if before is not None and before != converted:
            which = f"output {name!r}" if equals else "every output"
            raise EmberError(f"{option} given twice for {which} ({before} and {converted}): "
                             f"give one")
        if equals:
            by_output[name] = converted
        else:
            every = converted
    return every, tuple(by_output.items())


def _named_outputs(by_output: Sequence[tuple[str, object]], shapes: Mapping[str, Sequence[int]],
                   model: str, option: str) -> dict[str, object]:
    """An option's values by output name, each name one of the model's outputs."""
    named = dict(by_output)
    unknown = [name for name in named if name not in shapes]
    if unknown:
        outputs = ", ".join(f"{n!r} {_shape_text(s)}" for n, s in shapes.items())
        raise EmberError(f"{option} {unknown[0]}={named[unknown[0]]}: {model} has no output "
                         f"{unknown[0]!r}; its outputs: {outputs}")
    return named


@dataclass(frozen=True)
class Decisions:
    """Outputs read as yes/no decisions (`--threshold [OUTPUT=]T`): each score above T is a
    yes, at every position (a binary classifier's one probability or logit, a voice detector's
    speech probability per chunk, a text detector's pixels). Top-1 agreement and accuracy then
    count decisions (`Top1.threshold`); labels are 0 or 1 for each."""

    every: float | None = None
    by_output: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, values: Sequence[str]) -> Decisions:
        def finite(text: str) -> float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        return cls(*_per_output(values, "--threshold", "T", finite, "a finite number"))

    @property
    def given(self) -> bool:
        return self.every is not None or bool(self.by_output)

    def resolve(self, shapes: Mapping[str, Sequence[int]], model: str) -> dict[str, float]:
        """Each decision output's threshold, by output name."""
        named = _named_outputs(self.by_output, shapes, model, "--threshold")
        return {name: named.get(name, self.every) for name in shapes
                if named.get(name, self.every) is not None}


@dataclass(frozen=True)
class ClassAxes:
    """Which axis of each output holds its class scores (`--class-axis [OUTPUT=]AXIS`,
    negative counting from the last, as numpy's `axis` and torch's `dim`): `every` for each
    output, `by_output` for one (it wins over `every`). An output named by neither is a
    classifier only when it is [batch, classes] with more than one class, read on its last
    axis; a sequence or a map ([batch, steps, vocab], [steps, batch, classes], [batch,
    classes, H, W]) counts only when named, its top-1 compared per position (`Top1`)."""

    every: int | None = None
    by_output: tuple[tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, values: Sequence[str]) -> ClassAxes:
        """From the option's values as typed: AXIS, or OUTPUT=AXIS."""
        return cls(*_per_output(values, "--class-axis", "AXIS", int,
                                "an integer (negative counts from the last axis)"))

    @property
    def given(self) -> bool:
        return self.every is not None or bool(self.by_output)

    def resolve(self, shapes: Mapping[str, Sequence[int]], model: str) -> dict[str, int]:
        """Each classifier output's class axis (0 or more), by output name; refuses a name
        that is not an output, an axis the output lacks, and an axis of one class."""
        named = _named_outputs(self.by_output, shapes, model, "--class-axis")
        axes = {}
        for name, shape in shapes.items():
            axis = named.get(name, self.every)
            if axis is None:
                if is_classifier(tuple(shape)):
                    axes[name] = len(shape) - 1
                continue
            given = f"--class-axis {name}={axis}" if name in named else f"--class-axis {axis}"
            if not -len(shape) <= axis < len(shape):
                raise EmberError(f"{given}: output {name!r} of {model} has shape "
                                 f"{_shape_text(shape)}, no axis {axis}: expected an axis from "
                                 f"{-len(shape)} to {len(shape) - 1}")
            axis %= len(shape)
            if shape[axis] < 2:
                wide = [f"{a} ({n})" for a, n in enumerate(shape) if n > 1]
                raise EmberError(f"{given}: axis {axis} of output {name!r} of {model} (shape "
                                 f"{_shape_text(shape)}) has size {shape[axis]}: a class axis "
                                 f"holds two or more class scores"
                                 + (f"; its axes of more than one: {', '.join(wide)}"
                                    if wide else ""))
            axes[name] = axis
        return axes


@dataclass(frozen=True)
class Evaluation:
    data: str
    labels: str | None = None
    samples: int | None = None
    per_layer: bool = False
    # With per_layer: each tensor's effect on the output, kept at full precision and alone
    # quantized (`ember.sensitivity`); without `alone`, only the gains (what a budget ranks by:
    # half the runs).
    sensitivity: bool = False
    alone: bool = True
    program: str | None = None  # a compiled .ember: also run it and check it bit for bit
    batch: int | None = None  # samples the simulator runs at once (None: `Machine.batch`)
    images: ImageOptions = ImageOptions()  # preprocessing, when `data` is a folder of images
    class_axes: ClassAxes = ClassAxes()  # where each output's class scores lie (top-1)
    decisions: Decisions = Decisions()  # the outputs read as yes/no at a threshold
    # The blank class of the outputs scored per position, read as CTC heads: their labels are
    # one row of class indices per sample (`sequence_labels`), each decoded sample right or
    # wrong as a whole (`Top1`).
    ctc_blank: int | None = None
    # A task metric of the user's own (`ember.task_metric`): the labels are then its, scored
    # run by run on fp32's outputs and on int8's.
    metric: MetricSpec | None = None


def program_options(program: Program, profile_path: str) -> QuantOptions:
    """The quantizer options a program was compiled with; its profile must be this one."""
    recorded = program.metadata.get("inputs", {}).get("profile_sha256")
    if recorded and recorded != hashlib.sha256(Path(profile_path).read_bytes()).hexdigest():
        equalized = program.metadata.get("options", {}).get("equalize")
        hint = "" if equalized in (None, "off") else \
            (" (an accuracy budget that equalized the model wrote it beside the program: "
             "its name ends .equalized.profile.json)")
        raise EmberError(f"{profile_path}: the program was compiled with another profile; give "
                         f"the one `ember compile` used{hint}")
    try:
        options = CompileOptions.from_header(program.metadata.get("options", {})).quant
    except (TypeError, ValueError) as err:  # a forged header: "percentile": "x"
        raise EmberError(f"the program's recorded options are malformed: {err}") from None
    rounding = program.metadata.get("inputs", {}).get("weight_rounding_sha256")
    if options.weight_rounding and rounding and (
            not Path(options.weight_rounding).is_file() or
            rounding != hashlib.sha256(Path(options.weight_rounding).read_bytes()).hexdigest()):
        raise EmberError(f"{options.weight_rounding}: the program was compiled with another "
                         f"weight-rounding file (or this one is missing); give the one "
                         f"`ember compile --weight-rounding` used")
    return options


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
        self.program, self.qgraph, self.name = program, qgraph, name
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

    def restart(self, first_sample: int) -> None:
        """Forget the samples compared so far and number the next one `first_sample`: a shard
        of the evaluation that starts there (the machine, timed once, is kept)."""
        self._waiting = []
        self.flush()
        self.first_difference = None
        self.samples = self._queued = first_sample

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


def sequence_labels(labels: np.ndarray, classes: int, blank: int, where: str) -> np.ndarray:
    """Labels as a CTC head's (`--ctc-blank`) reads them: one row per sample of class indices
    in [0, classes), never the blank, padded at the end with -1 (texts of any length)."""
    expected = (f"expected one row of class indices per sample, [N, longest], each in [0, "
                f"{classes}) and not the blank {blank}, padded at the end with -1")
    labels = np.asarray(labels)
    if labels.ndim == 1 and labels.dtype.kind in "biuf":
        raise EmberError(f"{where}: labels of shape {list(labels.shape)}, one class per sample; "
                         f"--ctc-blank compares whole sequences: {expected}")
    if labels.ndim != 2 or labels.dtype.kind not in "iu":
        raise EmberError(f"{where}: labels of shape {list(labels.shape)} and type "
                         f"{labels.dtype}; {expected}")
    labels = labels.astype(np.int64)
    padding = labels == -1
    bad = ((labels < 0) & ~padding) | (labels >= classes) | (labels == blank)
    bad[:, 1:] |= padding[:, :-1] & ~padding[:, 1:]  # a class after padding
    if np.any(bad):
        sample, step = (int(i) for i in np.argwhere(bad)[0])
        raise EmberError(f"{where}: label {labels[sample, step]} at sample {sample}, position "
                         f"{step}; {expected}")
    return labels


def decision_labels(labels: np.ndarray, decisions: int, where: str) -> np.ndarray:
    """Labels of a decision output (`--threshold`): 0 or 1 for each of a sample's `decisions`
    positions, a row per sample ([N], or [N, decisions] in any shape of that many), as
    [N, decisions]."""
    expected = (f"expected 0 or 1 for each of a sample's {decisions:,} decisions: "
                + ("[N]" if decisions == 1 else f"[N, {decisions}]"))
    labels = np.asarray(labels)
    if labels.dtype.kind not in "biuf" or labels.ndim == 0 or \
            math.prod(labels.shape[1:]) != decisions:
        raise EmberError(f"{where}: labels of shape {list(labels.shape)} and type "
                         f"{labels.dtype}; {expected}")
    rows = labels.reshape(len(labels), decisions)
    bad = (rows != 0) & (rows != 1)
    if np.any(bad):
        sample, position = (int(i) for i in np.argwhere(bad)[0])
        raise EmberError(f"{where}: label {rows[sample, position].item()!r} at sample {sample}"
                         + (f", position {position}" if decisions > 1 else "")
                         + f"; {expected}")
    return rows.astype(np.int64)


def ctc_batch_axis(shape: Sequence[int], class_axis: int, batch: int, name: str) -> int:
    """Where a CTC head's samples lie among its scores' other two axes ([batch, steps,
    classes] or [steps, batch, classes]): the axis of the run's batch size, the first if both
    are."""
    others = [n for axis, n in enumerate(shape) if axis != class_axis]
    if len(others) != 2 or batch not in others:
        raise EmberError(f"--ctc-blank: output {name!r} has shape {_shape_text(shape)}; a CTC "
                         f"head's scores are [batch, steps, classes] or [steps, batch, "
                         f"classes], one axis of them the batch ({batch})")
    return others.index(batch)


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
            check_program_options: Callable[[QuantOptions], None] = lambda fixed: None,
            where: cluster.Where = cluster.Where()
            ) -> AccuracyReport:
    """Run the evaluation; with `emit_onnx`, also write the QDQ ONNX export, each node's
    metadata carrying its measured SQNR (accumulated from the input, per-layer runs only).
    With a program, its recorded options replace `options`, once `check_program_options`
    (which may raise) has seen them. `progress` hears how many samples are done
    (`compiler.backend.progress`). `where` (--cluster) runs shards of the samples in other
    processes; the report is the same, bit for bit (`_Tallies` merge exactly)."""
    program = Program.load(evaluation.program) if evaluation.program else None
    input_shapes = dict(input_shapes or {})
    if program is not None:
        check_segments(program, evaluation.program)
        options = program_options(program, profile_path)
        check_program_options(options)
        input_shapes = program_input_shapes(program, evaluation.program, input_shapes)
    # --metric's function, loaded before any work so that its file's errors come first
    function = evaluation.metric.load() if evaluation.metric is not None else None
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
    where_labels = evaluation.labels or evaluation.data
    metric = _metric(evaluation, function, labels, where_labels)
    scoring = _scoring(evaluation, graph, batch, None if metric else labels, where_labels,
                       Path(model_path).name)
    shapes, class_axes, thresholds = scoring.shapes, scoring.class_axes, scoring.thresholds
    per_position, decided, truth = scoring.per_position, scoring.decided, scoring.truth
    blank = evaluation.ctc_blank
    setup = _Setup(graph, qgraph, ort.session(proto, name=model_path), exactness,
                   _params_by_name(qgraph), kernels(qgraph) if evaluation.per_layer else (),
                   metric)
    total = source.count()
    if evaluation.samples is not None and total is not None:
        total = min(total, evaluation.samples)
    progress("evaluating samples", 0, total)
    with cluster.Cluster(where) as running:
        in_process = running.where.address is None and running.where.processes == 1
        job = _Job(model_path, profile_path, options, input_shapes, evaluation, source, specs,
                   batch, scoring.counters, truth, where_labels, in_process,
                   labels if metric else None)
        shared = cluster.Shared(job)
        if in_process:  # the shard runs here: it takes what was just built
            cluster.cached(shared, "setup", lambda: setup)
        tallies = _evaluate(running, shared, total, progress)
    seen = tallies.samples
    if seen == 0:
        raise EmberError(f"--data {evaluation.data}: no samples")
    notes = []
    for name in graph.outputs:
        if name in thresholds:
            notes.append(f"output {name!r}: yes/no decisions, a score above {thresholds[name]:g} "
                         f"a yes, at each of its {decided[name]:,} positions a sample "
                         f"({tallies.top1[name].positions:,} in all), agreement and accuracy "
                         f"counted per decision")
        elif name not in class_axes and metric is None:  # else --metric scores it
            notes.append(f"output {name!r} of shape {_shape_text(shapes[name])} is not a "
                         f"classifier ([batch, classes]): top-1 figures omitted, the other "
                         f"metrics kept; --class-axis {name}=AXIS names where its class "
                         f"scores lie (top-1 per position)")
        elif name in per_position:
            axis = class_axes[name]
            notes.append(f"output {name!r}: per-position top-1 agreement, the argmax over axis "
                         f"{axis} ({shapes[name][axis]:,} classes) of its "
                         f"{_shape_text(shapes[name])} scores at each of {per_position[name]:,} "
                         f"positions a sample, {tallies.top1[name].positions:,} in all"
                         + ("; no top-1 accuracy: the labels are one class index per sample"
                            if labels is not None and blank is None else "")
                         + (f"; its accuracy is of whole texts: each sample's argmaxes "
                            f"decoded as CTC's (repeats merged, blank {blank} dropped) and "
                            f"right only when equal to its label row"
                            if name in truth and blank is not None else ""))
    layer_own, layer_acc = tallies.layer_own, tallies.layer_acc
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
    if tallies.dropped:
        notes.append(f"{tallies.dropped} of {seen + tallies.dropped} samples left out: they do "
                     f"not fill a batch of {batch}, the model's batch size")
    counted = len(next(iter(truth.values()))) if truth else \
        None if labels is None else len(labels) if metric else np.size(labels)
    if counted is not None and counted != seen and not evaluation.samples:
        notes.append(f"{counted} labels for {seen} samples")
    top1 = tallies.top1
    results = tuple(
        OutputAccuracy(name, stats.sqnr_db, stats.cosine, stats.max_abs, name in top1,
                       top1[name].agreement if name in top1 else None,
                       top1[name].accuracy("reference") if name in top1 else None,
                       top1[name].accuracy("approx") if name in top1 else None,
                       shape=tuple(shapes[name]), class_axis=class_axes.get(name),
                       top1_positions=top1[name].positions if name in top1 else None,
                       top1_per_position=name in per_position or decided.get(name, 1) > 1,
                       sequences=name in truth and blank is not None and name in class_axes,
                       threshold=thresholds.get(name))
        for name, stats in tallies.outputs.items())
    layers = _layers(qgraph, layer_own, layer_acc, setup.params, tallies.layer_kernel,
                     tallies.layer_ideal)
    weights, floats = _weights(graph, qgraph, quantized.float_weights) \
        if evaluation.per_layer else ((), {})
    if evaluation.sensitivity and layers:
        # Every sample in memory, in this process: kept by the shard that ran here, or read
        # again here when the shards ran elsewhere (the same samples, the same references).
        kept = tallies.kept if in_process else _kept_samples(job, setup)
        progress("tensor sensitivities", 0, None)
        found, by_weight = sensitivities(
            qgraph, [k[0] for k in kept], [k[1] for k in kept],
            lambda done, count: progress("tensor sensitivities", done, count), floats,
            evaluation.alone, where)
        layers = tuple(dataclasses.replace(layer, alone_sqnr_db=found[layer.name].alone_sqnr_db,
                                           gain_db=found[layer.name].gain_db)
                       if layer.name in found else layer for layer in layers)
        weights = tuple(dataclasses.replace(w, alone_sqnr_db=by_weight[w.value].alone_sqnr_db,
                                            gain_db=by_weight[w.value].gain_db)
                        if w.value in by_weight else w for w in weights)
    if emit_onnx:
        if not Path(emit_onnx).parent.is_dir():
            raise EmberError(f"--emit-onnx {emit_onnx}: directory "
                             f"{Path(emit_onnx).parent} does not exist")
        export_qdq(qgraph, emit_onnx,
                   sqnr_by_value={layer.name: layer.accumulated_sqnr_db for layer in layers})
    first_difference = tallies.first_difference
    task = None if metric is None else TaskMetric(
        evaluation.metric.function, str(evaluation.metric), tallies.metric_fp32.value,
        tallies.metric_int8.value)
    if task is not None and task.fp32 is None:
        notes.append(f"--metric {evaluation.metric} weighed nothing on fp32's outputs (every "
                     f"weight 0): no task metric")
    return AccuracyReport(model=Path(model_path).name, samples=seen, outputs=results, task=task,
                          layers=layers, weights=weights,
                          options=_option_record(options, evaluation, profile_path,
                                                 class_axes, thresholds),
                          notes=tuple(notes),
                          bit_exact=None if exactness is None else first_difference is None,
                          first_difference=None if exactness is None else first_difference,
                          host_segments=() if program is None else tuple(
                              {"name": s["name"], "nodes": list(s["nodes"])}
                              for s in program.host_segments))


def _metric(evaluation: Evaluation, function: Metric | None, labels: np.ndarray | None,
            where: str) -> Metric | None:
    """The --metric function, once the labels it needs are there; they are then its alone (no
    classifier output is scored against them)."""
    if function is None:
        return None
    if evaluation.ctc_blank is not None:
        raise EmberError(f"--metric {evaluation.metric} and --ctc-blank both score against the "
                         f"labels; give one of them")
    if labels is None:
        raise EmberError(f"--metric {evaluation.metric} scores the outputs against labels: give "
                         f"--labels, or a 'labels' array in --data {evaluation.data}")
    if np.ndim(labels) == 0:
        raise EmberError(f"{where}: labels of shape []; --metric needs one row per sample")
    return function


@dataclass(frozen=True)
class _Scoring:
    """How each output is scored beyond SQNR: its class axis or threshold, how many argmaxes
    or decisions a sample holds, its counters (`Top1`) and its labels."""

    shapes: dict[str, tuple[int, ...]]
    class_axes: dict[str, int]
    thresholds: dict[str, float]
    per_position: dict[str, int]  # a sequence's or map's argmaxes a sample
    decided: dict[str, int]  # a yes/no output's decisions a sample
    counters: dict[str, Top1]  # empty, one per scored output
    truth: dict[str, np.ndarray]  # each labelled output's labels


def _scoring(evaluation: Evaluation, graph: Graph, batch: int, labels: np.ndarray | None,
             where_labels: str, model: str) -> _Scoring:
    """Resolve --class-axis, --threshold and --ctc-blank against the model's outputs and check
    the labels for each scored output (one-line errors for what does not fit)."""
    shapes = {name: graph.type_of(name).shape for name in graph.outputs}
    thresholds = evaluation.decisions.resolve(shapes, model)
    twice = [name for name, _ in evaluation.class_axes.by_output if name in thresholds]
    if twice:
        raise EmberError(f"output {twice[0]!r}: --class-axis reads class scores and --threshold "
                         f"yes/no scores; give one of them for it")
    class_axes = evaluation.class_axes.resolve(
        {name: shape for name, shape in shapes.items() if name not in thresholds},
        model)
    decided = {name: math.prod(shapes[name]) // batch for name in thresholds}
    # A run that compares more argmaxes than it holds samples reads its output per position
    # (a sequence's steps, a map's pixels); labels are one class index per sample.
    per_position = {name: math.prod(shapes[name]) // shapes[name][axis] // batch
                    for name, axis in class_axes.items()
                    if math.prod(shapes[name]) // shapes[name][axis] != batch}
    per_sample = [name for name in class_axes if name not in per_position]
    blank = evaluation.ctc_blank
    if blank is not None and not per_position:
        raise EmberError(f"--ctc-blank {blank} reads an output scored per position as a CTC "
                         f"head's: name its class axis with --class-axis (e.g. --class-axis "
                         f"{next(iter(shapes))}=-1)")
    if labels is not None and evaluation.labels and per_position and not per_sample and \
            blank is None:
        name = next(iter(per_position))
        raise EmberError(f"--labels {evaluation.labels}: labels are one class index per "
                         f"sample, and output {name!r} is scored per position (class axis "
                         f"{class_axes[name]} of {_shape_text(shapes[name])}): give "
                         f"--ctc-blank for a CTC head's texts, or drop --labels (top-1 "
                         f"agreement with fp32 needs none)")
    # Top-1's counters: a CTC head's know its blank and where its samples lie; a decision
    # output's, its threshold.
    counters = {name: Top1(axis) for name, axis in class_axes.items()}
    counters.update({name: Top1(threshold=t) for name, t in thresholds.items()})
    if blank is not None:
        for name in per_position:
            classes = shapes[name][class_axes[name]]
            if not 0 <= blank < classes:
                raise EmberError(f"--ctc-blank {blank}: output {name!r} has {classes:,} "
                                 f"classes (axis {class_axes[name]} of "
                                 f"{_shape_text(shapes[name])}); the blank is one of them")
            counters[name] = Top1(class_axes[name], blank=blank, batch_axis=ctc_batch_axis(
                shapes[name], class_axes[name], batch, name))
    # Each classifier output's labels, checked against its number of classes: one class per
    # sample, or a CTC head's row of classes.
    truth = {}
    if labels is not None:
        truth = {name: class_labels(labels, shapes[name][class_axes[name]], where_labels)
                 for name in per_sample if blank is None or not per_position}
        if blank is not None:
            truth.update({name: sequence_labels(labels, shapes[name][class_axes[name]], blank,
                                                where_labels) for name in per_position})
        truth.update({name: decision_labels(labels, decided[name], where_labels)
                      for name in thresholds})
    return _Scoring(shapes, class_axes, thresholds, per_position, decided, counters, truth)


@dataclass(frozen=True)
class _Job:
    """What every shard of one evaluation needs, sent once per worker: paths and the data
    source (which reads its files where the worker runs), never the samples."""

    model_path: str
    profile_path: str
    options: QuantOptions
    input_shapes: dict[str, tuple[int, ...]]
    evaluation: Evaluation
    source: batching.Source
    specs: list[InputSpec]
    batch: int  # the model's samples per run: shards start on whole batches
    # Each scored output's empty counts (`_Scoring.counters`): its class axis, a CTC head's
    # blank and batch axis, a yes/no output's threshold.
    top1: dict[str, Top1]
    # Each classifier output's labels: a class index per sample, or a CTC head's row of them.
    truth: dict[str, np.ndarray]
    labels_where: str  # the file labels came from, for errors
    in_process: bool  # the shards run in this process (local:1): all cores, no copies
    metric_labels: np.ndarray | None = None  # --metric's, one row per sample


@dataclass
class _Setup:
    """What a worker builds once per evaluation and keeps for each shard it runs."""

    graph: Graph
    qgraph: Graph
    session: object  # onnxruntime.InferenceSession
    exactness: BitExactness | None
    params: dict[str, tuple[QuantParams, str]]
    kernels: tuple[Kernel, ...]  # --per-layer: the integer nodes whose kernel error it measures
    metric: Metric | None = None  # --metric's function, loaded where the shards run
    # Threads of a Dask worker run shards side by side: each compares on its own machine.
    machines: dict[int, BitExactness] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def exactness_here(self) -> BitExactness | None:
        """This thread's BitExactness (the first thread takes the one built with the setup)."""
        if self.exactness is None:
            return None
        me = threading.get_ident()
        with self.lock:
            if me not in self.machines:
                self.machines[me] = BitExactness(
                    self.exactness.program, self.qgraph, self.exactness.name,
                    self.exactness.batch) if self.machines else self.exactness
            return self.machines[me]


def _set_up(job: _Job) -> _Setup:
    """A worker's setup: the model quantized again from the same files and options (the same
    graphs, deterministically), an onnxruntime session of one thread, the program's machine.
    Warnings were the main process's to give."""
    threadpool_limits(1, user_api="blas")  # one thread per shard: the workers share the cores
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = quantize_model(job.model_path, profile_format.load(job.profile_path),
                                   job.options, job.input_shapes)
    program = job.evaluation.program
    exactness = BitExactness(Program.load(program), quantized.qgraph, program,
                             job.evaluation.batch) if program else None
    return _Setup(quantized.graph, quantized.qgraph,
                  ort.session(quantized.model, threads=1, name=job.model_path), exactness,
                  _params_by_name(quantized.qgraph),
                  kernels(quantized.qgraph) if job.evaluation.per_layer else (),
                  job.evaluation.metric.load() if job.evaluation.metric else None)


@dataclass(frozen=True)
class _Shard:
    samples: shards.SampleRange
    # In this process only: hears each batch's samples, for the progress bar.
    report: Callable[[int], None] | None = None


@dataclass
class _Tallies:
    """One shard's measurements, or several shards' merged: exact sums, counts, the first
    difference by global sample index; so merging in any grouping gives one process's."""

    samples: int = 0
    dropped: int = 0  # a last partial batch of a fixed-batch model
    outputs: dict[str, ErrorStats] = dataclasses.field(default_factory=dict)
    top1: dict[str, Top1] = dataclasses.field(default_factory=dict)
    layer_own: dict[str, ErrorStats] = dataclasses.field(default_factory=dict)
    layer_acc: dict[str, ErrorStats] = dataclasses.field(default_factory=dict)
    # Each kernel's output, and its ideal output, against the fp32 op on its inputs.
    layer_kernel: dict[str, ErrorStats] = dataclasses.field(default_factory=dict)
    layer_ideal: dict[str, ErrorStats] = dataclasses.field(default_factory=dict)
    first_difference: dict | None = None
    kept: list[tuple[dict, dict]] = dataclasses.field(default_factory=list)  # --sensitivity
    metric_fp32: MetricSums = dataclasses.field(default_factory=MetricSums)  # --metric's
    metric_int8: MetricSums = dataclasses.field(default_factory=MetricSums)

    def merge(self, other: _Tallies) -> None:
        """Add `other`, a later shard's (dict order: the first shard's, as one process's)."""
        self.samples += other.samples
        self.dropped += other.dropped
        for mine, theirs, empty in ((self.outputs, other.outputs, ErrorStats),
                                    (self.layer_own, other.layer_own, ErrorStats),
                                    (self.layer_acc, other.layer_acc, ErrorStats),
                                    (self.layer_kernel, other.layer_kernel, ErrorStats),
                                    (self.layer_ideal, other.layer_ideal, ErrorStats)):
            for name, stats in theirs.items():
                mine.setdefault(name, empty()).merge(stats)
        for name, top1 in other.top1.items():
            self.top1.setdefault(name, Top1(top1.axis, blank=top1.blank,
                                            batch_axis=top1.batch_axis,
                                            threshold=top1.threshold)).merge(top1)
        theirs = other.first_difference
        if theirs is not None and (self.first_difference is None or
                                   theirs["sample"] < self.first_difference["sample"]):
            self.first_difference = theirs
        self.kept.extend(other.kept)
        self.metric_fp32.merge(other.metric_fp32)
        self.metric_int8.merge(other.metric_int8)


def _evaluate(running: cluster.Cluster, shared: cluster.Shared, total: int | None,
              progress: Progress) -> _Tallies:
    """Every shard's tallies, merged in sample order. In this process, one shard of every
    sample (today's single run); elsewhere, about `shards.SHARDS_PER_WORKER` per worker, or
    shards drawn until one comes back short when the source cannot count its samples. A
    shard's user error stops the run with the error of the first failed shard, as one process
    would meet it, once every shard before it is in."""
    job: _Job = shared.payload
    limit = job.evaluation.samples
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        progress("evaluating samples", done, total)

    if job.in_process:
        return _evaluate_shard(shared, _Shard(shards.SampleRange(0, limit), advance))
    ranges = shards.plan(job.source.count(), limit, job.batch, running.workers) or \
        shards.open_ranges(job.batch, limit)
    done_shards, _ = shards.gather(running, _evaluate_shard, shared, ranges,
                                   read=lambda t: t.samples + t.dropped,
                                   on_result=lambda t: advance(t.samples), shard=_Shard)
    merged = _Tallies()
    for _, result in done_shards:
        merged.merge(result)
    return merged


def _evaluate_shard(shared: cluster.Shared, shard: _Shard) -> _Tallies:
    """Measure the samples of one shard (in a worker: module level, pickled by reference)."""
    job: _Job = shared.payload
    return _measure_range(job, cluster.cached(shared, "setup", lambda: _set_up(job)), shard)


def _measure_range(job: _Job, setup: _Setup, shard: _Shard) -> _Tallies:
    evaluation, graph, qgraph = job.evaluation, setup.graph, setup.qgraph
    start = shard.samples.start
    tallies = _Tallies(outputs={name: ErrorStats() for name in graph.outputs},
                       top1={name: dataclasses.replace(counts)
                             for name, counts in job.top1.items()})
    exactness = setup.exactness_here()
    if exactness is not None:
        exactness.restart(start)
    tally = batching.Tally()  # its sample numbers in errors count from the whole data's first
    position = start
    blas = ExitStack()
    if exactness is not None:  # the simulator's thread and this one share the two cores
        blas.enter_context(threadpool_limits(1, user_api="blas"))
    with blas:
        for feeds in batching.stream(job.source, job.specs, job.batch, True, None, False, tally,
                                     start, shard.samples.stop):
            reference = ort.run(setup.session, feeds)
            env = run_int8(qgraph, feeds,
                           keep_all=evaluation.per_layer or exactness is not None)
            if exactness is not None:
                exactness.add(env)
            n = len(next(iter(feeds.values())))
            for name in graph.outputs:
                tallies.outputs[name].add(reference[name], env[name])
                if name in tallies.top1:
                    batch_labels = None
                    if name in job.truth:
                        if position + n > len(job.truth[name]):
                            raise EmberError(f"{job.labels_where}: {len(job.truth[name])} "
                                             f"labels for more samples")
                        batch_labels = job.truth[name][position:position + n]
                    tallies.top1[name].add(reference[name], env[name], batch_labels)
            if setup.metric is not None:
                _score_run(job, setup.metric, graph.outputs, reference, env, position, n,
                           tallies)
            if evaluation.sensitivity and job.in_process:
                tallies.kept.append((dict(feeds), dict(reference)))
            if evaluation.per_layer:
                _add_layers(graph, qgraph, setup, feeds, env, tallies)
            position += n
            if shard.report is not None:
                shard.report(n)
        if exactness is not None:
            exactness.flush()
            tallies.first_difference = exactness.first_difference
    tallies.samples = position - start
    tallies.dropped = tally.dropped
    return tallies


def _score_run(job: _Job, metric: Metric, outputs: Sequence[str], reference: Mapping,
               env: Mapping, position: int, n: int, tallies: _Tallies) -> None:
    """--metric on one run's fp32 and int8 outputs, with its samples' labels."""
    labels = job.metric_labels
    if position + n > len(labels):
        raise EmberError(f"{job.labels_where}: {len(labels)} labels for more samples")
    rows = labels[position:position + n]
    spec = job.evaluation.metric
    tallies.metric_fp32.add(metric, spec, {name: reference[name] for name in outputs}, rows,
                            position, "fp32")
    tallies.metric_int8.add(metric, spec, {name: env[name] for name in outputs}, rows,
                            position, "int8")


def _add_layers(graph: Graph, qgraph: Graph, setup: _Setup, feeds: dict, env: dict,
                tallies: _Tallies) -> None:
    """Each quantized tensor of one batch against ember's fp32 interpreter: the error
    accumulated from the input, and its own quantization error; and the error of the integer
    kernel that computes it, against the fp32 op on the inputs it received, beside a kernel
    that rounds once (`quantizer.ideal`)."""
    fp32 = evaluate(graph, feeds, keep_all=True)
    params = setup.params
    for name, value in dequantized(qgraph, env).items():
        if name not in fp32 or graph.values[name].is_const:
            continue
        tallies.layer_acc.setdefault(name, ErrorStats()).add(fp32[name], value)
        if name in params:
            tallies.layer_own.setdefault(name, ErrorStats()).add(
                fp32[name], _fake_quant(fp32[name], *params[name]))
    for kernel in setup.kernels:
        if kernel.name not in fp32:  # no row of its own (a smoothed norm's `y/smooth`)
            continue
        signal, ideal, actual = kernel_outputs(qgraph, kernel, env)
        tallies.layer_kernel.setdefault(kernel.name, ErrorStats()).add(signal, actual)
        tallies.layer_ideal.setdefault(kernel.name, ErrorStats()).add(signal, ideal)


def _kept_samples(job: _Job, setup: _Setup) -> list[tuple[dict, dict]]:
    """Every batch and its fp32 outputs, read again in this process for --sensitivity."""
    kept = []
    for feeds in batching.stream(job.source, job.specs, job.batch, True, job.evaluation.samples,
                                 False, batching.Tally()):
        kept.append((dict(feeds), ort.run(setup.session, feeds)))
    return kept


def _params_by_name(qgraph: Graph) -> dict[str, tuple[QuantParams, str]]:
    """ONNX name → (per-tensor quantization parameters, element type) of each activation."""
    found = {}
    for name, value in qgraph.values.items():
        quant = value.type.quant
        if not value.is_const and quant is not None and quant.axis is None:
            found.setdefault(qgraph.origin.get(name, name), (quant, value.type.dtype))
    return found


def _layers(qgraph: Graph, own: dict[str, ErrorStats], acc: dict[str, ErrorStats],
            params: dict[str, tuple[QuantParams, str]], kernel: dict[str, ErrorStats],
            ideal: dict[str, ErrorStats]) -> tuple[LayerAccuracy, ...]:
    # The first node that writes a name is the one that computes it: a model output's integer
    # node, not the DequantizeLinear after it that carries the same ONNX name.
    producers: dict[str, object] = {}
    for node in qgraph.nodes:
        for out in node.outputs:
            producers.setdefault(qgraph.origin.get(out, out), node)
    layers = []
    for name, stats in acc.items():
        node = producers.get(name)
        precision = params[name][1] if name in params else "int8"
        # A table op's int16 table is its second input too: only a weight counts.
        if node is not None and OPS[node.op].weight is not None and len(node.inputs) > 1 and \
                node.inputs[1] and qgraph.values[node.inputs[1]].is_const and \
                qgraph.type_of(node.inputs[1]).dtype == "int16":
            precision += ", int16 weights"  # `QuantOptions.int16_weights`
        measured = kernel.get(name)
        layers.append(LayerAccuracy(
            name, node.name if node else "", node.op if node else "", precision,
            own[name].sqnr_db if name in own else stats.sqnr_db, stats.sqnr_db,
            kernel_sqnr_db=None if measured is None else measured.sqnr_db,
            kernel_loss_db=None if measured is None else
            ideal[name].sqnr_db - measured.sqnr_db))
    return tuple(layers)


def _weights(graph: Graph, qgraph: Graph, float_weights: Mapping[str, np.ndarray]
             ) -> tuple[tuple[WeightAccuracy, ...], dict[str, np.ndarray]]:
    """Each integer weight of a Conv, Gemm or MatMul (the first node that reads it), with its
    own SQNR (its float values against its codes dequantized), and its float values by the
    integer weight's name (for `sensitivities`): the quantizer's (`float_weights`: a smoothed
    weight's are in no graph), else its origin's in `graph`."""
    rows, floats = [], {}
    for node in qgraph.nodes:
        row = OPS[node.op]
        if row.weight is None or len(node.inputs) < 2 or node.inputs[1] in floats:
            continue
        value = qgraph.values[node.inputs[1]]
        origin = graph.values.get(qgraph.origin.get(value.name, value.name))
        quant = value.type.quant
        real = float_weights.get(value.name)
        if real is None and origin is not None:
            real = origin.const
        if not value.is_const or quant is None or real is None or \
                np.shape(real) != np.shape(value.const):
            continue
        real = np.asarray(real, np.float64)
        error = ErrorStats()
        error.add(real, numerics.dequantize(value.const, quant.scale, quant.zero_point,
                                            axis=quant.axis, arithmetic=np.float64))
        floats[value.name] = real
        rows.append(WeightAccuracy(origin.name if origin is not None else value.name,
                                   value.name, node.name, node.op,
                                   value.type.dtype, error.sqnr_db))
    return tuple(rows), floats


def _option_record(options: QuantOptions, evaluation: Evaluation, profile_path: str,
                   class_axes: Mapping[str, int], thresholds: Mapping[str, float]) -> dict:
    return {"ember_version": profile_format.tool_version(), "calibration": options.calibration,
            "percentile": options.percentile, "per_channel": options.per_channel, "activations": options.activation_dtype,
            "symmetric": options.symmetric_activations, "schema": options.schema,
            "keep_fp32": list(options.keep_fp32), "wide_norm_inputs": options.wide_norm_inputs,
            "smooth_norms": options.smooth_norms, "equalize": options.equalize,
            "bias_correction": options.bias_correction,
            **({"int16_tensors": list(options.int16_tensors)} if options.int16_tensors else {}),
            **({"weight_rounding": options.weight_rounding} if options.weight_rounding else {}),
            **({"int16_weights": list(options.int16_weights)} if options.int16_weights else {}),
            "profile": str(profile_path),
            "data": evaluation.data, "samples": evaluation.samples,
            "program": evaluation.program,
            # With --class-axis: each classifier output's class axis, resolved (0 or more).
            **({"class_axes": dict(class_axes)} if evaluation.class_axes.given else {}),
            **({"ctc_blank": evaluation.ctc_blank} if evaluation.ctc_blank is not None
               else {}),
            **({"thresholds": dict(thresholds)} if thresholds else {}),
            **({"metric": str(evaluation.metric)} if evaluation.metric else {})}
