"""Shards of a data source: ranges of sample indices, each read by a worker from the source.

A worker gets the source object (paths, never arrays) and the range [start, stop) of raw sample
indices it evaluates, and reads only that range: folders skip the files before it without
decoding them; within a file, the chunks before it are read and dropped (a compressed .npz
cannot be entered in the middle). Ranges start on whole batches of the model, so each shard
cuts the data into the batches one process would.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from profiler.batching import Chunk, Source
from profiler.model_inputs import InputSpec
from profiler.sources.arrays import ArrayDirectory, ArrayFile
from profiler.sources.images import ImageFolder

# Shards per worker: enough that a slow shard at the end leaves the other workers little idle
# time, few enough that each file source is skipped through only a few times.
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


def plan(total: int | None, limit: int | None, batch: int, workers: int) -> list[SampleRange]:
    """Ranges covering the first `total` samples (at most `limit`), each a whole number of
    `batch` samples (the last excepted), about SHARDS_PER_WORKER per worker. The last range
    runs to the end of the data unless `limit` ends it, so a source holding more samples than
    it counted is read whole, as one process would. Empty when `total` is unknown."""
    if total is None:
        return []
    if limit is not None:
        total = min(total, limit)
    batches = max(1, math.ceil(total / batch))
    shards = max(1, min(batches, SHARDS_PER_WORKER * workers))
    step = math.ceil(batches / shards) * batch
    starts = list(range(0, max(total, 1), step))
    return [SampleRange(start, start + step if n + 1 < len(starts) else limit)
            for n, start in enumerate(starts)]


def open_ranges(batch: int, limit: int | None) -> Iterator[SampleRange]:
    """Ranges of OPEN_SHARD_SAMPLES (rounded up to whole batches) for a source that cannot
    count its samples, without end: the caller stops drawing once one comes back short."""
    step = math.ceil(OPEN_SHARD_SAMPLES / batch) * batch
    start = 0
    while limit is None or start < limit:
        yield SampleRange(start, start + step if limit is None else min(start + step, limit))
        start += step


class RangeSource:
    """The samples `start` .. `stop` of `source`, as a source of chunks: what a shard reads."""

    def __init__(self, source: Source, specs: list[InputSpec], sample_range: SampleRange):
        self.specs, self.range = specs, sample_range
        self.source, self.first = _skip_files(source, specs, sample_range.start,
                                              sample_range.stop)

    def describe(self) -> dict:
        return self.source.describe()

    def count(self) -> int | None:
        return self.range.length

    def chunks(self) -> Iterator[Chunk]:
        """The source's chunks within the range: those before `start` dropped, those across
        an end cut."""
        position, start, stop = self.first, self.range.start, self.range.stop
        if stop is not None and position >= stop:
            return
        for origin, arrays in self.source.chunks():
            n = _samples(arrays, self.specs)
            if n is None:  # malformed: `batching.stream` names what is wrong
                yield origin, arrays
                continue
            first = max(start - position, 0)
            end = n if stop is None else min(n, stop - position)
            if first < end:
                yield origin, arrays if (first, end) == (0, n) else \
                    _rows(arrays, self.specs, first, end)
            position += n
            if stop is not None and position >= stop:  # before the next file is read
                return


def _skip_files(source: Source, specs: list[InputSpec], start: int,
                stop: int | None) -> tuple[Source, int]:
    """`source` without its whole files before sample `start` (and an image folder without
    those from `stop`), read from the headers or counted as one image each, never decoded;
    and the index of its first remaining sample."""
    if isinstance(source, ImageFolder):  # one sample per image
        skipped = copy.copy(source)
        skipped.files = source.files[start:stop]
        return skipped, min(start, len(source.files))
    if isinstance(source, ArrayDirectory):
        first = 0
        for n, file in enumerate(source.files):
            count = ArrayFile(file, specs).count()
            if count is None or first + count > start:
                skipped = copy.copy(source)
                skipped.files = source.files[n:]
                return skipped, first
            first += count
        skipped = copy.copy(source)
        skipped.files = []
        return skipped, first
    return source, 0


def _samples(arrays: dict[str, np.ndarray], specs: list[InputSpec]) -> int | None:
    """How many samples a raw chunk holds, as `batching.stream` counts them (one sample
    without its batch axis counts one); None when the first input is missing."""
    spec = specs[0]
    if spec.name not in arrays:
        return None
    shape = np.shape(arrays[spec.name])
    if len(shape) == len(spec.shape) - 1:
        return 1
    return shape[0] if shape else None


def _rows(arrays: dict[str, np.ndarray], specs: list[InputSpec], first: int,
          end: int) -> dict[str, np.ndarray]:
    """The chunk's samples first .. end (on each input's sample axis)."""
    names = {spec.name for spec in specs}
    return {name: np.asarray(a)[first:end] if name in names else a
            for name, a in arrays.items()}
