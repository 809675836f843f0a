"""Profile a model: stream calibration data through onnxruntime and record every tensor.

Inputs, weights and every node output are profiled (float tensors only: those are what the
quantizer quantizes). Memory holds one batch and one histogram per tensor, whatever the
number of samples. Shards of the data (`measure`) merge exactly into the same profile (`finish`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from profiler import batching
from profiler.accumulate import Accumulator
from profiler.errors import ProfileError
from profiler.fingerprint import any_size, fingerprint
from profiler.format import Profile, TensorStats, merge_stats, tool_version
from profiler.histogram import Binner
from profiler.model_inputs import InputSpec
from profiler.session import (Plan, Runner, channel_ranges, channel_sums, expose_all,
                              make_session, probe, same_values)


# Larger samples come fewer to a batch: their models run one sample at a time anyway, and the
# memory held for a batch stays small.
_BATCH_INPUT_BYTES = 4 << 20


@dataclass(frozen=True)
class RunOptions:
    batch: int = 32  # most samples per onnxruntime run, where the batch dimension allows
    samples: int | None = None  # stop after this many samples
    allow_nonfinite: bool = False
    # record each Conv/Gemm/MatMul input's exact per-channel sums (bias correction's means)
    channel_means: bool = False


@dataclass(frozen=True)
class Setup:
    """What every shard of a run needs (picklable, sent once to each worker): the model with
    every tensor exposed, how to run it, and where its data comes from."""

    model_bytes: bytes
    plan: Plan
    source: batching.Source
    specs: tuple[InputSpec, ...]
    batch: int  # samples per onnxruntime run
    whole: bool  # the model fixes a batch above 1: a shorter last batch is dropped
    allow_nonfinite: bool


@dataclass(frozen=True)
class Measured:
    """One shard's statistics and what it read; shards merge exactly (`finish`)."""

    stats: dict[str, TensorStats]
    sample_digests: tuple[bytes, ...]
    samples: int  # kept
    read: int  # read from the source, skipped ones included
    skipped_nonfinite: int
    dropped: int


def load_model(path: str | Path) -> onnx.ModelProto:
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:
        raise ProfileError(f"{path}: not a valid ONNX model ({str(err).strip().splitlines()[0]})"
                           ) from None
    # -1 as the named dynamic dimension it means (`fingerprint.any_size`; the compiler's loader,
    # which may not import the profiler, does the same: `compiler.frontend.onnx`).
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if any_size(dim):
                dim.dim_param = "?"
    return model


def profile(model: onnx.ModelProto, source: batching.Source, specs: list[InputSpec],
            options: RunOptions, on_samples: Callable[[int], None] = lambda n: None) -> Profile:
    """Run the data through the model in this process; `on_samples(n)` reports progress as
    batches finish. Shards of the data run elsewhere go through `prepare`, `measure` and
    `finish` (`ember.profiling`), with the same result."""
    setup, session, tally, batches = _begin(model, source, specs, options)
    runner = Runner(session, setup.plan)
    return finish(model, setup, options, [_measure(runner, batches, tally, 0, on_samples)])


def prepare(model: onnx.ModelProto, source: batching.Source, specs: list[InputSpec],
            options: RunOptions) -> Setup:
    """The setup of a run in shards. The first batch is read here, to probe whether the
    model may run batched and to fail early on bad data."""
    return _begin(model, source, specs, options)[0]


def measure(setup: Setup, start: int, stop: int | None, limit: int | None,
            on_samples: Callable[[int], None] = lambda n: None,
            runner: Runner | None = None) -> Measured:
    """Statistics of the source's samples `start` to `stop` (at most `limit` kept), run with
    `runner` (default: a one-thread session of this process's own)."""
    if runner is None:
        runner = Runner(make_session(setup.model_bytes, threads=1), setup.plan)
    tally = batching.Tally()
    batches = batching.stream(setup.source, list(setup.specs), setup.batch, setup.whole, limit,
                              setup.allow_nonfinite, tally, start, stop)
    return _measure(runner, batches, tally, start, on_samples)


