"""Calibration data from any source, checked against the model and cut into batches.

A source yields chunks: `(origin, {input name: array with samples on the first axis})`, where
origin names the file or hook for error messages. `stream` checks every chunk against the
model's inputs, skips or rejects non-finite samples, and regroups samples into batches, holding
at most one batch at a time so memory does not grow with the number of samples.

A shard reads a window of the data, samples `start` to `stop` as the source numbers them
(before non-finite ones are skipped); a source that can skip to `start` without reading what
comes before has `chunks(start)`. The data digest is made of one digest per sample, so shards
of the data digest to what the whole does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import numpy as np

from profiler.errors import ProfileError
from profiler.model_inputs import InputSpec

LABELS = "labels"  # ground truth beside the inputs: ignored unless the model has such an input


Chunk = tuple[str, dict[str, np.ndarray]]


class Source(Protocol):
    def describe(self) -> dict: ...
    def count(self) -> int | None: ...
    def chunks(self, start: int = 0) -> Iterator[Chunk]: ...  # from sample `start`, or before


@dataclass
class Tally:
    """What a stream saw: its samples, the ones skipped as non-finite, each sample's digest."""

    samples: int = 0
    skipped_nonfinite: int = 0
    dropped: int = 0  # a last partial batch, for a model whose batch size is fixed
    read: int = 0  # samples read from the source, skipped ones included (its own numbering)
    sample_digests: list[bytes] = field(default_factory=list)

    def hexdigest(self) -> str:
        """The data's digest: sha256 of the samples' sha256s, in order."""
        return data_digest(self.sample_digests)


def data_digest(sample_digests: list[bytes]) -> str:
    return hashlib.sha256(b"".join(sample_digests)).hexdigest()


def stream(source: Source, specs: list[InputSpec], batch: int, whole: bool, limit: int | None,
           allow_nonfinite: bool, tally: Tally, start: int = 0, stop: int | None = None
           ) -> Iterator[dict[str, np.ndarray]]:
    """Checked batches of `batch` samples of the source's samples `start` to `stop`; a shorter
    last one is dropped when `whole`; `limit` counts the samples kept."""
    pending: list[dict[str, np.ndarray]] = []
    have = 0
    tally.read = start
    for origin, arrays in source.chunks(start):
        if (limit is not None and tally.samples >= limit) or tally.read == stop:
            break
        arrays = _checked(origin, arrays, specs)
        n = len(next(iter(arrays.values())))
        if stop is not None and tally.read + n > stop:
            n = stop - tally.read
            arrays = {name: a[:n] for name, a in arrays.items()}
        tally.read += n
        arrays = _finite(origin, arrays, tally, allow_nonfinite)
        n = len(next(iter(arrays.values())))
        if limit is not None and tally.samples + n > limit:
            n = limit - tally.samples
            arrays = {name: a[:n] for name, a in arrays.items()}
        for i in range(n):
            digest = hashlib.sha256()
            for spec in specs:
                digest.update(np.ascontiguousarray(arrays[spec.name][i]).data)
            tally.sample_digests.append(digest.digest())
        tally.samples += n
        pending.append(arrays)
        have += n
        while have >= batch:
            out, pending, have = _take(pending, batch), _drop(pending, batch), have - batch
            yield out
    if have and whole:
        tally.samples -= have
        tally.dropped = have
    elif have:
        yield _take(pending, have)


def skip(chunks: Iterator[Chunk], start: int, specs: list[InputSpec]) -> Iterator[Chunk]:
    """`chunks` from sample `start` on, for a source that cannot skip more cheaply than by
    reading: a chunk's arrays hold one sample, or samples on the first axis (as `_checked`
    reads them)."""
    spec = specs[0]
    for origin, arrays in chunks:
        if start <= 0:
            yield origin, arrays
            continue
        a = arrays.get(spec.name)
        if a is None or np.ndim(a) == len(spec.shape) - 1:  # one sample (or an error to come)
            n = 1
        else:
            n = len(a)
        if n <= start:
            start -= n
            continue
        yield origin, {name: v[start:] for name, v in arrays.items()}
        start = 0


def _take(pending: list[dict], n: int) -> dict[str, np.ndarray]:
    parts: dict[str, list] = {name: [] for name in pending[0]}
    need = n
    for arrays in pending:
        m = min(need, len(next(iter(arrays.values()))))
        for name, a in arrays.items():
            parts[name].append(a[:m])
        need -= m
        if not need:
            break
    return {name: p[0] if len(p) == 1 else np.concatenate(p) for name, p in parts.items()}


def _drop(pending: list[dict], n: int) -> list[dict]:
    out = []
    for arrays in pending:
        m = len(next(iter(arrays.values())))
        if n >= m:
            n -= m
            continue
        out.append({name: a[n:] for name, a in arrays.items()})
        n = 0
    return out


def _checked(origin: str, arrays: dict, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    """The chunk's arrays, each with a sample axis, or an error naming what does not fit."""
    wanted = [s.name for s in specs]
    names = [k for k in arrays if k != LABELS or k in wanted]
    for name in names:
        if name not in wanted:
            raise ProfileError(f"{origin}: '{name}' is not an input of the model "
                               f"(inputs: {', '.join(wanted)})")
    out = {}
    for spec in specs:
        if spec.name not in arrays:
            raise ProfileError(f"{origin}: no data for input '{spec.name}' "
                               f"(found: {', '.join(names) or 'nothing'})")
        a = found = np.asarray(arrays[spec.name])
        if a.dtype != spec.dtype:
            raise ProfileError(f"{origin}: input '{spec.name}' expects {spec.dtype}, found "
                               f"{a.dtype} (convert with .astype(np.{spec.dtype}))")
        if a.ndim == len(spec.shape) - 1:
            a = a[np.newaxis]  # one sample without its batch axis
        elif a.ndim == len(spec.shape) + 1 and a.shape[1:2] == (1,):
            a = a[:, 0]  # a stack of batch-of-one tensors, as onnxruntime readers keep them
        fits = a.ndim == len(spec.shape) and all(
            want is None or want == got for want, got in zip(spec.shape[1:], a.shape[1:]))
        if not fits:
            raise ProfileError(f"{origin}: input '{spec.name}' expects shape {spec} (samples "
                               f"on the first axis), found {list(found.shape)}")
        out[spec.name] = a
    counts = {name: len(a) for name, a in out.items()}
    if len(set(counts.values())) > 1:
        raise ProfileError(f"{origin}: inputs have different numbers of samples {counts}")
    return out


def _finite(origin: str, arrays: dict[str, np.ndarray], tally: Tally,
            allow: bool) -> dict[str, np.ndarray]:
    n = len(next(iter(arrays.values())))
    keep = np.ones(n, bool)
    for name, a in arrays.items():
        if a.dtype.kind != "f" or np.isfinite(a).all():
            continue
        bad = ~np.isfinite(a.reshape(n, -1)).all(axis=1)
        if not allow:
            sample = tally.read - n + int(np.argmax(bad))
            raise ProfileError(f"{origin}: input '{name}' has NaN or Inf in sample {sample} "
                               f"(pass --allow-nonfinite to skip such samples)")
        keep &= ~bad
    if keep.all():
        return arrays
    tally.skipped_nonfinite += int(n - keep.sum())
    return {name: a[keep] for name, a in arrays.items()}
