"""numerics against exact Fraction arithmetic over the whole int32 range (hypothesis)."""

import math
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


@CI
@given(st.lists(st.floats(2.0**-32, 2.0**31 - 1), min_size=1, max_size=50))
def test_quantize_multipliers_round_as_the_exact_rational(reals):
    """The vectorized form rounds mantissa * 2^31 half to even in float64, which must be the
    exact rational's rounding; ties (mantissas with a bit below 2^-31) included."""
    reals = reals + [0.5 + 2.0**-32, 0.5 + 3 * 2.0**-32, 1 - 2.0**-33]
    multipliers, shifts = numerics.quantize_multipliers(reals)
    for real, m, s in zip(reals, multipliers.tolist(), shifts.tolist()):
        mantissa, exponent = math.frexp(real)
        exact = round(Fraction(mantissa) * 2**31)
        if exact == 2**31:
            exact, exponent = 2**30, exponent + 1
        assert (m, s) == (exact, -exponent)


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


wide16 = st.integers(-(2**15), 2**15 - 1)
signed_multiplier = st.integers(-(2**31), 2**31 - 1)


@CI
@given(st.lists(st.tuples(wide16, wide16), min_size=1, max_size=16), int8, int8,
       signed_multiplier, signed_multiplier, shift, int8, st.booleans())
def test_wide_add_is_one_rounding_of_the_exact_sum(pairs, xo, yo, mx, my, s, oo, narrow):
    """wide_add over every int16 code (the other operand int8 or int16), every 8-bit offset,
    every int32 multiplier (a Sub's negative ones, even -2^31) and every shift: the exact
    rational sum rounded once, half away from zero, so no intermediate left int64 (a wrap
    would show as a wrong result)."""
    x = np.array([p[0] for p in pairs], np.int16)
    y = np.array([p[1] for p in pairs], np.int16)
    if narrow:  # an int8 operand: the low byte of the drawn code
        y = y.astype(np.int8)
    got = numerics.wide_add(x, y, xo, yo, (mx, my, 0), (0, 0, s), oo)
    for i in range(len(pairs)):
        exact = Fraction((int(x[i]) - xo) * mx + (int(y[i]) - yo) * my, 2 ** (31 + s))
        assert int(got[i]) == min(max(round_half_away(exact) + oo, -(2**15)), 2**15 - 1)


def test_wide_add_bound_at_the_extremes():
    """The docstring's bound, at its corners: |x - offset| <= 2^15 + 2^7 and |m| <= 2^31 give
    a sum of products below 2^48, and the extreme codes with the extreme multipliers still
    round exactly (against Python integers)."""
    corners = [-(2**15), 2**15 - 1]
    for xo in (-128, 127):
        for m in (-(2**31), 2**31 - 1):
            x = np.array(corners, np.int16)
            total = [(int(v) - xo) * m * 2 for v in x]  # both operands at the corner
            assert max(abs(t) for t in total) < 2**48
            got = numerics.wide_add(x, x, xo, xo, (m, m, 0), (0, 0, -31), 0, dtype="int16")
            want = [min(max(round_half_away(Fraction(t, 1)), -(2**15)), 2**15 - 1)
                    for t in total]
            assert got.tolist() == want


@CI
@given(st.floats(2.0**-20, 2.0**20), st.floats(2.0**-40, 1.0))
def test_add_multipliers_share_the_larger_ratios_shift(larger, fraction):
    """The larger ratio's lane is its own quantize_multiplier; the smaller's is the nearest
    integer to its ratio at that shift (at most the larger's); every lane's shift is one."""
    smaller = larger * fraction
    m, s = numerics.quantize_multiplier(larger)
    (ma, mb, m2), shifts = numerics.add_multipliers(smaller, larger, m, s)
    assert (mb, m2, shifts) == (m, 0, (s, s, s))
    assert 0 <= ma <= m
    assert abs(Fraction(ma) - Fraction(smaller) * 2 ** (31 + s)) <= Fraction(1, 2)


@CI
@given(st.lists(st.tuples(int8, int8), min_size=1, max_size=16), int8, int8,
       st.floats(0.001, 1.0), st.floats(0.001, 1.0), st.floats(0.001, 1.0), int8,
       st.sampled_from(["max", "min"]))
