"""A window of finer knots for a table op reading int16 codes (LUT zoom, origin;
`numerics.interpolate`, placed by `int8.knot_window`). 257 knots over a wide int16 range put
HardSwish's bends at +-3 between two or three knots: on a real text detector a HardSwish lost
6 dB that way while its own rounding cost 70 dB. The window puts 256 finer segments over the
bends: the LUT is then within its output's rounding, bit-exact on every preset, at the same
cycles; a map the coarse knots already follow (linear over the input's range) gets none."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from onnx import helper

from compiler.graph import int8
from compiler.graph.ops import OPS
from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.errors import QuantizeWarning
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from simulator import isa, numerics
from simulator.arch import Arch
from tests.e2e.flow import check_bit_exact
from tests.onnx_builder import model
from tests.quantizer.util import profile_of


def wide_hardswish():
    """x -> Conv 3x3 (16 channels, weights ~ N(0, 30): 'pre' spans hundreds) -> HardSwish ->
    Conv 1x1 -> y; 'pre' and 'act' int16 when built."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["pre"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["pre"], ["act"], name="act"),
             helper.make_node("Conv", ["act", "w2"], ["y"], name="c2")]
    inits = {"w1": rng.normal(0, 30, (16, 3, 3, 3)), "b1": rng.normal(0, 1, 16),
             "w2": rng.normal(0, .1, (8, 16, 1, 1))}
    return model(nodes, {"x": [2, 3, 8, 8]}, {"y": [2, 8, 8, 8]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def samples(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(count)]


@functools.lru_cache(maxsize=None)
def build(preset: str = "default"):
    proto = wide_hardswish()
    profile = profile_of(proto, samples(8, 0), optimized_graph(proto))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizeWarning)
        return compile_model(proto, profile,
                             CompileOptions(quant=QuantOptions(int16_tensors=("pre", "act"))),
                             preset)


def _hardswish(v):
    return OPS["HardSwish"].fp32(np.asarray(v, np.float32))


def _act(qgraph):
    return next(node for node in qgraph.nodes if node.name == "act")


@pytest.mark.parametrize("preset", ["default", "edge", "large"])
def test_the_window_covers_the_bends_and_runs_bit_exactly(preset: str) -> None:
    """The LUT reads 514 knots (two blocks of rows, as an int16 table's), its window spans
    the codes of -3 and +3, and the program equals the integer reference, batched."""
    built = build(preset)
    zoom, origin = _act(built.qgraph).attrs["knots"]
    quant = built.qgraph.values[_act(built.qgraph).inputs[0]].type.quant
    bends = np.array([-3.0, 3.0]) / quant.scale[0]
    covered = min(bends[1], origin + numerics.window_codes(zoom)) - max(bends[0], origin)
    assert 1 <= zoom <= numerics.MAX_ZOOM and covered > 0.8 * (bends[1] - bends[0])
    assert quant.scale[0] * 32767 > 100  # the coarse knots are over 0.78 apart
    luts = [i for i, source in zip(built.compiled.program.instructions,
                                   built.compiled.program.source)
            if i.op is isa.LUT and source == "act"]
    assert luts and all((i.args["in_wide"], i.args["zoom"], i.args["origin"])
                        == (1, zoom, origin) for i in luts)
    check_bit_exact(built.qgraph, built.compiled, samples(3, 1))


def test_the_window_costs_no_cycles() -> None:
    """Which knots a code takes is a compare beside the index: the cycle formula is the
    coarse table's."""
    arch = Arch.load("default")
    insn = isa.LUT(src=0, dst=64, rows=40, table=128, in_wide=1, wide=1, zoom=5, origin=-700)
    coarse = isa.LUT(src=0, dst=64, rows=40, table=128, in_wide=1, wide=1)
    assert isa.LUT.cycles(arch, insn) == isa.LUT.cycles(arch, coarse)
    assert isa.lut_table_rows(arch.lanes, 0, 1, 1, 5) == \
        2 * -(-2 * numerics.KNOTS // arch.lanes)


def test_the_window_brings_the_lut_to_its_output_rounding() -> None:
    """Over the int16 codes 'pre' takes on other samples, the LUT's output against HardSwish
    of the very codes (in output codes): with the window within a step at every code; with
    the coarse knots alone several steps at the bends, over 20 dB worse in all."""
    qgraph = build().qgraph
    node = _act(qgraph)
    x_in, y_out = (qgraph.values[name].type for name in (node.inputs[0], node.outputs[0]))
    codes = np.concatenate([run_int8(qgraph, s, keep_all=True)[node.inputs[0]].ravel()
                            for s in samples(4, 9)])
    exact = _hardswish(numerics.dequantize(codes, x_in.quant.scale[0], 0)) / \
        y_out.quant.scale[0]
    out = y_out.quant.scale[0], 0, y_out.dtype, numerics.RANGES[y_out.dtype]
    coarse = int8.wide_table(lambda v: _hardswish(v), {}, x_in.quant.scale[0], 0, "int16",
                             *out)
    window = numerics.interpolate(codes, qgraph.values[node.inputs[-1]].const, y_out.dtype,
                                  *node.attrs["knots"])
    without = numerics.interpolate(codes, coarse, y_out.dtype)
    assert np.abs(window - exact).max() <= 1.0
    assert np.abs(without - exact).max() > 4.0

    def sqnr(got):
        return 10 * np.log10((exact ** 2).sum() / ((got - exact) ** 2).sum())
    assert sqnr(window) > sqnr(without) + 20


@pytest.mark.parametrize("fn, span", [
    (lambda v: 0.5 * v + 1.0, (-(2**15), 2**15 - 1)),  # an affine map: the knots are exact
    # HardSwish over codes past +3 only, short of the last knot (saturated past the range):
    # x itself
    (_hardswish, (12000, 30000)),
])
def test_a_map_the_coarse_knots_follow_gets_no_window(fn, span) -> None:
    scale = 300.0 / 32767
    assert int8.knot_window(fn, {}, scale, 0, scale, 0, "int16", numerics.RANGES["int16"],
                            span=span) == (0, 0)


def test_the_window_follows_the_codes_the_input_takes() -> None:
    """The same HardSwish over all codes and over the codes of [0, 300] only: the window
    moves to hold the one bend those take (+3, not -3)."""
    scale = 300.0 / 32767
    fn, out = _hardswish, (scale, 0, "int16", numerics.RANGES["int16"])
    zoom, origin = int8.knot_window(fn, {}, scale, 0, *out, span=(0, 2**15 - 1))
    assert origin <= 3 / scale < origin + numerics.window_codes(zoom)
    assert origin > -3 / scale
    assert int8.knot_window(fn, {}, scale, 0, *out) != (zoom, origin)


def test_a_function_that_overflows_outside_the_span_builds_its_table_quietly() -> None:
    """The window search and the knots weigh every int16 code, far past the calibrated span
    too, where a map by a large constant (a mask's) overflows float32: the clip to the
    output's codes takes ±inf, and no RuntimeWarning reaches the user."""
    scale = 300.0 / 32767
    out_scale = 3e37 / 32767

    def huge(v):
        return v * np.float32(1e37)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        knots = int8.knot_window(huge, {}, scale, 0, out_scale, 0, "int16",
                                 numerics.RANGES["int16"], span=(-100, 100))
        table = int8.wide_table(huge, {}, scale, 0, "int16", out_scale, 0, "int16",
                                numerics.RANGES["int16"], knots)
    assert table.max() == numerics.RANGES["int16"][1]


@pytest.mark.parametrize("windowed", [False, True])
def test_the_knots_are_fitted_so_a_curved_stretch_errs_both_ways(windowed: bool) -> None:
    """HardSwish's parabola between -3 and 3 lies under every chord: knots at the function's
    own values made each int16 HardSwish err upwards, and PicoDet's 94 of them added up (4.6 dB
    of its output against exact HardSwishes). The knots are least-squares fits over the codes
    they serve: over the coarse knots the error on the bends is centred and smaller; with a
    window, its knots are close enough that both sit at the output's rounding."""
    scale = 40 / 32767
    codes = np.arange(-(2**15), 2**15)
    exact = _hardswish(codes * scale) / scale
    knots = (0, 0)
    if windowed:
        knots = int8.knot_window(_hardswish, {}, scale, 0, scale, 0, "int16", (-32768, 32767))
        assert knots[0] > 0
    fitted = int8.wide_table(_hardswish, {}, scale, 0, "int16", scale, 0, "int16",
                             (-32768, 32767), knots=knots)
    at = (np.arange(numerics.KNOTS) - 128) * 256  # the knots' codes, the window's after
    if windowed:
        at = np.concatenate([at, knots[1] + (np.arange(numerics.KNOTS) << (8 - knots[0]))])
    at_values = int8._knot_entries(_hardswish, {}, at, scale, 0, scale, 0, "int16",
                                   (-32768, 32767))
    bends = np.abs(codes * scale) < 4
    errors = {}
    for name, table in (("fitted", fitted), ("values", at_values)):
        error = numerics.interpolate(codes, table, "int16", *knots) - exact
        errors[name] = (error[bends].mean(), np.sqrt((error[bends] ** 2).mean()))
    if windowed:  # knots 2^(8 - zoom) codes apart: both near the output's own rounding
        assert abs(errors["fitted"][0]) < 0.1 and errors["fitted"][1] < 0.35
        assert errors["fitted"][1] <= errors["values"][1]
    else:
        assert errors["values"][0] > 0.25 and abs(errors["fitted"][0]) < 0.05
        assert errors["fitted"][1] < 0.8 * errors["values"][1]


def test_the_window_goes_where_the_data_is() -> None:
    """A HardSwish whose input spans [-100, 30] and output [-0.4, 30]: its output's range
    clips it at 30, a third bend at the input range's far end. Weighed evenly over the span, one
    window stretched coarsely over all three (zoom 2, 2.5 codes rms over the bends at -3 and 3);
    weighed by where the calibration data is (`int8.code_density`: most of it within a few
    units of 0, as a BatchNorm's output), it holds -3 and 3 finely, within the output's
    rounding there."""
    in_scale, out_scale = 100 / 32767, 30 / 32767
    out = (out_scale, 0, "int16", numerics.RANGES["int16"])
    values = np.random.default_rng(0).normal(0, 2, 100000)
    counts, edges = np.histogram(values, bins=2048, range=(-100, 30))
    span = (-32767, int(30 / in_scale))
    density = int8.code_density(edges, counts, in_scale, 0, span)
    assert density.sum() == pytest.approx(1.0)
    codes = np.arange(-(2**15), 2**15)
    exact = np.clip(_hardswish(codes * in_scale) / out_scale, -32768, 32767)
    bends = np.abs(codes * in_scale) < 3.5
    found = {}
    for weighed in (None, density):
        knots = int8.knot_window(_hardswish, {}, in_scale, 0, *out, span=span, density=weighed)
        table = int8.wide_table(_hardswish, {}, in_scale, 0, "int16", *out, knots=knots)
        error = numerics.interpolate(codes, table, "int16", *knots) - exact
        found["even" if weighed is None else "data"] = (knots, np.sqrt((error[bends] ** 2).mean()))
    (zoom, origin), rms = found["data"]
    assert origin <= -3 / in_scale and 3 / in_scale < origin + numerics.window_codes(zoom)
    assert zoom > found["even"][0][0] and rms < 0.5 < found["even"][1]
