"""Streaming statistics of one tensor: min, max, counts and a histogram in constant memory."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from profiler import histogram
from profiler.format import TensorStats, empty_stats


class Accumulator:
    """Takes batches of one tensor's values; `stats()` is exact whatever the batching.

    The counts live on a grid of MAX_BINS bins that starts at the bin of the minimum so far;
    a batch that widens the range re-bins them onto the coarser grid by exact summation.
    """

    def __init__(self, kind: str, dtype: str, binner: histogram.Binner):
        self.kind, self.dtype, self.binner = kind, dtype, binner
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

    def stats(self) -> TensorStats:
        if self.count == 0:
            return replace(empty_stats(self.kind, self.dtype), nonfinite=self.nonfinite)
        length = histogram.bin_index(self.hi, self.k) - self.first + 1
        return TensorStats(self.kind, self.dtype, self.lo, self.hi, self.count,
                           self.nonfinite, self.k, self.first, self.counts[:length].copy())