def test_extremum_matches_fraction(pairs, xo, yo, sx, sy, so, oo, op):
    big = max(sx, sy)
    m = [numerics.quantize_multiplier(v) for v in (sx / big, sy / big,
                                                    big / (2**numerics.ADD_LEFT_SHIFT * so))]
    x = np.array([p[0] for p in pairs], np.int8)
    y = np.array([p[1] for p in pairs], np.int8)
    got = numerics.extremum(x, y, xo, yo, [mm for mm, _ in m], [s for _, s in m], oo, op=op)

    def rescale(v, ms):
        return round_half_away(Fraction(v * ms[0], 2 ** (31 + ms[1])))
    pick = max if op == "max" else min
    for i, (a, b) in enumerate(pairs):
        common = pick(rescale((a - xo) * 2**20, m[0]), rescale((b - yo) * 2**20, m[1]))
        assert int(got[i]) == min(max(rescale(common, m[2]) + oo, -128), 127)


def test_lookup_and_window_sum():
    table = np.arange(256).astype(np.int8)  # wraps: table[i] = i - 256 for i >= 128
    assert numerics.lookup(np.array([-128, 0, 127], np.int8), table).tolist() == [0, -128, -1]
    w = np.array([[[1, 2], [3, 4]]], np.int8)
    assert numerics.window_sum(w, 1).tolist() == [6]


# --- the affine map between real values and codes ---------------------------------------------

code_dtype = st.sampled_from(["int8", "uint8"])
arithmetic = st.sampled_from([np.float32, np.float64])
float32_scale = st.floats(1e-4, 1e4).map(lambda s: float(np.float32(s)))


@CI
@given(st.lists(st.integers(-(2**20), 2**20), min_size=1, max_size=20), st.integers(-20, 10),
       st.integers(-128, 255), code_dtype, arithmetic)
def test_quantize_matches_fraction(halves, exponent, zero_point, dtype, arithmetic):
    # x = k/2 * 2^e: exact in either float type, and so is x / scale, so rint is the only
    # rounding: ties to even, then the zero point and saturation.
    scale = 2.0**exponent
    x = np.asarray(halves, arithmetic) / 2 * scale
    got = numerics.quantize(x, scale, zero_point, dtype=dtype, arithmetic=arithmetic)
    lo, hi = numerics.RANGES[dtype]
    assert got.dtype == np.dtype(dtype)
    assert got.tolist() == [min(max(round(Fraction(k, 2)) + zero_point, lo), hi) for k in halves]


def test_quantize_ties_to_even_and_bounds():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1e9, -1e9])
    assert numerics.quantize(x, 1.0).tolist() == [0, 2, 2, 0, -2, 127, -128]
    assert numerics.quantize(x, 1.0, dtype="uint8").tolist() == [0, 2, 2, 0, 0, 255, 0]
    # Symmetric weights keep -128 unused, so negating a code never overflows.
    assert numerics.quantize(x, 1.0, 0, -127, 127).tolist() == [0, 2, 2, 0, -2, 127, -127]


@CI
@given(int8, int8, float32_scale, arithmetic)
def test_dequantize_matches_fraction(q, zero_point, scale, arithmetic):
    # |q - z| < 2^9 and a float32 scale: the exact product has at most 33 significant bits,
    # so float(Fraction) is exact and the one rounding is to the arithmetic's type.
    got = numerics.dequantize(np.array([q], np.int8), scale, zero_point, arithmetic=arithmetic)
    assert got.dtype == np.dtype(arithmetic)
    assert got[0] == arithmetic(float(Fraction(q - zero_point) * Fraction(scale)))


@CI
@given(st.lists(st.integers(0, 255), min_size=1, max_size=16), st.integers(0, 255),
       float32_scale, code_dtype, arithmetic)
def test_dequantize_then_quantize_gives_the_codes_back(codes, zero_point, scale, dtype,
                                                       arithmetic):
    lo, _ = numerics.RANGES[dtype]
    q = (np.asarray(codes) + lo).astype(dtype)
    zero_point += lo
    real = numerics.dequantize(q, scale, zero_point, arithmetic=arithmetic)
    back = numerics.quantize(real, scale, zero_point, dtype=dtype, arithmetic=arithmetic)
    np.testing.assert_array_equal(back, q)


