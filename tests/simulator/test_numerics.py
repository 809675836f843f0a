"""numerics against exact Fraction arithmetic over the whole int32 range (hypothesis)."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import numerics
from simulator.errors import SimulatorError

CI = settings(max_examples=150)  # derandomized by the "ci" profile in tests/conftest.py
int32 = st.integers(-(2**31), 2**31 - 1)
int8 = st.integers(-128, 127)
multiplier = st.integers(2**30, 2**31 - 1)
shift = st.integers(numerics.SHIFT_MIN, numerics.SHIFT_MAX)


def round_half_away(q: Fraction) -> int:
    n = abs(q.numerator) * 2 + q.denominator
    magnitude = n // (2 * q.denominator)
    return magnitude if q >= 0 else -magnitude


@CI
@given(st.integers(-(2**62), 2**62), st.integers(0, 62))
def test_rounding_shift_is_round_half_away_from_zero(x, s):
    assert int(numerics.rounding_shift(x, s)) == round_half_away(Fraction(x, 2**s))


def test_rounding_shift_ties():
    got = numerics.rounding_shift(np.array([5, -5, 3, -3, 1, -1]), 1)
    assert got.tolist() == [3, -3, 2, -2, 1, -1]


@CI
@given(int32, multiplier, shift, int8, int8, int8)
def test_requantize_matches_fraction(acc, m, s, offset, a, b):
    qmin, qmax = min(a, b), max(a, b)
    exact = round_half_away(Fraction(acc * m, 2 ** (31 + s))) + offset
    got = numerics.requantize(np.array([acc], np.int32), m, s, offset, qmin, qmax)
    assert got.dtype == np.int8
    assert int(got[0]) == min(max(exact, qmin), qmax)


@CI
@given(st.lists(st.tuples(int32, multiplier, shift), min_size=1, max_size=8))
def test_requantize_per_channel_axis(cols):
    acc = np.array([[c[0] for c in cols]] * 3, np.int32)
    m = np.array([c[1] for c in cols])
    s = np.array([c[2] for c in cols])
    got = numerics.requantize(acc, m, s, 0, axis=1, dtype="int32")
    want = [round_half_away(Fraction(a * mm, 2 ** (31 + ss))) for a, mm, ss in cols]
    want = [min(max(w, -(2**31)), 2**31 - 1) for w in want]
    assert got.tolist() == [want] * 3


@CI
@given(st.floats(2.0**-32, 2.0**31 - 1))
def test_quantize_multiplier_error_bound(real):
    m, s = numerics.quantize_multiplier(real)
    assert 2**30 <= m < 2**31 and numerics.SHIFT_MIN <= s <= numerics.SHIFT_MAX
    approx = Fraction(m, 2 ** (31 + s)) if 31 + s >= 0 else Fraction(m * 2 ** -(31 + s))
    assert abs(approx / Fraction(real) - 1) <= Fraction(1, 2**31)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), 2.0**-40, 2.0**32])
def test_quantize_multiplier_rejects(bad):
    with pytest.raises(SimulatorError, match="quantize_multiplier"):
        numerics.quantize_multiplier(bad)


@CI
@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=20))
def test_saturate(xs):
    for dtype, (lo, hi) in numerics.RANGES.items():
        got = numerics.saturate(np.array(xs, np.int64), dtype)
        assert got.dtype == np.dtype(dtype)
        assert got.tolist() == [min(max(x, lo), hi) for x in xs]


@CI
@given(int32, int8, int8)
def test_mac_wraps(acc, a, b):
    want = (acc + a * b + 2**31) % 2**32 - 2**31
    assert int(numerics.mac(np.int32(acc), np.int8(a), np.int8(b))) == want


@CI
@given(st.integers(1, 40), st.integers(1, 300), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_int_matmul_matches_int64(m, k, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    want = a.astype(np.int64) @ b.astype(np.int64)
    got = numerics.int_matmul(a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_int_matmul_extremes_and_wrap():
    k = 2**17  # (-128)^2 * 2^17 = 2^31: one past int32, so the accumulator wraps
    a = np.full((1, k), -128, np.int8)
    assert int(numerics.int_matmul(a, a.T)[0, 0]) == -(2**31)
    acc = np.array([[2**31 - 1]], np.int32)
    one = np.ones((1, 1), np.int8)
    assert int(numerics.matmul_accumulate(acc, one, one)[0, 0]) == -(2**31)


@CI
@given(st.lists(st.tuples(int8, int8), min_size=1, max_size=16), int8, int8,
       st.floats(0.001, 1.0), st.floats(0.001, 1.0), st.floats(0.001, 1.0), int8)
def test_add_matches_fraction(pairs, xo, yo, sx, sy, so, oo):
    big = max(sx, sy)
    m = [numerics.quantize_multiplier(v) for v in (sx / (2 * big), sy / (2 * big),
                                                    2 * big / (2**numerics.ADD_LEFT_SHIFT * so))]
    x = np.array([p[0] for p in pairs], np.int8)
    y = np.array([p[1] for p in pairs], np.int8)
    got = numerics.add(x, y, xo, yo, [mm for mm, _ in m], [s for _, s in m], oo)

    def rescale(v, ms):
        return round_half_away(Fraction(v * ms[0], 2 ** (31 + ms[1])))
    for i, (a, b) in enumerate(pairs):
        total = rescale((a - xo) * 2**20, m[0]) + rescale((b - yo) * 2**20, m[1])
        assert int(got[i]) == min(max(rescale(total, m[2]) + oo, -128), 127)


def test_lookup_and_window_sum():
    table = np.arange(256).astype(np.int8)  # wraps: table[i] = i - 256 for i >= 128
    assert numerics.lookup(np.array([-128, 0, 127], np.int8), table).tolist() == [0, -128, -1]
    w = np.array([[[1, 2], [3, 4]]], np.int8)
    assert numerics.window_sum(w, 1).tolist() == [6]
