"""Histograms on a power-of-two grid, so that re-binning and merging are exact.

Bin ``i`` of a histogram with width exponent ``k`` holds the values ``x`` with
``floor(x / 2**k) == i``. Doubling the width maps bin ``i`` to bin ``i >> 1``, so coarsening
only sums neighbouring bins, and binning a value finely and then coarsening gives the same bin
as binning it coarsely at once. The width a histogram ends with, ``width_log2(min, max)``,
depends only on the range of all the data, never on the order or the grouping of batches:
streamed, sharded and merged runs over the same data give identical counts.
"""

from __future__ import annotations

import math

import numpy as np

# At most this many bins between min and max, so at least MAX_BINS/2 of them (2048, enough for
# entropy calibration) fall inside the range whenever the data is not a constant.
MAX_BINS = 4096

# Bins never get finer than 2**-FINEST_BITS of the largest magnitude: far below float32
# resolution, and it keeps every bin index below 2**41, exact in int64 and in float64.
FINEST_BITS = 40
_SMALLEST_NORMAL_F32 = 2.0**-126
_BLOCK = 1 << 18  # values binned at a time: 3 MiB of scratch


def bin_index(value: float, k: int) -> int:
    """The bin of one value at width 2**k (exact: scaling by a power of two does not round)."""
    return math.floor(math.ldexp(value, -k))


def width_log2(lo: float, hi: float) -> int:
    """The narrowest width 2**k that covers [lo, hi] with at most MAX_BINS bins."""
    magnitude = max(abs(lo), abs(hi), _SMALLEST_NORMAL_F32)
    k = math.frexp(magnitude)[1] - FINEST_BITS
    if hi > lo:
        k = max(k, math.floor(math.log2((hi - lo) / MAX_BINS)))
    while bin_index(hi, k) - bin_index(lo, k) >= MAX_BINS:
        k += 1
    return k


def rebin(counts: np.ndarray, first: int, k: int, new_first: int, new_k: int,
          length: int) -> np.ndarray:
    """Counts on the grid (first, k) moved onto the coarser or equal grid (new_first, new_k)."""
    out = np.zeros(length, dtype=np.int64)
    used = np.flatnonzero(counts)
    targets = ((used + first) >> (new_k - k)) - new_first
    np.add.at(out, targets, counts[used])
    return out


class Binner:
    """Counts values on a grid, vectorised over the flattened batch.

    It works in blocks that stay in cache across its five passes, and reuses its scratch
    buffers: fresh arrays of a large tensor's size cost a page fault per 4 KiB, which
    measured several times the arithmetic itself.
    """

    def __init__(self):
        self._scratch: dict[type, np.ndarray] = {}

    def count(self, values: np.ndarray, k: int, first: int, length: int) -> np.ndarray:
        """Counts of the (finite) values on the grid (first, k).

        Every step is exact. Scaling by 2**-k with -126 < k <= 0 cannot overflow or underflow
        float32 (|x / 2**k| < 2**41), so the common case stays in float32; other grids use
        float64, where every float32 value scales exactly. Subtracting `first` is exact too,
        since each difference is representable: with first >= 0 every value is non-negative,
        so the difference keeps the value's fraction and truncating it floors; with first < 0
        the values are floored first, and the difference is a small integer.
        """
        in_f32 = -126 < k <= 0 and values.dtype != np.float64
        work = np.float32 if in_f32 else np.float64
        counts = np.zeros(length, np.int64)
        for start in range(0, values.size, _BLOCK):
            block = values[start:start + _BLOCK]
            scaled = self._buffer(work, block.size)
            np.multiply(block, work(2.0**-k), out=scaled)
            if first < 0:
                np.floor(scaled, out=scaled)
            if first:
                np.subtract(scaled, work(first), out=scaled)
            index = self._buffer(np.intp, block.size)
            np.copyto(index, scaled, casting="unsafe")
            counts += np.bincount(index, minlength=length)
        return counts

    def _buffer(self, dtype: type, size: int) -> np.ndarray:
        buffer = self._scratch.get(dtype)
        if buffer is None:
            buffer = self._scratch[dtype] = np.empty(_BLOCK, dtype)
        return buffer[:size]