@CI
@given(st.lists(st.tuples(float32_scale, int8), min_size=2, max_size=6),
       st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=5), arithmetic)
def test_per_channel_is_per_tensor_on_each_slice(channels, values, arithmetic):
    scales = [s for s, _ in channels]
    zeros = [z for _, z in channels]
    x = np.array([[v * (c + 1) for c in range(len(channels))] for v in values])
    q = numerics.quantize(x, scales, zeros, axis=1, arithmetic=arithmetic)
    real = numerics.dequantize(q, scales, zeros, axis=1, arithmetic=arithmetic)
    for c, (s, z) in enumerate(channels):
        column = numerics.quantize(x[:, c], s, z, arithmetic=arithmetic)
        np.testing.assert_array_equal(q[:, c], column)
        np.testing.assert_array_equal(
            real[:, c], numerics.dequantize(column, s, z, arithmetic=arithmetic))


def test_softmax_equals_its_definition_with_exact_rounding():
    """numerics.softmax: round(256 T[max - x] / sum T[max - x]) + offset, half up, exactly."""
    rng = np.random.default_rng(3)
    table = np.rint(np.exp(-0.04 * np.arange(256)) * 2**20).astype(np.int32)
    x = rng.integers(-128, 128, (20, 7)).astype(np.int8)
    got = numerics.softmax(x, table, -128)
    for row, out in zip(x.astype(int), got.astype(int)):
        e = [int(table[row.max() - v]) for v in row]
        want = [min(127, int(Fraction(256 * v, sum(e)) + Fraction(1, 2)) - 128) for v in e]
        assert list(out) == want


def test_log_softmax_is_within_half_a_step_of_the_real_logarithm():
    """numerics.log_softmax against the real ln of the same integer sum: the mantissa table's
    interpolation keeps it within half an output step plus a tiny margin, on sums from one
    entry (2^20, log 0) to thousands of them."""
    from compiler.graph.int8 import log_softmax_shift, log_softmax_table
    rng = np.random.default_rng(4)
    for scale, channels in ((0.05, 3), (0.01, 1000), (0.3, 40), (1e-5, 17)):
        table = log_softmax_table(scale)
        shift = log_softmax_shift(scale)
        x = rng.integers(-128, 128, (30, channels)).astype(np.int8)
        got = numerics.log_softmax(x, table[:256], table[256:], shift, 127).astype(np.int64)
        d = x.max(axis=1, keepdims=True).astype(np.int64) - x
        total = table[:256].astype(np.int64)[d].sum(axis=1, keepdims=True)
        exact = 127 - d - np.log(total / 2**20) / scale
        inside = got > -128
        assert np.all(np.abs(got - exact)[inside] <= 0.5 + 1e-3), (scale, channels)
        assert np.all(exact[~inside] <= -127.5 + 1e-3)


def test_floor_log2_is_the_leading_one():
    values = np.array([1, 2, 3, 2**20, 2**20 + 1, 2**40 - 1, 2**62], np.int64)
    assert list(numerics._floor_log2(values)) == [int(v).bit_length() - 1 for v in values]


def test_split_wide_and_join_wide_round_trip_every_int16():
    v = np.arange(-(2**15), 2**15)
    high, low = numerics.split_wide(v)
    assert high.dtype == low.dtype == np.int8
    np.testing.assert_array_equal(numerics.join_wide(high, low), v)


def test_layer_norm_of_int16_codes_keeps_the_small_channels():
    """A row with one channel 100 times the others: over int16 codes the small channels come
    out within one output step (0.01) of the float LayerNorm's; over int8 codes of the same
    range they are off by ten steps and more."""
    rng = np.random.default_rng(3)
    c = 384
    real = rng.normal(0, 1, (16, c))
    real[:, 99] *= 100
    mult, shift = numerics.quantize_multiplier(2**8 / (0.01 * 2**16))  # gamma 1, s_y 0.01
    want = (real - real.mean(-1, keepdims=True)) / real.std(-1, keepdims=True)
    small = np.arange(c) != 99
    errors = {}
    for dtype, top in (("int16", 32767), ("int8", 127)):
        x = np.round(real / (np.abs(real).max() / top)).astype(dtype)
        y = numerics.layer_norm(x, 0, np.full(c, mult), np.full(c, shift), np.zeros(c), 0,
                                dtype="int16", in_dtype=dtype) * 0.01
        errors[dtype] = np.abs(y - want)[:, small].max()
    assert errors["int16"] < 0.01 < errors["int8"] / 10, errors


