"""int16 through the vector unit's MUL of two activations: a squeeze-and-excitation block's
map x, its gate HardSigmoid(...) [N, C, 1, 1] broadcast over x, and their product may each be
int16 (MUL a_wide, b_wide, wide; `numerics.mul` multiplies the whole codes exactly in int64),
as may both factors and the product of two whole tensors. Bit-exact against the integer
reference on every preset, batched; the product closer to fp32 than int8; the MUL's cycles one
pass per pair of operand planes plus one for an int16 product's second plane; a Mul by a
constant tensor in int16 too (its codes int16); what is left refused in one line."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper

from ember.flow import CompileOptions, compile_model, optimized_graph, quantize_model
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from simulator import isa
from tests.e2e.flow import (assert_busy_is_own_cycles, check_bit_exact, model_samples,
                            value_sqnr_db)
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

PRESETS = ("default", "edge", "large")
N, C, H, W = 2, 24, 8, 8


def _conv(rng, name: str, x: str, y: str, cin: int, cout: int, k: int = 1):
    pad = (k - 1) // 2
    node = helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name,
                            pads=[pad] * 4)
    return node, {f"{name}_w": (rng.standard_normal((cout, cin, k, k)) * .9
                                / np.sqrt(cin * k * k)).astype(np.float32),
                  f"{name}_b": (rng.standard_normal(cout) * .2).astype(np.float32)}


def squeeze_excite(gate_first: bool = False, whole: bool = False, pixel: bool = False,
                   head: bool = True):
    """x -> Conv 3x3 + Relu -> mid; GlobalAveragePool(mid) -> Conv 1x1 + Relu -> Conv 1x1 ->
    HardSigmoid -> g [N, C, 1, 1]; m = mid * g (g * mid with `gate_first`); m -> Conv 1x1 -> y
    (without `head`, m is the model's output). With `whole`, the gate is a map of mid's shape
    (Conv 1x1 of mid, no pool): the product of two whole tensors; with `pixel`, one value per
    pixel [N, 1, H, W] (a spatial attention's: Conv 1x1 of mid to one channel)."""
    rng = np.random.default_rng(3)
    nodes, inits = [], {}

    def add(node_and_inits):
        nodes.append(node_and_inits[0])
        inits.update(node_and_inits[1])

    add(_conv(rng, "c1", "x", "pre", 3, C, k=3))
    nodes.append(helper.make_node("Relu", ["pre"], ["mid"], name="relu"))
    if whole or pixel:
        add(_conv(rng, "s2", "mid", "g0", C, 1 if pixel else C))
    else:
        nodes.append(helper.make_node("GlobalAveragePool", ["mid"], ["p"], name="pool"))
        add(_conv(rng, "s1", "p", "q0", C, C // 4))
        nodes.append(helper.make_node("Relu", ["q0"], ["q"], name="relu_s"))
        add(_conv(rng, "s2", "q", "g0", C // 4, C))
    nodes.append(helper.make_node("HardSigmoid", ["g0"], ["g"], name="gate", alpha=1 / 6))
    nodes.append(helper.make_node("Mul", ["g", "mid"] if gate_first else ["mid", "g"], ["m"],
                                  name="se"))
    if not head:
        return model(nodes, {"x": [N, 3, H, W]}, {"m": [N, C, H, W]}, inits)
    add(_conv(rng, "c2", "m", "y", C, 8))
    return model(nodes, {"x": [N, 3, H, W]}, {"y": [N, 8, H, W]}, inits)


def build(proto, names=(), preset: str = "default"):
    profile = profile_of(proto, model_samples(proto, 8, 0), optimized_graph(proto))
    return compile_model(proto, profile,
                         CompileOptions(quant=QuantOptions(int16_tensors=tuple(names))), preset)


def _mul(program) -> isa.Insn:
    muls = [i for i in program.instructions if i.op is isa.MUL]
    assert muls
    return muls[0]


# Every non-empty subset of the SE block's map, gate and product.
COMBINATIONS = [names for k in (1, 2, 3) for names in itertools.combinations(("mid", "g", "m"), k)]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("names", COMBINATIONS, ids="+".join)
def test_a_squeeze_and_excitation_product_in_int16_runs_bit_exactly(names, preset) -> None:
    """x, the gate [N, C, 1, 1] broadcast over it, the product: each int16 alone or with the
    others; three samples in a batch, then the last alone."""
    proto = squeeze_excite()
    built = build(proto, names, preset)
    for name in names:
        assert built.qgraph.values[name].type.dtype == "int16"
    mul = _mul(built.compiled.program)
    assert (mul.args["a_wide"], mul.args["b_wide"], mul.args["wide"]) == \
        tuple(int(n in names) for n in ("mid", "g", "m"))
    assert mul.args["b_step"] == 0  # the gate: one row for the tile's pixels
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("names", [("mid", "g", "m"), ("g",), ("m",)], ids="+".join)
def test_the_gate_may_be_the_first_factor(names, preset) -> None:
    """Mul(g, mid): the factor of the output's shape is MUL's a, whichever input it is."""
    proto = squeeze_excite(gate_first=True)
    built = build(proto, names, preset)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("names", [("mid",), ("g",), ("m",), ("mid", "g", "m")],
                         ids="+".join)
def test_a_product_of_two_whole_int16_tensors_runs_bit_exactly(names, preset) -> None:
    proto = squeeze_excite(whole=True)
    built = build(proto, names, preset)
    mul = _mul(built.compiled.program)
    assert (mul.args["a_wide"], mul.args["b_wide"], mul.args["wide"]) == \
        tuple(int(n in names) for n in ("mid", "g", "m"))
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("names", [("mid", "g", "m"), ("g",), ("mid",)], ids="+".join)
def test_a_gate_of_one_value_per_pixel_runs_bit_exactly(names, preset) -> None:
    """A spatial gate [N, 1, H, W]: lane 0 of each of its rows for every channel (b_splat),
    its low plane's bytes after its high plane's rows."""
    proto = squeeze_excite(pixel=True)
    built = build(proto, names, preset)
    mul = _mul(built.compiled.program)
    assert mul.args["b_splat"] == 1 and mul.args["b_wide"] == int("g" in names)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))


@pytest.mark.parametrize("preset", PRESETS)
def test_an_int16_product_may_be_the_model_output(preset) -> None:
    """The host reads both planes of the int16 product."""
    proto = squeeze_excite(head=False)
    built = build(proto, ("mid", "g", "m"), preset)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))


@pytest.mark.parametrize("whole", [False, True])
def test_the_int16_product_is_far_closer_to_fp32_than_int8(whole) -> None:
    """The product's own rounding (16-bit codes against 8-bit ones of its range) is over 30 dB
    smaller; the integer reference's product, with both factors int16 too, is closer to fp32
    than the all-int8 one (the map's int8 input and the weights still err)."""
    proto = squeeze_excite(whole=whole)
    graph = optimized_graph(proto)
    wide, narrow = build(proto, ("mid", "g", "m")).qgraph, build(proto).qgraph

    def sqnr(qgraph, stored: bool, seed: int) -> float:
        return value_sqnr_db(graph, qgraph, "m", model_samples(proto, 4, seed), stored)

    # The calibration samples for the rounding alone (others may clip at the range's ends).
    assert sqnr(wide, True, 0) >= sqnr(narrow, True, 0) + 30
    assert sqnr(wide, False, 9) > sqnr(narrow, False, 9)


@pytest.mark.parametrize("preset", PRESETS)
def test_a_wide_mul_costs_a_pass_per_pair_of_planes_and_its_second_output_plane(preset):
    """int16 x int16 -> int16 is four partial-product passes and one more for the product's low
    plane: five times the int8 MUL of the same rows (`vector.mul_cycles`), one operand int16
    twice; the simulator charges the layer exactly its instructions' cycles."""
    proto = squeeze_excite()
    for names, passes in ((("mid", "g", "m"), 5), (("mid",), 2), (("g",), 2), (("m",), 2),
                          (("mid", "g"), 4)):
        program = build(proto, names, preset).compiled.program
        arch = program.arch
        for insn in (i for i in program.instructions if i.op is isa.MUL):
            narrow = isa.MUL(**{**insn.args, "wide": 0, "a_wide": 0, "b_wide": 0})
            assert insn.op.cycles(arch, insn) == passes * insn.op.cycles(arch, narrow) > 0
    assert_busy_is_own_cycles(build(proto, ("mid", "g", "m"), preset).compiled.program, "se",
                              "vector", "vector")


def _refused(nodes, inits, named: str, match: str) -> None:
    rng = np.random.default_rng(0)
    conv, more = _conv(rng, "c1", "x", "pre", 3, C, k=3)
    nodes = [conv, helper.make_node("Relu", ["pre"], ["mid"], name="relu"), *nodes]
    proto = model(nodes, {"x": [N, 3, H, W]}, {"y": [N, C, H, W]}, {**more, **inits})
    profile = profile_of(proto, model_samples(proto, 8, 0), optimized_graph(proto))
    with pytest.raises(QuantizeError, match=match):
        quantize_model(proto, profile, QuantOptions(int16_tensors=(named,)))


@pytest.mark.parametrize("preset", PRESETS[:2])
@pytest.mark.parametrize("names", [("mid",), ("y",), ("mid", "y")], ids="+".join)
@pytest.mark.parametrize("shape", [(1, 1, H, W), (1, 1, 1, W), (1, C, H, W)],
                         ids=["pixel", "column", "whole"])
def test_a_mul_by_a_constant_tensor_reads_and_writes_int16(shape, names, preset) -> None:
    """A Mul of an activation by a constant of more than one value (a mask per pixel or per
    column, a whole map; an LSTM's peephole, a GRU's r * Rbh) is MUL of a constant operand,
    its codes in the DRAM image: with the map or the product int16 they are int16 codes too
    (b_wide: two planes), lane 0 of each row where they have one channel (b_splat). (A scale
    per channel folds into the Conv.)"""
    rng = np.random.default_rng(1)
    conv, more = _conv(rng, "c1", "x", "pre", 3, C, k=3)
    nodes = [conv, helper.make_node("Relu", ["pre"], ["mid"], name="relu"),
             helper.make_node("Mul", ["mid", "k"], ["y"], name="scale")]
    proto = model(nodes, {"x": [N, 3, H, W]}, {"y": [N, C, H, W]},
                  {**more, "k": rng.uniform(-1.5, 1.5, shape).astype(np.float32)})
    built = build(proto, names, preset)
    mul = _mul(built.compiled.program)
    assert (mul.args["a_wide"], mul.args["b_wide"], mul.args["wide"]) == \
        (int("mid" in names), 1, int("y" in names))
    assert mul.args["b_splat"] == int(shape[1] == 1)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))


