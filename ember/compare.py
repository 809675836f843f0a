"""Comparing two runs of a model: the error measures every report uses."""

from __future__ import annotations

import numpy as np


def max_relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual − expected| / max |expected|: a normwise error, defined near zero too."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {actual.shape} vs {expected.shape}")
    if expected.size == 0:
        return 0.0
    scale = float(np.max(np.abs(expected)))
    err = float(np.max(np.abs(actual - expected)))
    return err / scale if scale > 0 else err
