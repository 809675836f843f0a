"""int16 Adds that round once (`numerics.wide_add`) on the accelerator: an int16 map by a
scalar constant (Add or Sub, the constant either operand) is the ADD of the constant (its
codes read pixel by pixel at stride 0), not a LUT; an int16 sum with an int8 operand
whose scale is far above its own. Bit-exact against the integer reference on every preset,
batched."""

from __future__ import annotations

import warnings

import pytest

from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.errors import QuantizeWarning
from quantizer.options import QuantOptions
from simulator import isa
from tests.e2e import models
from tests.e2e.flow import check_bit_exact, model_samples
from tests.quantizer.util import profile_of

PRESETS = ("default", "edge", "large")


def build(proto, names: tuple[str, ...], preset: str):
    profile = profile_of(proto, model_samples(proto, 8), optimized_graph(proto))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizeWarning)
        return compile_model(proto, profile,
                             CompileOptions(quant=QuantOptions(int16_tensors=names)), preset)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("op, constant_first", [("Add", False), ("Add", True), ("Sub", False),
                                                ("Sub", True)])
def test_an_int16_map_by_a_constant_is_an_add_of_the_constant(op, constant_first,
                                                              preset) -> None:
    proto = models.wide_map_by_constant(op, constant_first)
    built = build(proto, ("h", "c", "a"), preset)
    node = next(n for n in built.qgraph.nodes if n.name == "map")
    assert "table_of" not in node.attrs and built.qgraph.type_of("a").dtype == "int16"
    adds = [i for i in built.compiled.program.instructions if i.op is isa.ADD]
    wide = "b_wide" if constant_first else "a_wide"
    assert adds and all(i.args[wide] and i.args["wide"] for i in adds)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, seed=1))


@pytest.mark.parametrize("preset", PRESETS)
def test_an_int16_sum_that_cancels_runs_bit_exactly(preset) -> None:
    proto = models.cancelling_sum()
    built = build(proto, ("p", "s"), preset)
    adds = [i for i in built.compiled.program.instructions if i.op is isa.ADD]
    assert adds and all(i.args["a_wide"] and i.args["wide"] and not i.args["b_wide"]
                        for i in adds)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, seed=1))
