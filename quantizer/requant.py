"""Real rescale ratios → the integer (multiplier, shift) pairs of numerics.requantize."""

from __future__ import annotations

from typing import Iterable

from quantizer.errors import QuantizeError
from simulator import numerics
from simulator.errors import SimulatorError


def ratio(real: float, where: str) -> tuple[int, int]:
    """numerics.quantize_multiplier(real), with an error that names the node when it fails."""
    try:
        return numerics.quantize_multiplier(float(real))
    except SimulatorError:
        raise QuantizeError(f"{where}: cannot requantize by the ratio {float(real):.3g} of its "
                            f"scales (a multiplier and shift represent [2^-32, 2^31)); its "
                            f"input or output range is degenerate") from None


def ratios(reals: Iterable[float], where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-channel (multipliers, shifts) as two tuples."""
    pairs = [ratio(r, where) for r in reals]
    return tuple(m for m, _ in pairs), tuple(s for _, s in pairs)
