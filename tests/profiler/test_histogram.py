"""The power-of-two grid: streamed, split and merged histograms are exact and identical."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from profiler import histogram
from profiler.accumulate import Accumulator
from profiler.format import merge_stats

finite_f32 = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False)


def stats_of(*batches):
    acc = Accumulator("activation", "float32", histogram.Binner())
    for batch in batches:
        acc.add(np.asarray(batch, np.float32))
    return acc.stats()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(arrays(np.float32, st.integers(1, 300), elements=finite_f32), st.data())
def test_streamed_split_and_merged_histograms_are_identical(values, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(values)), max_size=4)))
    parts = np.split(values, cuts)
    whole = stats_of(values)
    streamed = stats_of(*parts)
    merged = stats_of(parts[0])
    for part in parts[1:]:
        merged = merge_stats(merged, stats_of(part))
    for other in (streamed, merged):
        assert other.to_json() == whole.to_json()
    # The oracle: numpy's histogram over the recorded edges (exact: edges are dyadic).
    expected, _ = np.histogram(values.astype(np.float64), bins=whole.bin_edges)
    assert np.array_equal(expected, whole.hist)
    assert (whole.min, whole.max, whole.count) == (values.min(), values.max(), values.size)


def test_a_spread_range_gets_at_least_2048_bins():
    rng = np.random.default_rng(0)
    for scale in (1e-3, 1.0, 300.0, 1e5):
        s = stats_of(rng.standard_normal(5000) * scale, rng.standard_normal(5000) * scale * 3)
        assert 2048 <= len(s.hist) <= histogram.MAX_BINS
        assert s.hist.sum() == s.count == 10000


def test_a_constant_tensor_is_one_bin_with_zero_range():
    for value in (0.0, 3.5, -1e-20):
        s = stats_of(np.full(7, value), np.full(5, value))
        assert s.min == s.max == np.float32(value)
        assert s.hist.tolist() == [12] and s.count == 12
        assert s.lo <= s.min < s.lo + s.bin_width


def test_nonfinite_values_are_counted_and_left_out():
    s = stats_of([1.0, np.nan, -2.0, np.inf], [np.nan, np.nan], [-np.inf, 0.5])
    assert (s.min, s.max, s.count, s.nonfinite) == (-2.0, 1.0, 3, 5)
    assert stats_of([np.nan]).count == 0


def test_width_is_the_narrowest_power_of_two_that_fits():
    for lo, hi in ((-1.0, 1.0), (0.0, 6.0), (1e-8, 2e-8), (-3e30, 5.0)):
        k = histogram.width_log2(lo, hi)
        span = histogram.bin_index(hi, k) - histogram.bin_index(lo, k)
        assert span < histogram.MAX_BINS
        assert histogram.bin_index(hi, k - 1) - histogram.bin_index(lo, k - 1) >= \
            histogram.MAX_BINS


def test_float32_and_float64_paths_bin_alike():
    values = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    for k in (-12, -3, 0, 1, 4):
        first = histogram.bin_index(float(values.min()), k)
        length = histogram.bin_index(float(values.max()), k) - first + 1
        binner = histogram.Binner()
        assert np.array_equal(binner.count(values, k, first, length),
                              binner.count(values.astype(np.float64), k, first, length))