def _begin(model, source, specs, options) -> tuple[Setup, object, batching.Tally, Iterator]:
    """The setup, this process's session, and the stream of batches with its first put back."""
    fixed = _fixed_batch(specs)
    whole = fixed not in (None, 1)  # a fixed batch above 1 takes exactly that many samples
    run_batch = fixed if whole else _batch_size(specs, options.batch)
    tally = batching.Tally()
    batches = batching.stream(source, specs, run_batch, whole, options.samples,
                              options.allow_nonfinite, tally)
    first = next(batches, None)
    if first is None:
        raise ProfileError(_no_samples(source, tally, run_batch))
    model_bytes = expose_all(model, free_batch=fixed == 1)
    session = make_session(model_bytes)
    plan = Plan(per_sample=False) if whole else probe(session, first)
    # Outputs of Reshape, Transpose and the like hold their input's values: binned once.
    plan = replace(plan, same_values=tuple(same_values(model).items()),
                   channel_ranges=channel_ranges(model),
                   channel_sums=channel_sums(model) if options.channel_means else ())
    setup = Setup(model_bytes, plan, source, tuple(specs), run_batch, whole,
                  options.allow_nonfinite)
    return setup, session, tally, itertools.chain([first], batches)


def _measure(runner: Runner, batches: Iterator, tally: batching.Tally, start: int,
             on_samples: Callable[[int], None]) -> Measured:
    for batch in batches:
        runner.run(batch)
        on_samples(len(next(iter(batch.values()))))
    return Measured(runner.stats(), tuple(tally.sample_digests), tally.samples,
                    tally.read - start, tally.skipped_nonfinite, tally.dropped)


def finish(model: onnx.ModelProto, setup: Setup, options: RunOptions,
           shards: list[Measured]) -> Profile:
    """The profile of the shards, in the order they cover the data."""
    samples = sum(m.samples for m in shards)
    skipped = sum(m.skipped_nonfinite for m in shards)
    dropped = sum(m.dropped for m in shards)
    if samples == 0:
        raise ProfileError(_no_samples(setup.source, batching.Tally(
            skipped_nonfinite=skipped, dropped=dropped), setup.batch))
    merged: dict[str, TensorStats] = {}
    for shard in shards:
        for name, stats in shard.stats.items():
            merged[name] = merge_stats(merged[name], stats) if name in merged else stats
    run = {"options": {"batch": setup.batch, "samples": options.samples,
                       "allow_nonfinite": options.allow_nonfinite,
                       **({"channel_means": True} if options.channel_means else {}),
                       "input_shapes": {s.name: list(s.shape) for s in setup.specs}},
           "data": {**setup.source.describe(), "sha256": batching.data_digest(
               [d for shard in shards for d in shard.sample_digests])},
           "per_sample_runs": setup.plan.per_sample,
           "samples": samples, "skipped_nonfinite": skipped, "dropped": dropped}
    tensors = _in_graph_order(model, {**merged, **_weights(model)})
    return Profile(fingerprint(model), tool_version(), samples, (run,), tensors)


def _batch_size(specs: list[InputSpec], most: int) -> int:
    """At most `most` samples, and no more than _BATCH_INPUT_BYTES of input at once."""
    sample_bytes = sum(int(np.prod([d or 1 for d in s.shape[1:]])) * s.dtype.itemsize
                       for s in specs)
    return max(1, min(most, _BATCH_INPUT_BYTES // max(sample_bytes, 1)))


def _fixed_batch(specs: list[InputSpec]) -> int | None:
    """The batch size the model fixes, if it fixes one (all inputs must agree)."""
    fixed = {s.fixed_batch for s in specs if s.fixed_batch is not None}
    if len(fixed) > 1:
        raise ProfileError(f"the model's inputs fix different batch sizes: "
                           f"{', '.join(f'{s.name}{s}' for s in specs)}")
    return fixed.pop() if fixed else None


def _weights(model: onnx.ModelProto) -> dict[str, TensorStats]:
    """Weights are seen once, whatever the number of samples."""
    out, binner = {}, Binner()
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.dtype.kind == "f":
            acc = Accumulator("weight", str(array.dtype), binner)
            acc.add(array)
            out[init.name] = acc.stats()
    return out


def _in_graph_order(model: onnx.ModelProto, stats: dict[str, TensorStats]) -> dict:
    """Inputs, then weights, then node outputs as the graph lists them: a stable file order."""
    names = [vi.name for vi in model.graph.input]
    names += [t.name for t in model.graph.initializer]
    names += [out for node in model.graph.node for out in node.output]
    return {name: stats[name] for name in dict.fromkeys(names) if name in stats}


def _no_samples(source: batching.Source, tally: batching.Tally, batch: int) -> str:
    where = source.describe().get("path") or source.describe().get("hook") or "--data"
    if tally.skipped_nonfinite:
        return (f"{where}: no samples left: all {tally.skipped_nonfinite} had NaN or Inf "
                f"and were skipped")
    if tally.dropped:
        return (f"{where}: only {tally.dropped} samples, fewer than the model's fixed batch "
                f"size {batch}")
    return f"{where}: no samples (the data is empty)"