@CI
@given(st.lists(st.tuples(int8, int8), min_size=1, max_size=16), int8, st.floats(0.05, 4.0))
def test_hypot_is_within_a_step_of_the_real_magnitude(pairs, offset, ratio):
    """numerics.hypot: the root of the exact sum of squares in Q8, rescaled by s 2^-8 / s_out:
    within half an output step of the real magnitude plus the Q8 root's floor (2^-8 of an input
    step, times the ratio), however small the parts (where int8 power would round to 0)."""
    x = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    m, s = numerics.quantize_multiplier(ratio / 2**numerics.HYPOT_FRACTION_BITS)
    got = numerics.hypot(x, y, offset, offset, [0, 0, m], [0, 0, s], -128, dtype="int16")
    real = np.hypot(x - offset, y - offset) * ratio - 128
    assert np.all(np.abs(got - real) <= 0.5 + ratio / 2**8 + 1e-6)
    five = numerics.hypot(np.array([3]), np.array([4]), 0, 0, [0, 0, m], [0, 0, s], 0,
                          dtype="int16")[0]  # an exact root: only the output's rounding
    assert abs(five - 5 * ratio) <= 0.5 + 1e-6


@CI
@given(st.lists(int8, min_size=1, max_size=40), int8, st.floats(0.05, 4.0))
def test_reduce_rows_max_min_exact_and_l2_within_a_step(row, offset, ratio):
    """numerics.reduce_rows: max and min are the codes' own; l2 the root of the exact sum of
    the centred squares, within half an output step plus the Q8 root's floor."""
    x = np.array([row])
    assert numerics.reduce_rows(x, "max")[0] == max(row)
    assert numerics.reduce_rows(x, "min")[0] == min(row)
    m, s = numerics.quantize_multiplier(ratio / 2**numerics.HYPOT_FRACTION_BITS)
    got = numerics.reduce_rows(x, "l2", offset, m, s, -128, dtype="int16")[0]
    real = np.sqrt(sum((v - offset) ** 2 for v in row)) * ratio - 128
    assert abs(got - real) <= 0.5 + ratio / 2**8 + 1e-6


@CI
@given(st.lists(st.integers(-(2**15), 2**15 - 1), min_size=numerics.KNOTS,
                max_size=numerics.KNOTS),
       st.integers(-(2**15), 2**15 - 1), st.sampled_from(["int8", "int16"]))
def test_interpolate_is_its_definition_rounded_once(knots, x, dtype):
    """(256 - f) T[h] + f T[h + 1] over 2^(8 + fraction bits), rounded half away from zero and
    saturated, for h the high byte and f the low byte + 128."""
    h, f = (x >> 8) + 128, x & 0xFF
    fine = Fraction((256 - f) * knots[h] + f * knots[h + 1],
                    2 ** (8 + numerics.KNOT_FRACTION_BITS[dtype]))
    lo, hi = numerics.RANGES[dtype]
    got = numerics.interpolate(np.array([x]), np.array(knots), dtype)
    assert got.dtype == np.dtype(dtype)
    assert int(got[0]) == min(max(round_half_away(fine), lo), hi)


@settings(max_examples=300)
@given(st.lists(st.integers(-(2**15), 2**15 - 1), min_size=2 * numerics.KNOTS,
                max_size=2 * numerics.KNOTS),
       st.integers(1, numerics.MAX_ZOOM), st.integers(-(2**15), 2**15 - 1),
       st.integers(-(2**15), 2**15 - 1), st.sampled_from(["int8", "int16"]))
