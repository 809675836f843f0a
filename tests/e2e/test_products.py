"""Products of two activations on the accelerator (the vector unit's MUL, with requantization):
a squeeze-and-excitation channel gate, two maps of one shape, a scalar activation times a map;
Div by an activation as a reciprocal table and the product; PRelu. Each runs bit-exactly on the
edge and default presets, with no host segment."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.errors import CompileError
from quantizer.errors import QuantizeError, QuantizeWarning
from ember.flow import CompileOptions, compile_model, optimized_graph
from tests.e2e.flow import compile_and_check, samples
from tests.onnx_builder import model
from simulator import isa
from tests.quantizer.util import profile_of

C = 10  # two channel blocks on the edge preset (8 lanes), a partial one on default (16)
PRESETS = ["edge", "default"]


def _conv(rng, name, x, y, c_in, c_out, k=3, **attrs):
    w = (rng.standard_normal((c_out, c_in, k, k)) * 0.4).astype(np.float32)
    pads = [k // 2] * 4
    return helper.make_node("Conv", [x, f"{name}_w"], [y], name=name, pads=pads, **attrs), \
        {f"{name}_w": w}


def squeeze_excitation(seed: int = 0, gate: str = "HardSigmoid", channels: int = C,
                       batch: int = 2, hw: tuple[int, int] = (6, 5)):
    """Conv → GlobalAveragePool → Conv 1x1 → Relu → Conv 1x1 → gate → Mul with the map."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}
    for node, w in (_conv(rng, "conv", "x", "c", 3, channels),
                    _conv(rng, "fc1", "p", "f1", channels, 4, k=1),
                    _conv(rng, "fc2", "r", "f2", 4, channels, k=1)):
        nodes.append(node)
        inits.update(w)
    nodes[1:1] = [helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool")]
    nodes[3:3] = [helper.make_node("Relu", ["f1"], ["r"], name="relu")]
    nodes += [helper.make_node(gate, ["f2"], ["g"], name="gate"),
              helper.make_node("Mul", ["c", "g"], ["y"], name="scale")]
    return model(nodes, {"x": [batch, 3, *hw]}, {"y": [batch, channels, *hw]}, inits)


def product(a_shape, b_shape, op: str = "Mul", swap: bool = False, seed: int = 0):
    """Two activations (each a Conv of its own input) multiplied or divided."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}
    for name, shape in (("a", a_shape), ("b", b_shape)):
        node, w = _conv(rng, f"conv_{name}", name, f"{name}c", 3, shape[1], k=1)
        nodes.append(node)
        inits.update(w)
    inputs = ["bc", "ac"] if swap else ["ac", "bc"]
    if op == "Div":  # a divisor away from zero, as real models have (a sum, a norm)
        inits["one"] = np.float32(1.0)
        nodes += [helper.make_node("Abs", ["bc"], ["babs"], name="abs"),
                  helper.make_node("Add", ["babs", "one"], ["bpos"], name="shift")]
        inputs = ["ac", "bpos"]
    out = np.broadcast_shapes(a_shape, b_shape)
    nodes.append(helper.make_node(op, inputs, ["y"], name="f"))
    return model(nodes, {"a": [a_shape[0], 3, *a_shape[2:]], "b": [b_shape[0], 3, *b_shape[2:]]},
                 {"y": list(out)}, inits)


@pytest.mark.parametrize("preset", PRESETS)
def test_squeeze_excitation_runs_on_the_accelerator_bit_exactly(preset: str) -> None:
    compiled, _ = compile_and_check(squeeze_excitation(), preset, count=3)
    assert compiled.program.host_segments == ()
    assert any(insn.op is isa.MUL for insn in compiled.program.instructions)


FORMS = {
    "same shape": ((1, C, 4, 5), (1, C, 4, 5), False),
    "gate first": ((2, C, 3, 3), (2, C, 1, 1), True),
    "scalar activation": ((2, C, 3, 4), (2, 1, 1, 1), False),
    "per pixel": ((1, C, 3, 4), (1, 1, 3, 4), True),
    "one gate for the batch": ((2, C, 3, 4), (1, C, 1, 1), False),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("form", FORMS)
def test_product_of_two_activations_bit_exact(form: str, preset: str) -> None:
    a_shape, b_shape, swap = FORMS[form]
    compiled, _ = compile_and_check(product(a_shape, b_shape, swap=swap), preset, count=2)
    assert compiled.program.host_segments == ()


def test_product_broadcast_along_one_spatial_axis_is_named() -> None:
    proto = product((1, C, 3, 4), (1, C, 1, 4))
    shapes = {"a": [1, 3, 3, 4], "b": [1, 3, 1, 4]}
    profile = profile_of(proto, samples(shapes, 4), optimized_graph(proto))
    with pytest.raises(CompileError, match=r"node 'f' \(Mul\): broadcasting \(1, 10, 1, 4\) "
                                           r"against \(1, 10, 3, 4\)"):
        compile_model(proto, profile, CompileOptions(), "edge")


DIVISIONS = {
    "same shape": ((1, C, 4, 5), (1, C, 4, 5)),
    "by a gate": ((2, C, 3, 3), (2, C, 1, 1)),
    "by a scalar activation": ((2, C, 3, 4), (2, 1, 1, 1)),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("form", DIVISIONS)
def test_div_by_an_activation_bit_exact(form: str, preset: str) -> None:
    compiled, _ = compile_and_check(product(*DIVISIONS[form], op="Div"), preset, count=2)
    assert compiled.program.host_segments == ()
    mnemonics = [insn.op for insn in compiled.program.instructions]
    assert isa.LUT in mnemonics and isa.MUL in mnemonics  # the reciprocal table, the product


def test_constant_over_an_activation_is_one_table() -> None:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Abs", ["c"], ["m"], name="abs"),
             helper.make_node("Add", ["m", "one"], ["d"], name="shift"),
             helper.make_node("Div", ["three", "d"], ["y"], name="f")]
    proto = model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, C, 4, 4]},
                  {"w": (rng.standard_normal((C, 3, 1, 1)) * 0.5).astype(np.float32),
                   "one": np.float32(1.0), "three": np.float32(3.0)})
    for preset in PRESETS:
        compiled, _ = compile_and_check(proto, preset)
        assert compiled.program.host_segments == ()
        assert isa.MUL not in {insn.op for insn in compiled.program.instructions}


def test_divisor_whose_range_holds_zero_is_named_in_a_warning_and_still_runs() -> None:
    proto = product((1, C, 3, 3), (1, C, 3, 3))  # b is a plain Conv output: it crosses 0
    div = next(node for node in proto.graph.node if node.op_type == "Mul")
    div.op_type = "Div"
    with pytest.warns(QuantizeWarning, match=r"node 'f' \(Div\): divisor 'bc' ranges over "
                                             r"\[-[0-9.]+, [0-9.]+\], which holds 0"):
        compiled, _ = compile_and_check(proto, "edge")
    assert compiled.program.host_segments == ()


def prelu_model(slope_shape: tuple[int, ...], channels: int = C, seed: int = 0):
    rng = np.random.default_rng(seed)
    node, w = _conv(rng, "conv", "x", "c", 3, channels)
    slope = rng.uniform(-0.5, 0.8, slope_shape).astype(np.float32)
    nodes = [node, helper.make_node("PRelu", ["c", "slope"], ["y"], name="prelu")]
    return model(nodes, {"x": [2, 3, 5, 4]}, {"y": [2, channels, 5, 4]}, {**w, "slope": slope})


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("slope", [(1,), (C, 1, 1), (1, C, 1, 1)], ids=str)
def test_prelu_bit_exact(slope: tuple[int, ...], preset: str) -> None:
    compiled, _ = compile_and_check(prelu_model(slope), preset, count=2)
    assert compiled.program.host_segments == ()
    luts = [insn for insn in compiled.program.instructions if insn.op is isa.LUT]
    assert luts and all(insn.args["per_lane"] == (slope != (1,)) for insn in luts)


def test_prelu_with_one_channel_block_loads_its_tables_once() -> None:
    compiled, _ = compile_and_check(prelu_model((4, 1, 1), channels=4), "edge", count=1)
    table_loads = [insn for insn in compiled.program.instructions
                   if insn.op is isa.LOAD and insn.args["y_size"] == isa.LUT.table_entries]
    assert len(table_loads) == 1


def test_prelu_slope_along_a_spatial_axis_is_named() -> None:
    proto = prelu_model((1, 1, 4))
    profile = profile_of(proto, samples({"x": [2, 3, 5, 4]}, 4), optimized_graph(proto))
    with pytest.raises(QuantizeError, match=r"node 'prelu' \(PRelu\): slope of shape \(1, 1, 4\) "
                                            r"varies along an axis other than the channels"):
        compile_model(proto, profile, CompileOptions(), "edge")
