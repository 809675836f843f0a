"""Calibration methods on synthetic histograms with known answers, and ranges → QuantParams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.accumulate import Accumulator
from profiler.format import TensorStats
from profiler.histogram import Binner
from quantizer import calibrate
from quantizer.calibrate import activation_params, tensor_range, weight_scales
from quantizer.errors import QuantizeError
from simulator import numerics

CI = settings(derandomize=True, max_examples=200, deadline=None)


def stats_of(values: np.ndarray) -> TensorStats:
    acc = Accumulator("activation", "float32", Binner())
    acc.add(np.asarray(values, np.float32))
    return acc.stats()


def gaussian_with_outliers(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    bulk = rng.standard_normal(200_000)
    return np.concatenate([bulk, [40.0, -35.0, 50.0]])


def quantization_mse(values: np.ndarray, lo: float, hi: float) -> float:
    params = activation_params(lo, hi)
    scale, zero = params.scale[0], params.zero_point[0]
    q = numerics.quantize(values, scale, zero, arithmetic=np.float64)
    real = numerics.dequantize(q, scale, zero, arithmetic=np.float64)
    return float(np.mean((real - values) ** 2))


def test_minmax_keeps_outliers_and_the_others_clip_them() -> None:
    values = gaussian_with_outliers()
    stats = stats_of(values)
    assert tensor_range(stats, "minmax") == (float(stats.min), float(stats.max))
    assert tensor_range(stats, "minmax")[1] == pytest.approx(50.0)
    lo, hi = tensor_range(stats, "percentile")
    assert 2.5 < hi < 10.0 and -10.0 < lo < -2.5, f"percentile: {lo}, {hi}"
    # Entropy clips them too, no lower than its guard allows (its squared error within 3 dB
    # of the least, `calibrate.ENTROPY_ERROR_MARGIN`): 12.6 here.
    lo, hi = tensor_range(stats, "entropy")
    assert 2.5 < hi < 20.0 and -20.0 < lo < -2.5, f"entropy: {lo}, {hi}"
    # mse weighs the outliers' clipping error against everyone's rounding error: it clips less
    # than percentile, but still clips.
    lo, hi = tensor_range(stats, "mse")
    assert tensor_range(stats, "percentile")[1] < hi < 50.0
    assert -35.0 < lo < tensor_range(stats, "percentile")[0]


def test_mse_and_auto_minimise_the_quantization_error_among_the_methods() -> None:
    values = gaussian_with_outliers(1)
    stats = stats_of(values)
    errors = {m: quantization_mse(values, *tensor_range(stats, m)) for m in calibrate.METHODS}
    assert errors["mse"] < errors["minmax"]
    assert errors["mse"] <= 1.05 * min(e for m, e in errors.items() if m != "auto")
    # Without a reader to weigh and on int8's 255 steps, auto is mse's search.
    assert errors["auto"] <= 1.01 * errors["mse"]


def test_percentile_finds_the_known_quantile() -> None:
    values = np.arange(100_000) / 100.0  # uniform on [0, 1000)
    stats = stats_of(values)
    _, hi = tensor_range(stats, "percentile", percentile=90.0)
    assert hi == pytest.approx(900.0, abs=2 * stats.bin_width)
    assert tensor_range(stats, "percentile", percentile=100.0)[1] == pytest.approx(
        values.max(), abs=stats.bin_width)


def test_clipping_methods_keep_the_range_of_uniform_data() -> None:
    values = np.random.default_rng(2).uniform(-3.0, 3.0, 100_000)
    stats = stats_of(values)
    for method in ("percentile", "entropy", "mse", "auto"):
        lo, hi = tensor_range(stats, method)
        assert hi > 2.7 and lo < -2.7, f"{method}: ({lo}, {hi})"


def test_entropy_on_relu_outputs_does_not_collapse_onto_the_zero_spike() -> None:
    rng = np.random.default_rng(3)
    values = np.maximum(rng.standard_normal(100_000) * 2.0, 0.0)  # half the mass at exactly 0
    lo, hi = tensor_range(stats_of(values), "entropy")
    assert lo == 0.0
    assert hi > 3.0  # above the 93rd percentile of the positive half


def test_abs_histogram_folds_negative_bins_exactly() -> None:
    values = np.array([-1.5, -0.25, 0.0, 0.25, 1.0, 1.5])
    stats = stats_of(values)
    counts, width = calibrate.abs_histogram(stats)
    assert counts.sum() == stats.count
    signed = np.floor(values / width).astype(int)  # the profiler's bins
    magnitudes = np.where(signed >= 0, signed, -signed - 1)  # bin j < 0 folds onto -j-1
    np.testing.assert_array_equal(np.bincount(magnitudes, minlength=len(counts)), counts)


def test_a_zero_range_tensor_gets_a_valid_scale() -> None:
    stats = stats_of(np.zeros(100))
    for method in calibrate.METHODS:
        assert tensor_range(stats, method) == (0.0, 0.0)
    for dtype in ("int8", "uint8"):
        for symmetric in (False, True):
            params = activation_params(0.0, 0.0, dtype, symmetric)
            assert params.scale[0] > 0 and np.isfinite(params.scale[0])
    assert weight_scales(np.zeros((3, 2)), axis=0) == (calibrate.ZERO_RANGE_SCALE,) * 3


def test_entropy_fails_loudly_on_a_coarse_histogram() -> None:
    coarse = TensorStats("activation", "float32", 0.0, 9.5, 100, 0, 0, 0,
                         np.full(10, 10, np.int64))
    with pytest.raises(QuantizeError, match="at least 256 bins"):
        tensor_range(coarse, "entropy", name="coarse")


def test_an_empty_profile_entry_and_an_unknown_method_are_errors() -> None:
    empty = TensorStats("activation", "float32", None, None, 0, 5, 0, 0, np.zeros(0, np.int64))
    with pytest.raises(QuantizeError, match="'t'.*no finite values"):
        tensor_range(empty, name="t")
    with pytest.raises(QuantizeError, match="unknown"):
        tensor_range(stats_of(np.ones(3)), "kl")


ranges = st.tuples(st.floats(-1e4, 1e4), st.floats(-1e4, 1e4)).map(sorted)


@CI
@given(ranges, st.sampled_from(["int8", "uint8"]), st.booleans(), st.booleans())
def test_params_represent_zero_exactly_and_cover_the_range(bounds, dtype, symmetric, power2):
    lo, hi = bounds
    params = activation_params(lo, hi, dtype, symmetric, power2)
    scale, zero = params.scale[0], params.zero_point[0]
    qmin, qmax = (-128, 127) if dtype == "int8" else (0, 255)
    assert qmin <= zero <= qmax  # real 0 is the code `zero`, exactly
    assert scale > 0 and float(np.float32(scale)) == scale
    if power2:
        assert np.log2(scale) == np.round(np.log2(scale))
    tolerance = scale * 0.5 + 1e-9 * max(abs(lo), abs(hi), 1.0)
    assert scale * (qmin - zero) <= min(lo, 0.0) + tolerance
    assert scale * (qmax - zero) >= max(hi, 0.0) - tolerance


@CI
@given(st.integers(1, 6), st.integers(1, 5), st.floats(1e-3, 1e3))
def test_weight_scales_are_per_channel_max_over_127(channels, size, magnitude):
    w = np.random.default_rng(channels * 7 + size).standard_normal((channels, size)) * magnitude
    scales = weight_scales(w, axis=0)
    assert len(scales) == channels
    for c in range(channels):
        assert scales[c] == pytest.approx(np.abs(w[c]).max() / 127, rel=1e-6)
    assert weight_scales(w, axis=None) == pytest.approx((np.abs(w).max() / 127,), rel=1e-6)