def test_a_window_of_finer_knots_is_its_definition_rounded_once(knots, zoom, origin, x, dtype):
    """A code inside [origin, origin + 256 * 2^s), s = 8 - zoom, weighs the window's knots
    (after the KNOTS coarse ones) T[h], T[h + 1] by f: h = (x - origin) >> s, f its low s bits,
    over 2^(s + fraction bits); a code outside takes the coarse knots as without a window."""
    step = 8 - zoom
    offset = x - origin
    if 0 <= offset < 256 << step:
        h, f, shift = numerics.KNOTS + (offset >> step), offset & ((1 << step) - 1), step
    else:
        h, f, shift = (x >> 8) + 128, x & 0xFF, 8
    fine = Fraction(((1 << shift) - f) * knots[h] + f * knots[h + 1],
                    2 ** (shift + numerics.KNOT_FRACTION_BITS[dtype]))
    lo, hi = numerics.RANGES[dtype]
    got = numerics.interpolate(np.array([x]), np.array(knots), dtype, zoom, origin)
    assert int(got[0]) == min(max(round_half_away(fine), lo), hi)


def test_a_window_needs_its_knots_and_a_zoom_in_range() -> None:
    coarse = np.zeros(numerics.KNOTS, np.int16)
    with pytest.raises(SimulatorError, match=r"a table of 257 entries; expected 514"):
        numerics.interpolate(np.zeros(3, np.int16), coarse, "int8", 2, 0)
    with pytest.raises(SimulatorError, match=r"zoom 9; expected 0 \(no window\) to 8"):
        numerics.interpolate(np.zeros(3, np.int16), np.zeros(514, np.int16), "int8", 9, 0)


def _knot_table(fn, s_in: float, s_out: float, zero: int, dtype: str) -> np.ndarray:
    """The knots as the quantizer computes them (`int8.wide_table`): fn at code (k - 128) * 256
    in output codes with the entries' fraction bits, saturated to int16."""
    fine = 2 ** numerics.KNOT_FRACTION_BITS[dtype]
    x = (np.arange(numerics.KNOTS) - 128) * 256 * s_in
    return numerics.quantize(fn(x), s_out / fine, zero * fine, dtype="int16",
                             arithmetic=np.float64)


def _gelu(x):
    from math import erf
    return np.array([v * (1 + erf(v / np.sqrt(2))) / 2 for v in x])


@pytest.mark.parametrize("name, fn, amax, lo, hi", [
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), 8.0, 0.0, 1.0),
    ("tanh", np.tanh, 4.0, -1.0, 1.0),
    ("silu", lambda x: x / (1 + np.exp(-x)), 6.0, -0.28, 6.0),
    ("gelu", _gelu, 6.0, -0.17, 6.0),
])
def test_interpolation_stays_within_its_error_bound(name, fn, amax, lo, hi) -> None:
    """Every int16 code of a symmetric input of range amax, through the 257 knots of a smooth
    function: an int8 output (asymmetric, over [lo, hi]) is within 0.5 + 1/256 + h^2 M / (8
    s_out) of its steps of the exact value, h = 256 s_in the knots' spacing and M the largest
    |f''| (the final rounding, the Q7 knots' own, linear interpolation's); here under 0.52
    steps, so never a code from the correctly rounded one, which it is for almost every code.
    An int16 output over [-max(|lo|, |hi|), max(|lo|, |hi|)] is within 1 + h^2 M / (8 s_out)
    of its steps (knots rounded to its codes)."""
    s_in = amax / 32767
    codes = np.arange(-(2**15), 2**15)
    x = codes * s_in
    exact = fn(x)
    grid = np.linspace(-amax - 1, amax + 1, 200001)
    d = grid[1] - grid[0]
    values = fn(grid)
    curvature = np.abs(values[2:] - 2 * values[1:-1] + values[:-2]).max() / d ** 2
    h = 256 * s_in
    s8 = (hi - lo) / 255
    z8 = int(round(-128 - lo / s8))
    y8 = numerics.interpolate(codes, _knot_table(fn, s_in, s8, z8, "int8"), "int8")
    bound8 = 0.5 + 1 / 256 + h ** 2 * curvature / (8 * s8)
    error8 = np.abs(y8 - (exact / s8 + z8))
    assert bound8 < 0.52 and error8.max() <= bound8 + 1e-9, (error8.max(), bound8)
    rounded = np.clip(np.round(exact / s8 + z8), -128, 127)
    assert np.abs(y8 - rounded).max() <= 1 and np.mean(y8 == rounded) > 0.99
    s16 = max(abs(lo), abs(hi)) / 32767
    y16 = numerics.interpolate(codes, _knot_table(fn, s_in, s16, 0, "int16"), "int16")
    bound16 = 1 + h ** 2 * curvature / (8 * s16)
    error16 = np.abs(y16 - exact / s16)
    assert error16.max() <= bound16 + 1e-6, (name, error16.max(), bound16)


