"""uint8 activations compile as int8 codes offset by -128: the rewritten graph's integer
reference equals the original's codes minus 128 on every value, and its floats are equal."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.passes.offset_uint8 import has_uint8, offset_uint8
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from tests.e2e.flow import quantized
from tests.e2e.test_random_graphs import random_model

SCHEMES = (QuantOptions(activation_dtype="uint8"),
           QuantOptions(activation_dtype="uint8", symmetric_activations=True, per_channel=False),
           QuantOptions(activation_dtype="uint8", schema="power2", per_channel=False))


@pytest.mark.parametrize("seed", range(12))
def test_offset_graph_computes_the_uint8_codes_minus_128(seed: int) -> None:
    rng = np.random.default_rng(seed)
    proto = None
    while proto is None or not proto.graph.node:  # a draw may hold no node: draw on
        proto, calibration, feeds = random_model(lambda lo, hi: int(rng.integers(lo, hi + 1)))
    try:
        qgraph = quantized(proto, calibration, SCHEMES[seed % len(SCHEMES)])
    except QuantizeError:
        pytest.skip("a degenerate graph the quantizer rejects")
    signed = offset_uint8(qgraph)
    assert has_uint8(qgraph) and not has_uint8(signed)
    compared = 0
    for feed in feeds:
        want, got = run_int8(qgraph, feed, keep_all=True), run_int8(signed, feed, keep_all=True)
        for name, value in qgraph.values.items():
            if value.is_const:
                continue
            if value.type.dtype == "uint8":
                assert signed.type_of(name).dtype == "int8"
                np.testing.assert_array_equal(got[name], want[name].astype(np.int16) - 128,
                                              err_msg=name)
                compared += 1
            elif value.type.dtype == "float32":
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert compared > 0


def test_int8_graphs_are_left_alone() -> None:
    rng = np.random.default_rng(0)
    proto, calibration, _ = random_model(lambda lo, hi: int(rng.integers(lo, hi + 1)))
    qgraph = quantized(proto, calibration)
    assert offset_uint8(qgraph) is qgraph


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_uint8_models_compile_bit_exact(preset: str) -> None:
    """The program's bindings are uint8 (zero points as quantized) and its raw outputs equal
    the uint8 reference's codes."""
    from compiler.backend.program import BackendOptions
    from compiler.pipeline import compile_int8
    from simulator.arch import Arch
    from tests.e2e.flow import check_bit_exact

    for seed in range(4):
        rng = np.random.default_rng(seed)
        proto, calibration, feeds = random_model(lambda lo, hi: int(rng.integers(lo, hi + 1)))
        qgraph = quantized(proto, calibration, SCHEMES[seed % len(SCHEMES)])
        compiled = compile_int8(qgraph, Arch.load(preset), BackendOptions())
        program = compiled.program
        assert {b.dtype for b in program.inputs + program.outputs} == {"uint8"}
        check_bit_exact(qgraph, compiled, feeds)