def test_a_mul_broadcast_along_one_axis_of_the_pixels_still_refuses_int16() -> None:
    """A factor [N, C, 1, W] is no gate MUL broadcasts (a value per channel, pixel or image)."""
    nodes = [helper.make_node("ReduceMean", ["mid"], ["r"], name="rows", axes=[2]),
             helper.make_node("Mul", ["mid", "r"], ["y"], name="outer")]
    _refused(nodes, {}, "y", r"int16 tensor 'y': made by Mul 'outer'; only a Conv")


def test_an_int16_map_whose_global_pool_fits_once_is_pooled_from_one_buffer() -> None:
    """A squeeze-and-excitation block at 64 x 64 pixels (DB's first stage) with its map int16:
    the GlobalAveragePool's window is two planes of 4096 rows, twice over more than the
    default scratchpad's 16384: one buffer, each image's window loaded after the previous
    image's pool (no overlap), bit-exact."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["pre"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["pre"], ["mid"], name="relu"),
             helper.make_node("GlobalAveragePool", ["mid"], ["p"], name="pool"),
             helper.make_node("Conv", ["p", "w2", "b2"], ["y"], name="c2")]
    inits = {"w": rng.normal(0, .3, (C, 3, 3, 3)), "b": rng.normal(0, .1, C),
             "w2": rng.normal(0, .3, (4, C, 1, 1)), "b2": rng.normal(0, .1, 4)}
    proto = model(nodes, {"x": [2, 3, 64, 64]}, {"y": [2, 4, 1, 1]},
                  {k: v.astype(np.float32) for k, v in inits.items()})
    built = build(proto, ("mid",))
    pools = [i for i in built.compiled.program.instructions if i.op is isa.AVGPOOL]
    assert pools and all(i.args["in_wide"] and i.args["in_h"] == 64 for i in pools)
    assert 2 * (2 * 64 * 64 + 1) > built.compiled.program.arch.scratchpad.rows
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))


def _pooling():
    """A sentence encoder's masked pooling: x [N, S, D] -> MatMul -> h (rows in order); a
    weight per token [N, S, 1] from x by MatMul and Sigmoid -> g; m = h * g -> MatMul -> y."""
    rng = np.random.default_rng(5)
    s, d = 12, 24
    inits = {"w1": (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32),
             "w2": (rng.standard_normal((d, 1)) / np.sqrt(d)).astype(np.float32),
             "w3": (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="dense"),
             helper.make_node("MatMul", ["x", "w2"], ["g0"], name="score"),
             helper.make_node("Sigmoid", ["g0"], ["g"], name="gate"),
             helper.make_node("Mul", ["h", "g"], ["m"], name="weigh"),
             helper.make_node("MatMul", ["m", "w3"], ["y"], name="out")]
    return model(nodes, {"x": [2, s, d]}, {"y": [2, s, d]}, inits, opset=17)


@pytest.mark.parametrize("preset", PRESETS[:2])
@pytest.mark.parametrize("names", [("h",), ("h", "m")], ids="+".join)
def test_a_weight_per_row_multiplies_int16_rows(names, preset) -> None:
    """A row-major product by a value per row (MiniLM's pooling weights): MUL reads the int16
    rows (a_wide), the weight broadcast over each row's lanes; three samples in a batch."""
    proto = _pooling()
    built = build(proto, names, preset)
    mul = _mul(built.compiled.program)
    assert mul.args["a_wide"] == 1 and mul.args["b_wide"] == 0
    assert mul.args["wide"] == int("m" in names)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))
