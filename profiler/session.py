"""One onnxruntime session that exposes every value of the model, feeding accumulators.

A model fixed to batch 1 is run with its batch dimension freed, several samples per run,
once `probe` has checked on the first batch that this gives the same values as one sample
per run, which saves the per-run cost that dominates small models; otherwise, and for
models whose values are large, it runs one sample at a time. Outputs that do not depend on the batch
(a float Constant, say) are counted once per sample either way, so the profile does not
depend on --batch.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnxruntime as ort

from profiler.accumulate import Accumulator
from profiler.errors import ProfileError
from profiler.format import TensorStats
from profiler.histogram import Binner

# Results of several small runs are binned together, so tiny models pay the per-call cost of
# numpy once per this many bytes rather than once per run; large models flush every run.
_FLUSH_BYTES = 8 << 20
_BATCH_DIM = "ember_batch"
_BATCH_BYTES = 16 << 20  # above this many bytes of values per run, run one sample at a time
# The least severe of onnxruntime's own log messages it prints (2 warning, 3 error, 4 fatal), in
# this process and in the workers it starts, which do not inherit onnxruntime's setting.
_log_severity = 2  # onnxruntime's default


def set_log_severity(level: int) -> None:
    """Set onnxruntime's log threshold for every session from now on, workers' included."""
    global _log_severity
    _log_severity = level
    ort.set_default_logger_severity(level)


def log_severity() -> int:
    return _log_severity

# Ops whose first output holds exactly the values of their first input, only arranged
# differently, so its statistics (min, max, count, histogram: all order-free) are the input's.
# Dropout only outside training mode, where onnxruntime passes its input through unchanged.
# Not Relu, Clip, Cast or the like: their values differ.
_SAME_VALUES = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                          "Transpose", "Dropout"})


@dataclass(frozen=True)
class Plan:
    """How batches run: whole or one sample at a time, and which outputs ignore the batch."""

    per_sample: bool
    batch_independent: frozenset[str] = frozenset()
    # (output, tensor it holds the values of): outputs whose statistics are copied, not binned
    same_values: tuple[tuple[str, str], ...] = ()
    # outputs whose range is recorded per index of the last axis too (LayerNorm outputs)
    channel_ranges: frozenset[str] = frozenset()
    # (tensor, axis): tensors whose exact sum is recorded per index of that axis
    channel_sums: tuple[tuple[str, int], ...] = ()


def same_values(model: onnx.ModelProto) -> dict[str, str]:
    """Node outputs that hold exactly the values of a tensor profiled per run (a graph input
    or another node output), mapped to that tensor, following chains of such ops."""
    graph = model.graph
    initialized = {t.name for t in graph.initializer}
    runtime = {vi.name for vi in graph.input} - initialized
    runtime |= {name for node in graph.node for name in node.output if name}
    source: dict[str, str] = {}
    for node in graph.node:  # topological order: a chain's source is resolved before its end
        if (node.op_type not in _SAME_VALUES or node.domain not in ("", "ai.onnx")
                or not node.input or not node.input[0] or not node.output
                or not node.output[0]):
            continue
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            continue  # training_mode given: it may drop values
        origin = source.get(node.input[0], node.input[0])
        if origin in runtime and origin != node.output[0]:
            source[node.output[0]] = origin
    return source


def channel_ranges(model: onnx.ModelProto) -> frozenset[str]:
    """The tensors whose range the profile records per channel of the last axis: the outputs
    of LayerNormalization, whose few outlier channels the quantizer smooths into the Gemms
    that read them (`quantizer.smooth`)."""
    return frozenset(node.output[0] for node in model.graph.node
                     if node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx")
                     and node.output and node.output[0])


def channel_sums(model: onnx.ModelProto) -> tuple[tuple[str, int], ...]:
    """(tensor, axis) for the data input of every Conv (axis 1), Gemm (axis 1, or 0 with
    transA) and MatMul (the last axis) whose weights are constant: the axis the node contracts,
    whose per-channel means the quantizer's bias correction needs (`--channel-means`)."""
    constant = {t.name for t in model.graph.initializer} | {
        out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    found: dict[str, int] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or len(node.input) < 2 or \
                node.input[1] not in constant or node.input[0] in constant:
            continue
        if node.op_type == "Conv":
            axis = 1
        elif node.op_type == "Gemm":
            trans = next((a.i for a in node.attribute if a.name == "transA"), 0)
            axis = 0 if trans else 1
        elif node.op_type == "MatMul":
            axis = -1
        else:
            continue
        found.setdefault(node.input[0], axis)
    return tuple(found.items())


def expose_all(model: onnx.ModelProto, free_batch: bool) -> bytes:
    """The model with every node output as a graph output (and, if asked, a free batch dim)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    graph = exposed.graph
    names = [o.name for o in graph.output]
    names += [name for node in graph.node for name in node.output if name]
    graph.ClearField("output")
    graph.ClearField("value_info")  # stale once the batch dimension is freed
    for name in dict.fromkeys(names):
        graph.output.add().name = name
    if free_batch:
        initialized = {t.name for t in graph.initializer}
        for vi in graph.input:
            if vi.name not in initialized:
                vi.type.tensor_type.shape.dim[0].dim_param = _BATCH_DIM
    return exposed.SerializeToString()


def make_session(model_bytes: bytes, threads: int = 0) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # onnxruntime's threads otherwise spin after each run, taking the cores the statistics
    # that follow every run need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Basic level only: no layout changes or contrib kernels, every value as the graph says.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # A failed load or run raises, and ember says so in its own one line; onnxruntime's log
    # lines (a warning about an old opset, an error while running a kernel) would come around
    # it on stderr, so they follow `set_log_severity` (fatal only, unless `ember --debug`).
    options.log_severity_level = _log_severity
    try:
        return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    except Exception as err:
        raise ProfileError(f"onnxruntime cannot load the model: {_first_line(err)}") from None


def probe(session: ort.InferenceSession, batch: dict[str, np.ndarray]) -> Plan:
    """Whether to run batches whole: only when a run's values stay small (beyond that,
    batching only adds memory) and running `batch` whole matches running its samples one by
    one."""
    n = _samples(batch)
    names = [o.name for o in session.get_outputs()]
    single = [_run(session, names, _sample(batch, 0))]
    if n < 2 or sum(getattr(v, "nbytes", 0) for v in single[0]) * n > _BATCH_BYTES:
        return Plan(per_sample=True)
    try:
        whole = session.run(names, batch)
    except Exception:  # e.g. a Reshape to a fixed batch of 1: run one sample at a time
        return Plan(per_sample=True)
    single += [_run(session, names, _sample(batch, i)) for i in range(1, n)]
    independent = set()
    for j, name in enumerate(names):
        together, alone = whole[j], [outputs[j] for outputs in single]
        if not isinstance(together, np.ndarray) or together.dtype.kind != "f":
            continue
        if together.shape == alone[0].shape and all(_close(together, a) for a in alone):
            independent.add(name)
        elif not (together.shape[:1] == (n,) and _close(together, np.concatenate(alone))):
            return Plan(per_sample=True)
    return Plan(per_sample=False, batch_independent=frozenset(independent))


class Runner:
    """Runs batches by the plan and accumulates statistics of every float input and output.

    Binning a run's values takes longer than the run itself on large models, and numpy
    releases the GIL in every step of it, so a flush spreads the tensors over as many threads
    as onnxruntime may use (one in a worker process, whose session has one thread). Each
    tensor is binned whole by one thread, in the order of its batches, so the statistics are
    the same as on one thread.
    """

    def __init__(self, session: ort.InferenceSession, plan: Plan, threads: int | None = None):
        self.session, self.plan = session, plan
        self.names = [o.name for o in session.get_outputs()]
        self.accumulators: dict[str, Accumulator] = {}
        self.same_values = dict(plan.same_values)
        self.sum_axes = dict(plan.channel_sums)
        self.threads = _binning_threads(session) if threads is None else max(1, threads)
        self.binners = [Binner() for _ in range(self.threads)]
        self.binner = self.binners[0]
        self.pool: ThreadPoolExecutor | None = None
        self.pending: dict[str, list[np.ndarray]] = {}
        self.pending_bytes = 0

    def run(self, feeds: dict[str, np.ndarray]) -> None:
        n = _samples(feeds)
        if self.plan.per_sample and n > 1:
            for i in range(n):
                self.run(_sample(feeds, i))
            return
        outputs = _run(self.session, self.names, feeds)
        self._hold("input", feeds.items())
        for name, value in zip(self.names, outputs):
            if name in self.same_values and name not in self.sum_axes:
                continue  # its statistics are copied from its source's in stats()
            if name in self.plan.batch_independent:
                self._accumulator(name, "activation", value).add(value, weight=n)
            else:
                self._hold("activation", [(name, value)])
        if self.pending_bytes >= _FLUSH_BYTES:
            self.flush()

    def stats(self) -> dict[str, TensorStats]:
        try:
            self.flush()
        finally:
            self.close()
        stats = {name: acc.stats() for name, acc in self.accumulators.items()}
        for name, origin in self.same_values.items():
            if origin in stats and name not in stats:  # (one summed per channel has its own)
                # Its values in another arrangement: the last axis's channels are not the same.
                stats[name] = replace(stats[origin], kind="activation", channel_min=None,
                                      channel_max=None, channel_sum=None)
        return stats

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def flush(self) -> None:
        items = list(self.pending.items())
        self.pending.clear()
        self.pending_bytes = 0
        groups = _split(items, self.threads)
        if len(groups) > 1:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(self.threads - 1,
                                               thread_name_prefix="ember-binning")
            futures = [self.pool.submit(self._bin, group, binner)
                       for group, binner in zip(groups[1:], self.binners[1:])]
            try:
                self._bin(groups[0], self.binners[0])
            finally:
                for future in futures:
                    future.result()
        else:
            self._bin(items, self.binner)

    def _bin(self, items: list[tuple[str, list[np.ndarray]]], binner: Binner) -> None:
        for name, parts in items:
            acc = self.accumulators[name]
            if acc.sum_axis is not None:  # its axes kept: each run's values as they came
                for part in parts:
                    acc.add(part, binner=binner)
                continue
            acc.add(parts[0] if len(parts) == 1 else
                    np.concatenate([p.reshape(-1, p.shape[-1]) if acc.channels and p.ndim
                                    else p.reshape(-1) for p in parts]),
                    binner=binner)

    def _hold(self, kind: str, named_values) -> None:
        for name, value in named_values:
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                self._accumulator(name, kind, value)
                self.pending.setdefault(name, []).append(value)
                self.pending_bytes += value.nbytes

    def _accumulator(self, name: str, kind: str, value: np.ndarray) -> Accumulator:
        if name not in self.accumulators:
            self.accumulators[name] = Accumulator(kind, str(value.dtype), self.binner,
                                                  channels=name in self.plan.channel_ranges,
                                                  sum_axis=self.sum_axes.get(name))
        return self.accumulators[name]


def _binning_threads(session: ort.InferenceSession) -> int:
    """As many threads as onnxruntime's session may use: its setting, or all our cores."""
    threads = session.get_session_options().intra_op_num_threads
    if threads <= 0:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
    return max(1, threads)


