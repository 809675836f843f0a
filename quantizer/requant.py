"""Real rescale ratios → the integer (multiplier, shift) pairs of numerics.requantize.

A ratio outside the fixed-point range [2^-32, 2^31) is clamped to its nearest end, with a
warning that names the node: the clamp changes no output but one. Below 2^-32, every int32
accumulator times the ratio lies within (-0.5, 0.5) and rounds to the zero point, as it does
at 2^-32 (bar the single accumulator -2^31, one code off); at 2^30 and above, every non-zero
accumulator saturates the 8-bit output at either ratio, and zero stays zero.
"""

from __future__ import annotations

import math
import warnings
from typing import Iterable

from quantizer.errors import QuantizeError, QuantizeWarning
from simulator import numerics
from simulator.errors import SimulatorError

# The fixed-point range is [RATIO_MIN, RANGE_END); a ratio at or past its end is clamped to
# RATIO_MAX, exactly representable, where every non-zero accumulator already saturates.
RATIO_MIN, RATIO_MAX, RANGE_END = 2.0**-32, 2.0**30, 2.0**31
# A channel's bias code stays within 2^24 (far inside int32, with room for the products): a
# channel whose weights are near zero but whose bias is not (a dead channel that BatchNorm
# folding left) gets its weight scale floored to |bias| / (s_x * 2^24) instead of failing
# (`quantizer.quantize.weight_floor`).
BIAS_CODE_LIMIT = 2.0**24


def ratio(real: float, where: str) -> tuple[int, int]:
    """numerics.quantize_multiplier(real), clamped into the fixed-point range (with a warning);
    an error that names the node for a ratio that is no positive number at all."""
    (multiplier,), (shift,) = ratios([real], where)
    return multiplier, shift


def add_ratios(x_ratio: float, y_ratio: float, where: str
               ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The parameter lanes of an ADD with an int16 operand (`numerics.wide_add`): each
    operand's ratio to the output scale, at the larger one's shift (`numerics.add_multipliers`
    of its `ratio`)."""
    return numerics.add_multipliers(x_ratio, y_ratio, *ratio(max(x_ratio, y_ratio), where))


def ratios(reals: Iterable[float], where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-channel (multipliers, shifts) as two tuples; one warning for the clamped ones."""
    reals = [float(r) for r in reals]
    clamped = [(RATIO_MIN if r < RATIO_MIN else RATIO_MAX if r >= RANGE_END else r)
               if math.isfinite(r) and r > 0 else r for r in reals]
    moved = [r for r, c in zip(reals, clamped) if r != c]
    if moved:
        what = (f"the requantization ratio {_fmt(moved[0])} of its scales is" if len(reals) == 1
                else f"{len(moved)} of {len(reals)} requantization ratios "
                     f"({_fmt(min(moved))}..{_fmt(max(moved))}) are")
        warnings.warn(QuantizeWarning(
            f"{where}: {what} outside the fixed-point range [2^-32, 2^31); clamped to it (below "
            f"it every product rounds to zero either way, above it every non-zero one "
            f"saturates either way)"), stacklevel=2)
    try:
        multipliers, shifts = numerics.quantize_multipliers(clamped)
    except SimulatorError:
        raise QuantizeError(f"{where}: cannot requantize by the ratio "
                            f"{_fmt(next(r for r in clamped if not (math.isfinite(r) and r > 0)))}"
                            f" of its scales: a ratio must be a positive finite number") from None
    return tuple(multipliers.tolist()), tuple(shifts.tolist())


def _fmt(value: float) -> str:
    return f"{value:.3g}"