def test_a_kink_at_a_knot_interpolates_exactly() -> None:
    """LeakyRelu's kink at 0 is a knot (int16 codes are symmetric): every int16 code's int16
    output is within the knots' and the final rounding, a step, of the exact value."""
    s = 4.0 / 32767
    codes = np.arange(-(2**15), 2**15)

    def leaky(x):
        return np.where(x > 0, x, 0.1 * x)
    table = _knot_table(leaky, s, s, 0, "int16")
    got = numerics.interpolate(codes, table, "int16")
    assert np.abs(got - leaky(codes * s) / s).max() <= 1.0


def test_lookup_wide_is_the_int16_entry() -> None:
    table = np.arange(256, dtype=np.int16) * 100 - 12800
    codes = np.arange(-128, 128, dtype=np.int8)
    got = numerics.lookup_wide(codes, table)
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, table)


def test_window_max_compares_whole_int16_values_not_planes():
    """An int16 window's max is a compare of whole values; plane by plane it would pair the
    largest high byte with some other value's low byte (0x0100 and 0x00FF: planes (1, -128)
    and (0, 127) give (1, 127), the code 0x01FF, which no input holds)."""
    window = np.array([[0x0100, 0x00FF], [-5, -300]], np.int16)
    assert int(numerics.window_max(window)) == 0x0100
    high, low = numerics.split_wide(window)
    planewise = numerics.join_wide(high.max(), low.max())
    assert int(planewise) == 0x01FF != int(numerics.window_max(window))
    codes = np.random.default_rng(5).integers(-128, 128, (3, 4, 2, 3)).astype(np.int8)
    np.testing.assert_array_equal(numerics.window_max(codes), codes.max(axis=(-2, -1)))
    np.testing.assert_array_equal(numerics.window_max(codes, 3), codes.max(axis=(-3, -2, -1)))


int16 = st.integers(-(2**15), 2**15 - 1)


@CI
@given(st.lists(st.tuples(int16, int16), min_size=1, max_size=16), int8, int8, int8,
       multiplier, shift, st.sampled_from(["int8", "int16"]))
def test_mul_of_int16_codes_matches_the_exact_rational(pairs, x_offset, y_offset, out_offset,
                                                       m, s, dtype):
    """int16 x int16 (any int8 offsets): the whole product, rounded once half away from zero
    from the exact rational (x - zx)(y - zy) m / 2^(31 + s), + offset, clamped: no partial
    product or intermediate rounds (|product| < 2^31, times m < 2^62)."""
    x, y = (np.array(v, np.int64) for v in zip(*pairs))
    got = numerics.mul(x, y, x_offset, y_offset, m, s, out_offset, dtype=dtype)
    lo, hi = numerics.RANGES[dtype]
    for xi, yi, g in zip(x.tolist(), y.tolist(), got.tolist()):
        exact = round_half_away(Fraction((xi - x_offset) * (yi - y_offset) * m, 2 ** (31 + s)))
        assert g == min(max(exact + out_offset, lo), hi)
    assert got.dtype == np.dtype(dtype)


@CI
@given(st.lists(st.tuples(int16, int8), min_size=1, max_size=16), multiplier, shift)
def test_mul_through_planes_is_the_product_of_the_joined_codes(pairs, m, s):
    """An int16 factor as the MUL unit holds it (two planes, `split_wide`) and joined again is
    the same code: the planes' partial products sum to the whole one before the rounding."""
    x, y = (np.array(v, np.int64) for v in zip(*pairs))
    high, low = numerics.split_wide(x)
    np.testing.assert_array_equal(numerics.join_wide(high, low), x)
    partial = ((high.astype(np.int64) << 8) * y) + (low.astype(np.int64) + 128) * y
    np.testing.assert_array_equal(numerics.requantize(partial, m, s, dtype="int16"),
                                  numerics.mul(x, y, 0, 0, m, s, 0, dtype="int16"))
