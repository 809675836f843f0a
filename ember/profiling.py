"""Profiling where `--cluster` says: the data cut into shards of samples, each profiled by a
worker that reads its own samples from the data's path, the shards' statistics merged exactly.

A histogram's bins, a range and a per-channel sum do not depend on how the samples were
grouped (`profiler.histogram`, `profiler.accumulate.exact_sums`), and the data digest is made
of per-sample digests, so the profile equals, byte for byte, the one a single process makes.
"""

from __future__ import annotations

import math
from typing import Callable

import onnx

from ember.cluster import Cluster, Shared, cached
from ember.errors import EmberError
from profiler import run
from profiler.batching import Source
from profiler.format import Profile
from profiler.model_inputs import InputSpec
from profiler.session import Runner, log_severity, make_session, set_log_severity
from profiler.sources.python_hook import Hook

# Shards per worker: enough that a slow shard does not hold up the end of the run.
SHARDS_PER_WORKER = 4


def profile(cluster: Cluster, model: onnx.ModelProto, source: Source, specs: list[InputSpec],
            options: run.RunOptions, on_samples: Callable[[int], None] = lambda n: None
            ) -> Profile:
    """`profiler.run.profile`, run where `cluster` runs shards."""
    if cluster.where.address is None and cluster.where.processes == 1:
        return run.profile(model, source, specs, options, on_samples)
    if isinstance(source, Hook):
        raise EmberError(f"--data {source.ref}: a data hook makes its samples one after another "
                         f"in one process; use --cluster local, or save the samples to an .npz")
    setup = run.prepare(model, source, specs, options)
    total = source.count()
    if total is None:
        raise EmberError(f"--data: cannot tell how many samples {source.describe()} holds, "
                         f"so it cannot be cut into shards; use --cluster local")
    size = math.ceil(total / (SHARDS_PER_WORKER * cluster.workers))
    size = max(1, math.ceil(size / setup.batch)) * setup.batch  # whole runs of the model
    shared = Shared((setup, log_severity()))
    measured: dict[int, run.Measured] = {}
    position, kept = 0, 0
    # A --samples limit reads that many samples; samples skipped as non-finite are made up
    # from the ones after, in another round, as one process would have read on.
    while position < total and (options.samples is None or kept < options.samples):
        end = total if options.samples is None else min(total, position + options.samples - kept)
        spans = [(start, min(start + size, end)) for start in range(position, end, size)]
        for index, result in cluster.run(_profile_shard, shared, spans):
            measured[spans[index][0]] = result
            on_samples(result.samples)
        kept = sum(m.samples for m in measured.values())
        position = end
    shards = [measured[start] for start in sorted(measured)]
    if any(m.dropped for m in shards[:-1]):
        raise EmberError(f"the model's fixed batch of {setup.batch} and samples skipped as "
                         f"non-finite leave shards with partial batches; profile it with "
                         f"--cluster local")
    return run.finish(model, setup, options, shards)


def _profile_shard(shared: Shared, span: tuple[int, int]) -> run.Measured:
    """One shard, on a worker: its session made once and kept for the shards after."""
    setup, severity = shared.payload

    def session():
        set_log_severity(severity)  # workers do not inherit onnxruntime's setting
        return make_session(setup.model_bytes, threads=1)

    runner = Runner(cached(shared, "session", session), setup.plan)
    return run.measure(setup, span[0], span[1], None, runner=runner)