# Below this many values in all, a flush stays on one thread: handing work over costs more.
_THREAD_MIN_VALUES = 1 << 18


def _split(items: list[tuple[str, list[np.ndarray]]], threads: int) -> list[list]:
    """The pending tensors in `threads` groups of about equal size (largest first, each to the
    lightest group); fewer groups when there is little to do."""
    sizes = [sum(p.size for p in parts) for _, parts in items]
    if threads < 2 or len(items) < 2 or sum(sizes) < _THREAD_MIN_VALUES:
        return [items]
    groups: list[list] = [[] for _ in range(threads)]
    loads = [0] * threads
    for size, item in sorted(zip(sizes, items), key=lambda pair: -pair[0]):
        lightest = loads.index(min(loads))
        groups[lightest].append(item)
        loads[lightest] += size
    return [group for group in groups if group]


def _run(session: ort.InferenceSession, names: list[str], feeds: dict) -> list:
    try:
        return session.run(names, feeds)
    except Exception as err:
        raise ProfileError(f"onnxruntime failed: {_first_line(err)}") from None


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to the rounding that a different kernel or batch size may bring."""
    scale = float(np.nanmax(np.abs(b))) if b.size and np.isfinite(b).any() else 0.0
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-5 * scale,
                                              equal_nan=True)


def _sample(feeds: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    return {name: value[i:i + 1] for name, value in feeds.items()}


def _samples(feeds: dict[str, np.ndarray]) -> int:
    return len(next(iter(feeds.values())))


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
