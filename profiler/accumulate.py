"""Streaming statistics of one tensor: min, max, counts and a histogram in constant memory."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from profiler import histogram
from profiler.format import SUM_EXPONENT, TensorStats, empty_stats


class Accumulator:
    """Takes batches of one tensor's values; `stats()` is exact whatever the batching.

    The counts live on a grid of MAX_BINS bins that starts at the bin of the minimum so far;
    a batch that widens the range re-bins them onto the coarser grid by exact summation.
    """

    def __init__(self, kind: str, dtype: str, binner: histogram.Binner,
                 channels: bool = False, sum_axis: int | None = None):
        self.kind, self.dtype, self.binner = kind, dtype, binner
        # With `channels`, each index of the last axis's range too (`TensorStats.channel_min`).
        self.channels = channels
        # With `sum_axis`, each index of that axis's exact sum (`TensorStats.channel_sum`):
        # only for float32 and float16 values, all finite, the axis the same length throughout.
        self.sum_axis = sum_axis if dtype in ("float32", "float16") else None
        self.channel_sum: list[int] | None = None
        self.channel_min: np.ndarray | None = None
        self.channel_max: np.ndarray | None = None
        self.lo = self.hi = 0.0
        self.count = self.nonfinite = 0
        self.k = self.first = 0
        self.counts = np.zeros(histogram.MAX_BINS, np.int64)

    def add(self, values: np.ndarray, weight: int = 1,
            binner: histogram.Binner | None = None) -> None:
        """Count `values` (`weight` times: an output that is the same for every sample).

        `binner` overrides the accumulator's own, so that threads binning different tensors
        at once each use their own scratch buffers.
        """
        if self.channels and values.ndim and values.size:
            self._add_channels(values.reshape(-1, values.shape[-1]))
        if self.sum_axis is not None and values.size:
            self._add_sums(values, weight)
        flat = values.reshape(-1)
        if flat.dtype == np.float16:
            flat = flat.astype(np.float32)
        if flat.size == 0:
            return
        lo, hi = flat.min(), flat.max()
        if not (np.isfinite(lo) and np.isfinite(hi)):
            finite = flat[np.isfinite(flat)]
            self.nonfinite += (flat.size - finite.size) * weight
            if finite.size == 0:
                return
            flat, lo, hi = finite, finite.min(), finite.max()
        lo, hi = float(lo), float(hi)
        if self.count:
            lo, hi = min(lo, self.lo), max(hi, self.hi)
        k = histogram.width_log2(lo, hi)
        first = histogram.bin_index(lo, k)
        if self.count and (k, first) != (self.k, self.first):
            self.counts = histogram.rebin(self.counts, self.first, self.k, first, k,
                                          histogram.MAX_BINS)
        counts = (binner or self.binner).count(flat, k, first, histogram.MAX_BINS)
        if weight != 1:
            counts *= weight
        self.counts += counts
        self.lo, self.hi, self.k, self.first = lo, hi, k, first
        self.count += flat.size * weight

    def _add_channels(self, rows: np.ndarray) -> None:
        """Each column's finite minimum and maximum so far (a column with none keeps +-inf
        until one comes; `stats` leaves the pair out if any column never had one)."""
        rows = rows.astype(np.float64)
        finite = np.isfinite(rows)
        low = np.where(finite, rows, np.inf).min(axis=0)
        high = np.where(finite, rows, -np.inf).max(axis=0)
        if self.channel_min is None or self.channel_min.shape != low.shape:
            if self.channel_min is not None:  # a last axis that changes: no channels
                self.channels = False
                self.channel_min = self.channel_max = None
                return
            self.channel_min, self.channel_max = low, high
        else:
            np.minimum(self.channel_min, low, out=self.channel_min)
            np.maximum(self.channel_max, high, out=self.channel_max)

    def _add_sums(self, values: np.ndarray, weight: int) -> None:
        """Add each channel's exact sum; give them up for good on a non-finite value or a
        channel count that changes."""
        axis = self.sum_axis if self.sum_axis >= 0 else values.ndim + self.sum_axis
        if not 0 <= axis < values.ndim or (self.channel_sum is not None and
                                           len(self.channel_sum) != values.shape[axis]):
            self.sum_axis, self.channel_sum = None, None
            return
        sums = exact_sums(values, axis)
        if sums is None:
            self.sum_axis, self.channel_sum = None, None
            return
        if weight != 1:
            sums = [s * weight for s in sums]
        self.channel_sum = sums if self.channel_sum is None else \
            [a + b for a, b in zip(self.channel_sum, sums)]

    def stats(self) -> TensorStats:
        if self.count == 0:
            return replace(empty_stats(self.kind, self.dtype), nonfinite=self.nonfinite)
        length = histogram.bin_index(self.hi, self.k) - self.first + 1
        channels = self.channels and self.channel_min is not None and \
            bool(np.all(np.isfinite(self.channel_min)))
        return TensorStats(self.kind, self.dtype, self.lo, self.hi, self.count,
                           self.nonfinite, self.k, self.first, self.counts[:length].copy(),
                           self.channel_min.copy() if channels else None,
                           self.channel_max.copy() if channels else None,
                           tuple(self.channel_sum) if self.channel_sum is not None and
                           self.sum_axis is not None and not self.nonfinite else None)


# exact_sums works in blocks of about this many values, which stay in the caches.
_SUM_BLOCK = 1 << 16
# float64 sums of 24-bit integers are exact up to 2^29 terms: longer sums split.
_SUM_TERMS = 1 << 28
# np.frexp's exponent over float32 values: -148 (the least subnormal) .. 128.
_LEAST_EXPONENT, _EXPONENTS = -148, 277


def exact_sums(values: np.ndarray, axis: int = -1) -> list[int] | None:
    """The exact sum of the float32 `values` for each index of `axis`, in units of
    2^-SUM_EXPONENT (None if a value is not finite).

    `np.frexp` writes a float32 value as m * 2^e with m * 2^24 a whole number below 2^24
    (subnormals too), so the values sharing an exponent sum exactly in float64 as multiples of
    2^-24 (up to 2^29 of them); the 277 per-exponent sums are then shifted into the common unit
    as Python integers, which never round, whatever the order: a sum over shards equals the sum
    over all the data. The values are read in place, block by block (no transposed copy).
    """
    values = np.ascontiguousarray(values, np.float32)
    axis = axis % values.ndim
    channels = values.shape[axis]
    inner = int(np.prod(values.shape[axis + 1:], dtype=np.int64))
    flat = values.reshape(-1)
    if not np.isfinite(flat).all():
        return None
    per = np.zeros(_EXPONENTS * channels)
    totals, pending = [0] * channels, 0
    # The last axis: blocks of whole rows share one pattern of channel indices.
    step = max(1, _SUM_BLOCK // channels) * channels if inner == 1 else _SUM_BLOCK
    pattern = np.tile(np.arange(channels), step // channels) if inner == 1 else None
    for start in range(0, flat.size, step):
        block = flat[start:start + step]
        if pending + block.size > _SUM_TERMS:  # before any sum could pass 2^29 terms
            totals, pending = _shifted(per, channels, totals), 0
            per[:] = 0.0
        mantissa, exponent = np.frexp(block)
        keys = (exponent - _LEAST_EXPONENT) * channels
        keys += pattern[:block.size] if pattern is not None else \
            _channel_runs(start, block.size, inner, channels)
        per += np.bincount(keys, weights=mantissa, minlength=per.size)
        pending += block.size
    return _shifted(per, channels, totals)


def _channel_runs(start: int, size: int, inner: int, channels: int) -> np.ndarray:
    """The channel index of flat positions start .. start + size of a tensor whose channel
    axis is followed by `inner` values: runs of `inner` equal indices."""
    first, last = start // inner, (start + size - 1) // inner
    lengths = np.full(last - first + 1, inner)
    lengths[0] = min(inner - start % inner, size)
    if last > first:
        lengths[-1] = (start + size) - last * inner
    return np.repeat(np.arange(first, last + 1) % channels, lengths)


def _shifted(per: np.ndarray, channels: int, totals: list[int]) -> list[int]:
    """`totals` plus the per-exponent sums of mantissas `per`, in units of 2^-SUM_EXPONENT."""
    per = (per * 2.0**24).reshape(-1, channels)  # whole numbers, below 2^53
    for k in np.flatnonzero(np.any(per != 0, axis=1)).tolist():
        shift = k + _LEAST_EXPONENT - 24 + SUM_EXPONENT  # m 2^24 * 2^(e - 24), e = k - 148
        row = per[k].astype(np.int64).tolist()
        totals = [t + (v << shift if shift >= 0 else v >> -shift) for t, v in zip(totals, row)]
    return totals
