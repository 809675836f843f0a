"""Profiling where `--cluster` says: the data cut into shards of samples, each profiled by a
worker that reads its own samples from the data's path, the shards' statistics merged exactly.

A histogram's bins, a range and a per-channel sum do not depend on how the samples were
grouped (`profiler.histogram`, `profiler.accumulate.exact_sums`), and the data digest is made
of per-sample digests, so the profile equals, byte for byte, the one a single process makes.
"""

from __future__ import annotations

from typing import Callable

import onnx

from ember import shards
from ember.cluster import Cluster, Shared, cached
from ember.errors import EmberError
from profiler import run
from profiler.batching import Source
from profiler.format import Profile
from profiler.model_inputs import InputSpec
from profiler.session import Runner, log_severity, make_session, set_log_severity

def profile(cluster: Cluster, model: onnx.ModelProto, source: Source, specs: list[InputSpec],
            options: run.RunOptions, on_samples: Callable[[int], None] = lambda n: None
            ) -> Profile:
    """`profiler.run.profile`, run where `cluster` runs shards (`ember.shards` plans them)."""
    if cluster.where.address is None and cluster.where.processes == 1:
        return run.profile(model, source, specs, options, on_samples)
    setup = run.prepare(model, source, specs, options)
    shared = Shared((setup, log_severity()))
    measured: list[run.Measured] = []
    position, kept, ended = 0, 0, False
    # A --samples limit reads that many samples; samples skipped as non-finite are made up
    # from the ones after, in another round, as one process would have read on.
    while not ended and (options.samples is None or kept < options.samples):
        need = None if options.samples is None else options.samples - kept
        ranges = shards.plan(source.count(), need, setup.batch, cluster.workers, position) \
            or shards.open_ranges(setup.batch, need, position)
        done, ended = shards.gather(cluster, _profile_shard, shared, ranges,
                                    read=lambda m: m.read,
                                    on_result=lambda m: on_samples(m.samples),
                                    shard=lambda r: (r.start, r.stop))
        measured += [m for _, m in done]
        kept = sum(m.samples for m in measured)
        position = done[-1][0].start + done[-1][1].read
    shards_in_order = [m for m in measured if m.read]
    if any(m.dropped for m in shards_in_order[:-1]):
        raise EmberError(f"the model's fixed batch of {setup.batch} and samples skipped as "
                         f"non-finite leave shards with partial batches; profile it with "
                         f"--cluster local")
    return run.finish(model, setup, options, shards_in_order or measured[:1])


def _profile_shard(shared: Shared, span: tuple[int, int]) -> run.Measured:
    """One shard, on a worker: its session made once and kept for the shards after."""
    setup, severity = shared.payload

    def session():
        set_log_severity(severity)  # workers do not inherit onnxruntime's setting
        return make_session(setup.model_bytes, threads=1)

    runner = Runner(cached(shared, "session", session), setup.plan)
    return run.measure(setup, span[0], span[1], None, runner=runner)
