"""Hand-built models through the whole flow on every preset: the simulator's int8 outputs equal
the quantizer's integer reference bit for bit, with double buffering on and off."""

from __future__ import annotations

import pytest

from tests.e2e import models
from tests.e2e.flow import compile_and_check

PRESETS = ("default", "large", "edge")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", sorted(models.ALL))
def test_model_is_bit_exact(name: str, preset: str) -> None:
    compiled, result = compile_and_check(models.ALL[name](), preset)
    assert result.stats.cycles >= result.stats.bound_cycles
    assert compiled.summary.array_macs == result.stats.macs
    assert compiled.summary.macs <= compiled.summary.array_macs


@pytest.mark.parametrize("name", ["big_conv", "mobile_block"])
def test_single_buffered_schedule_is_bit_exact_and_slower(name: str) -> None:
    _, double = compile_and_check(models.ALL[name](), "edge", double_buffer=True)
    _, single = compile_and_check(models.ALL[name](), "edge", double_buffer=False)
    assert double.stats.cycles < single.stats.cycles
