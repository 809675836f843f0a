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
        sums = exact_sums(np.moveaxis(values, axis, -1).reshape(-1, values.shape[axis]))
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


def exact_sums(rows: np.ndarray) -> list[int] | None:
    """Each column's sum of float32 values, exactly, in units of 2^-SUM_EXPONENT (None if a
    value is not finite).

    A float32 value is its 24-bit significand times 2^(e - 150) (e its biased exponent field;
    subnormals have e = 0 and count as e = 1 without the hidden bit), so the values sharing an
    exponent field sum exactly as integers (float64 holds sums of up to 2^29 of them exactly),
    and the 255 per-exponent sums are shifted into the common unit as Python integers, which
    never round, whatever the order: a sum over shards equals the sum over all the data.
    """
    rows = np.ascontiguousarray(rows, np.float32)
    bits = rows.view(np.uint32)
    field = (bits >> 23) & 0xFF
    if np.any(field == 0xFF):  # inf or nan
        return None
    significand = (bits & 0x7FFFFF) | np.where(field > 0, 0x800000, 0).astype(np.uint32)
    signed = np.where(bits >> 31, -significand.astype(np.float64), significand)
    columns = rows.shape[1]
    keys = (field.astype(np.intp) * columns + np.arange(columns)).reshape(-1)
    per = np.bincount(keys, weights=signed.reshape(-1), minlength=256 * columns)
    per = per.reshape(256, columns)
    totals = [0] * columns
    for e in np.flatnonzero(np.any(per != 0, axis=1)).tolist():
        shift = max(e, 1) - 150 + SUM_EXPONENT  # significand * 2^(max(e, 1) - 150)
        totals = [t + (int(v) << shift) for t, v in zip(totals, per[e].tolist())]
    return totals
