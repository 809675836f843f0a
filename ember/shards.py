"""Shards of a data source: ranges of sample indices, each read by a worker from the source.

A worker gets the source object (paths, never arrays) and the range [start, stop) of raw sample
indices it works on, and reads only that range (`batching.stream(..., start, stop)`: an
.npy/.npz seeks to the range's first row, folders skip the files before it unread). Ranges
start on whole batches of the model, so each shard cuts the data into the batches one process
would. `ember.profiling` and `ember.accuracy` plan their shards here.
"""

from __future__ import annotations

import math
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from ember.errors import EmberError, user_error_types

# Shards per worker: enough that a slow shard at the end leaves the other workers little idle
# time (64 workers: 256 shards), few enough that each costs little to start (`bench_shards`).
SHARDS_PER_WORKER = 4
# Samples per shard when the source cannot count its samples (a hook): shards are then drawn
# until one comes back short.
OPEN_SHARD_SAMPLES = 64


@dataclass(frozen=True)
class SampleRange:
    """Raw sample indices start .. stop (None: to the end of the data)."""

    start: int
    stop: int | None

    @property
    def length(self) -> int | None:
        return None if self.stop is None else self.stop - self.start


def plan(total: int | None, limit: int | None, batch: int, workers: int,
         start: int = 0) -> list[SampleRange]:
    """Ranges covering samples `start` to `total` (at most `limit` of them), each a whole
    number of `batch` samples (the last excepted), about SHARDS_PER_WORKER per worker. The last
    range runs to the end of the data unless `limit` ends it, so a source holding more samples
    than it counted is read whole, as one process would. Empty when `total` is unknown."""
    if total is None:
        return []
    end = total if limit is None else min(total, start + limit)
    batches = max(1, math.ceil((end - start) / batch))
    shards = max(1, min(batches, SHARDS_PER_WORKER * workers))
    step = math.ceil(batches / shards) * batch
    starts = list(range(start, max(end, start + 1), step))
    last = None if limit is None else start + limit
    return [SampleRange(first, first + step if n + 1 < len(starts) else last)
            for n, first in enumerate(starts)]


def open_ranges(batch: int, limit: int | None, start: int = 0) -> Iterator[SampleRange]:
    """Ranges of OPEN_SHARD_SAMPLES (rounded up to whole batches) from `start`, for a source
    that cannot count its samples, without end: the caller stops drawing once one comes back
    short. Each such shard reads the source from its beginning to reach its start (a hook makes
    its samples one after another), so it must give the same samples every time."""
    step = math.ceil(OPEN_SHARD_SAMPLES / batch) * batch
    end = None if limit is None else start + limit
    while end is None or start < end:
        yield SampleRange(start, start + step if end is None else min(start + step, end))
        start += step


@dataclass(frozen=True)
class Failed:
    """A shard's user error, returned rather than raised so that the run can name the first
    failing sample, as one process would meet it."""

    message: str


def gather(running, function: Callable[[Any, Any], Any], shared, ranges: Iterable[SampleRange],
           read: Callable[[Any], int], on_result: Callable[[Any], None] = lambda r: None,
           shard: Callable[[SampleRange], Any] = lambda r: r
           ) -> tuple[list[tuple[SampleRange, Any]], bool]:
    """Run `function(shared, shard(range))` over `ranges` where `running` (an
    `ember.cluster.Cluster`) runs shards, drawing ranges lazily: none after a shard that read
    fewer samples than its range holds (`read(result)`: the data ran out) or one that failed.
    Returns the (range, result) pairs in sample order and whether the data ran out; a user
    error raises as the earliest failing shard's, once every shard before it is in."""
    stop = False
    asked: list[SampleRange] = []

    def drawn():
        for sample_range in ranges:
            if stop:
                return
            asked.append(sample_range)
            yield function, shard(sample_range)

    results: dict[int, Any] = {}
    failed: dict[int, str] = {}
    ended = False
    with closing(running.run(_guarded, shared, drawn())) as finished:
        for index, result in finished:
            if isinstance(result, Failed):
                failed[index] = result.message
                stop = True
            else:
                results[index] = result
                on_result(result)
                length = asked[index].length
                if length is None or read(result) < length:
                    stop = ended = True
            if failed and all(i in results or i in failed for i in range(min(failed))):
                break
    if failed:
        raise EmberError(failed[min(failed)])
    return [(asked[i], results[i]) for i in sorted(results)], ended


def _guarded(shared, item) -> Any:
    """A shard on a worker (module level: pickled by reference): its result, or its user
    error as a Failed."""
    function, shard = item
    try:
        return function(shared, shard)
    except user_error_types() as err:
        return Failed(str(err))
