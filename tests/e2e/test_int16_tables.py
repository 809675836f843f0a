"""int16 activations through the vector unit's table operators (HardSwish, HardSigmoid,
Sigmoid, SiLU, Tanh, LeakyRelu, a PRelu of one slope, ...): a tensor named in
`QuantOptions.int16_tensors` may be a table op's output, its 256 entries int16 codes written as
two planes (LUT wide=1), or a table op's input, its high byte indexing 257 knots and its low
byte interpolating between two (LUT in_wide=1, `numerics.interpolate`), or both. Bit-exact
against the integer reference on every preset, batched; each int16 tensor's own error over 30
dB below int8's and the model's output closer to fp32; the LUT's vector time two, three or four
times an int8 LUT's, as its cycle formula says; what has no int16 form refused in one line."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from onnx import helper

from compiler.graph.evaluate import evaluate
from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.errors import QuantizeError, QuantizeWarning
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from simulator import isa, numerics
from simulator.arch import Arch
from tests.e2e.flow import (assert_busy_is_own_cycles, check_bit_exact, output_sqnr_db,
                            value_sqnr_db)
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

PRESETS = ("default", "edge", "large")
# The table op's input int16 and its output int8, its output int16 from int8, and both.
CASES = {"int16->int8": ("pre",), "int8->int16": ("act",), "int16->int16": ("pre", "act")}
# (LUT in_wide, wide) of each case.
FLAGS = {"int16->int8": (1, 0), "int8->int16": (0, 1), "int16->int16": (1, 1)}
OPSETS = {"Mish": 18, "Gelu": 20}


def _table_op(op: str, x: str, y: str) -> list:
    """The nodes computing y = OP(x): SiLU as exporters write it, x * Sigmoid(x) (fused into
    Swish), a PRelu of one slope, else the ONNX op itself."""
    if op == "SiLU":
        return [helper.make_node("Sigmoid", [x], ["gate"], name="gate"),
                helper.make_node("Mul", [x, "gate"], [y], name="act")]
    if op == "PRelu":
        return [helper.make_node("PRelu", [x, "slope"], [y], name="act")]
    return [helper.make_node(op, [x], [y], name="act")]


def conv_table_conv(op: str):
    """x -> Conv 3x3 (20 channels) -> pre -> OP -> act -> Conv 3x3 (12 channels) -> y, 9x9
    pixels: a batch's bytes end in a partial row on every preset."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["pre"], name="c1", pads=[1, 1, 1, 1]),
             *_table_op(op, "pre", "act"),
             helper.make_node("Conv", ["act", "w2", "b2"], ["y"], name="c2", pads=[1, 1, 1, 1])]
    inits = {"w1": rng.normal(0, .5, (20, 3, 3, 3)), "b1": rng.normal(0, .2, 20),
             "w2": rng.normal(0, .1, (12, 20, 3, 3)), "b2": rng.normal(0, .1, 12),
             "slope": np.array(0.25)}
    return model(nodes, {"x": [2, 3, 9, 9]}, {"y": [2, 12, 9, 9]},
                 {k: v.astype(np.float32) for k, v in inits.items()
                  if op == "PRelu" or k != "slope"}, opset=OPSETS.get(op, 17))


def shared_reader():
    """x -> Conv -> mid; mid -> HardSwish -> Conv -> y1 and mid -> Conv -> y2: 'mid' read by a
    table op and by the array at once."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["mid"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["mid"], ["act"], name="act"),
             helper.make_node("Conv", ["act", "w2"], ["y1"], name="c2"),
             helper.make_node("Conv", ["mid", "w3"], ["y2"], name="c3", pads=[1, 1, 1, 1])]
    inits = {"w1": rng.normal(0, .5, (16, 3, 3, 3)), "b1": rng.normal(0, .2, 16),
             "w2": rng.normal(0, .2, (8, 16, 1, 1)), "w3": rng.normal(0, .1, (6, 16, 3, 3))}
    return model(nodes, {"x": [2, 3, 7, 7]}, {"y1": [2, 8, 7, 7], "y2": [2, 6, 7, 7]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def learnable_affine():
    """PP-OCRv4's backbone (PPLCNetV3) as exported: every Conv and HardSwish followed by a
    scalar affine map, x -> Conv -> Mul k1 -> Add b1 -> HardSwish -> Mul k2 -> Add b2 -> Conv,
    the constants first in the Muls; then a Sub from a scalar and a Relu fused into it, and a
    Clip. Each Mul, Add and Sub by a scalar is a LUT of its own (a table when int16), but an
    Add from int16 codes to int16 codes, the ADD of its constant (`numerics.wide_add`)."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             n("Mul", ["k1", "c1"], ["m1"], name="mul1"),
             n("Add", ["m1", "o1"], ["a1"], name="add1"),
             n("HardSwish", ["a1"], ["h"], name="hswish"),
             n("Mul", ["k2", "h"], ["m2"], name="mul2"),
             n("Add", ["m2", "o2"], ["a2"], name="add2"),
             n("Conv", ["a2", "w2", "b2"], ["c2"], name="conv2"),
             n("Sub", ["o3", "c2"], ["s"], name="sub"),
             n("Relu", ["s"], ["r"], name="relu"),
             n("Clip", ["r", "lo", "hi"], ["q"], name="clip"),
             n("Conv", ["q", "w3"], ["y"], name="conv3")]
    inits = {"w1": rng.normal(0, .5, (16, 3, 3, 3)), "b1": rng.normal(0, .2, 16),
             "k1": np.array(1.3), "o1": np.array(0.4), "k2": np.array(0.8),
             "o2": np.array(-0.1), "w2": rng.normal(0, .2, (12, 16, 1, 1)),
             "b2": rng.normal(0, .2, 12), "o3": np.array(0.3), "lo": np.array(0.0),
             "hi": np.array(1.5), "w3": rng.normal(0, .2, (8, 12, 1, 1))}
    return model(nodes, {"x": [2, 3, 7, 9]}, {"y": [2, 8, 7, 9]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def split_parts():
    """x -> Conv -> Split into a and b; HardSwish(a) -> Conv -> y1 and Sigmoid(b) -> y2: the
    table ops read parts of one buffer, and y2 is a model output."""
    rng = np.random.default_rng(4)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["c"], name="c1", pads=[1, 1, 1, 1]),
             n("Split", ["c", "split"], ["a", "b"], name="split", axis=1),
             n("HardSwish", ["a"], ["act"], name="act"),
             n("Conv", ["act", "w2"], ["y1"], name="c2"),
             n("Sigmoid", ["b"], ["y2"], name="sig")]
    inits = {"w1": rng.normal(0, .5, (20, 3, 3, 3)).astype(np.float32),
             "w2": rng.normal(0, .2, (6, 12, 1, 1)).astype(np.float32),
             "split": np.array([12, 8], np.int64)}
    return model(nodes, {"x": [2, 3, 6, 6]}, {"y1": [2, 6, 6, 6], "y2": [2, 8, 6, 6]}, inits,
                 opset=14)


def samples(proto, count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


@functools.lru_cache(maxsize=None)
def _model(op: str):
    proto = {"shared": shared_reader, "affine": learnable_affine,
             "split": split_parts}.get(op, lambda: conv_table_conv(op))()
    return proto, profile_of(proto, samples(proto, 8, 0), optimized_graph(proto))


def build(op: str, names: tuple[str, ...], preset: str = "default"):
    proto, profile = _model(op)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizeWarning)
        return compile_model(proto, profile,
                             CompileOptions(quant=QuantOptions(int16_tensors=names)), preset)


def _luts(program, node: str = "act") -> list:
    return [i for i, source in zip(program.instructions, program.source)
            if i.op is isa.LUT and source == node]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("op", ["HardSwish", "HardSigmoid", "Sigmoid", "SiLU"])
def test_a_table_op_with_int16_codes_runs_bit_exactly(op: str, case: str, preset: str) -> None:
    """Three samples in one batch, then the last alone (`check_bit_exact`); every LUT of the
    table op has the case's flags."""
    built = build(op, CASES[case], preset)
    for name in CASES[case]:
        assert built.qgraph.values[name].type.dtype == "int16"
    luts = _luts(built.compiled.program)
    assert luts and all((i.args["in_wide"], i.args["wide"]) == FLAGS[case] for i in luts)
    check_bit_exact(built.qgraph, built.compiled, samples(_model(op)[0], 3, 1))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("op", ["Tanh", "LeakyRelu", "PRelu", "Mish", "Gelu"])
def test_other_table_ops_take_the_same_path(op: str, case: str) -> None:
    """Every table op of the operator table (Quant.LOOKUP, and PRelu with one slope) builds
    its int16 table from its own fp32 reference: the same LUT, bit-exact."""
    built = build(op, CASES[case])
    assert all((i.args["in_wide"], i.args["wide"]) == FLAGS[case]
               for i in _luts(built.compiled.program))
    check_bit_exact(built.qgraph, built.compiled, samples(_model(op)[0], 2, 1))


@pytest.mark.parametrize("preset", PRESETS)
def test_a_tensor_read_by_a_table_op_and_the_array_at_once(preset: str) -> None:
    """'mid' is read by HardSwish (interpolated) and by a Conv (two passes through the
    array); with HardSwish's output int16 too, read by the other Conv."""
    for names in (("mid",), ("mid", "act")):
        built = build("shared", names, preset)
        assert all(i.args["in_wide"] for i in _luts(built.compiled.program))
        computes = [i for i, source in zip(built.compiled.program.instructions,
                                           built.compiled.program.source)
                    if i.op is isa.COMPUTE and source == "c3"]
        assert any(i.args["shift"] == numerics.WIDE_HIGH_SHIFT for i in computes)
        check_bit_exact(built.qgraph, built.compiled, samples(_model("shared")[0], 3, 1))


@pytest.mark.parametrize("preset", PRESETS)
def test_a_part_of_a_buffer_is_copied_out_and_an_int16_output_bound(preset: str) -> None:
    """HardSwish of an int8 Split part writing int16: the part is copied into a tensor of its
    own first (an int8 LUT), then the wide LUT runs over flat bytes; Sigmoid's int16 output is
    a model output, which the host reads from both planes."""
    built = build("split", ("act", "y2"), preset)
    assert [b.dtype for b in built.compiled.program.outputs if b.name == "y2"] == ["int16"]
    check_bit_exact(built.qgraph, built.compiled, samples(_model("split")[0], 3, 1))


AFFINE = ("c1", "m1", "a1", "h", "m2", "a2", "c2", "r", "q")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("names", [AFFINE, ("a1",), ("h",), ("m1", "m2"), ("r",), ("q",)])
def test_scalar_maps_and_clamps_are_tables_of_int16_codes(names, preset: str) -> None:
    """An Add, Mul or Sub by a scalar (a ReLU fused into it) and a Clip run as a LUT of one
    activation: with int16 codes in or out, a table of the op's own fp32 form (`table_of`),
    bit-exact, the whole chain between the Convs int16 or any tensor of it alone. An Add
    with int16 codes in and out (add1 and add2 of the whole chain) is an ADD of its constant
    instead."""
    built = build("affine", names, preset)
    for name in names:
        assert built.qgraph.values[name].type.dtype == "int16"
    tabled = {node.name for node in built.qgraph.nodes if "table_of" in node.attrs}
    assert tabled and tabled <= {"mul1", "add1", "mul2", "add2", "sub", "clip"}
    if names == AFFINE:
        assert not tabled & {"add1", "add2"}
    check_bit_exact(built.qgraph, built.compiled, samples(_model("affine")[0], 3, 1))


def test_the_chain_in_int16_brings_the_output_closer_to_fp32() -> None:
    proto = _model("affine")[0]
    wide, narrow = build("affine", AFFINE).qgraph, build("affine", ()).qgraph
    graph, feeds = optimized_graph(proto), samples(proto, 4, 9)
    assert output_sqnr_db(graph, wide, feeds, "y") > output_sqnr_db(graph, narrow, feeds, "y") + 3


def _sqnr_db(op: str, qgraph, name: str, stored: bool) -> float:
    """`value_sqnr_db` of op's model over the calibration samples (stored) or other samples."""
    proto = _model(op)[0]
    return value_sqnr_db(optimized_graph(proto), qgraph, name,
                         samples(proto, 8, 0) if stored else samples(proto, 4, 9), stored)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("op", ["HardSwish", "Sigmoid", "SiLU"])
def test_int16_codes_are_far_closer_to_fp32_and_so_is_the_output(op: str, case: str) -> None:
    """Each int16 tensor's own error is over 30 dB below its int8 one's; the integer
    reference's table output improves (the int8 input and weights before it still err), and so
    does the model's output."""
    wide, narrow = build(op, CASES[case]).qgraph, build(op, ()).qgraph
    for name in CASES[case]:
        assert _sqnr_db(op, wide, name, True) >= _sqnr_db(op, narrow, name, True) + 30
    assert _sqnr_db(op, wide, "act", False) > _sqnr_db(op, narrow, "act", False)
    proto = _model(op)[0]
    graph, feeds = optimized_graph(proto), samples(proto, 4, 9)
    assert output_sqnr_db(graph, wide, feeds, "y") > output_sqnr_db(graph, narrow, feeds, "y")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("case, passes", [("int8->int16", 2), ("int16->int8", 3),
                                          ("int16->int16", 4)])
def test_the_lut_takes_its_passes_as_the_cycle_formula_says(case, passes, preset) -> None:
    """An int16 output's second plane, an int16 input's low plane and its second knot each
    take one more pass: the LUTs' cycles are 2, 3 or 4 times the int8 program's (the same
    rows), and the simulator's busy time on the vector unit is the instructions' own."""
    wide, narrow = build("HardSwish", CASES[case], preset), build("HardSwish", (), preset)
    arch = Arch.load(preset)

    def cycles(program) -> int:
        return sum(isa.LUT.cycles(arch, i) for i in _luts(program))
    assert sum(i.args["rows"] for i in _luts(wide.compiled.program)) == \
        sum(i.args["rows"] for i in _luts(narrow.compiled.program))
    assert cycles(wide.compiled.program) == passes * cycles(narrow.compiled.program)
    assert_busy_is_own_cycles(wide.compiled.program, "act", "vector", "vector")


@pytest.mark.parametrize("name, nodes, inits, why", [
    ("act", [helper.make_node("Conv", ["x", "w"], ["pre"], name="c"),
             helper.make_node("Sigmoid", ["pre"], ["act"], name="s"),
             helper.make_node("Softmax", ["act"], ["y"], name="soft", axis=1)],
     {"w": (3, 3, 1, 1)}, "read by Softmax 'soft'"),
    ("act", [helper.make_node("Conv", ["x", "w"], ["pre"], name="c"),
             helper.make_node("Sigmoid", ["pre"], ["act"], name="s"),
             helper.make_node("ReduceMean", ["act"], ["g"], name="mean", axes=[2, 3]),
             helper.make_node("Mul", ["pre", "g"], ["y"], name="scale")],
     {"w": (3, 3, 1, 1)}, "read by ReduceMean 'mean'"),
    ("act", [helper.make_node("Conv", ["x", "w"], ["pre"], name="c"),
             helper.make_node("HardSigmoid", ["pre"], ["act"], name="gate"),
             helper.make_node("Div", ["pre", "act"], ["y"], name="se")],
     {"w": (3, 3, 1, 1)}, "read by Div 'se'"),
])
def test_what_has_no_int16_table_form_is_refused_in_one_line(name, nodes, inits, why) -> None:
    """The vector unit's operators but the table ops, the Add,
    the Mul of two activations, the pools and the copies neither read nor write int16 codes (a
    Softmax, a ReduceMean, a Div of two activations): a one-line error names the tensor and
    the node."""
    rng = np.random.default_rng(3)
    arrays = {k: (rng.normal(0, .3, v) if isinstance(v, tuple) else np.asarray(v))
              .astype(np.float32) for k, v in inits.items()}
    proto = model(nodes, {"x": [1, 3, 5, 5]}, {"y": [1, 3, 5, 5]}, arrays)
    profile = profile_of(proto, samples(proto, 4, 0), optimized_graph(proto))
    with pytest.raises(QuantizeError) as caught:
        compile_model(proto, profile, CompileOptions(quant=QuantOptions(int16_tensors=(name,))))
    message = str(caught.value)
    assert f"int16 tensor {name!r}: {why}" in message and "\n" not in message


@pytest.mark.parametrize("int16", [("pre",), ("y",), ("pre", "y")])
def test_a_table_per_channel_reads_and_writes_int16_on_a_map(int16) -> None:
    """PRelu with a slope per channel, int16 codes in or out: a table of int16 entries per
    lane (LUT per_lane=1 with in_wide or wide), bit-exact."""
    rng = np.random.default_rng(3)
    proto = model([helper.make_node("Conv", ["x", "w"], ["pre"], name="c"),
                   helper.make_node("PRelu", ["pre", "slope"], ["y"], name="p")],
                  {"x": [1, 3, 5, 5]}, {"y": [1, 3, 5, 5]},
                  {"w": rng.normal(0, .3, (3, 3, 1, 1)).astype(np.float32),
                   "slope": np.array([0.1, 0.5, 2.0], np.float32).reshape(3, 1, 1)})
    profile = profile_of(proto, samples(proto, 4, 0), optimized_graph(proto))
    built = compile_model(proto, profile,
                          CompileOptions(quant=QuantOptions(int16_tensors=int16)))
    luts = _luts(built.compiled.program, "p")
    assert luts and all(i.args["per_lane"] for i in luts)
    assert all(i.args["in_wide"] == ("pre" in int16) and i.args["wide"] == ("y" in int16)
               for i in luts)
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 1))


def test_a_table_per_channel_of_a_value_that_is_not_a_map_stays_int8() -> None:
    """A PRelu's tables per channel of a [N, C, L] value: its channels are not the lanes, so
    no table per lane reads it; one line names the tensor and the node."""
    rng = np.random.default_rng(3)
    proto = model([helper.make_node("PRelu", ["x", "slope"], ["y"], name="p")],
                  {"x": [1, 3, 8]}, {"y": [1, 3, 8]},
                  {"slope": rng.normal(0, .3, (3, 1)).astype(np.float32)})
    profile = profile_of(proto, samples(proto, 4, 0), optimized_graph(proto))
    with pytest.raises(QuantizeError) as caught:
        compile_model(proto, profile, CompileOptions(quant=QuantOptions(int16_tensors=("y",))))
    assert "int16 tensor 'y': made by PRelu 'p' with a table per channel of a value that is " \
        "not a map [N, C, H, W]" in str(caught.value)


def test_the_command_line_raises_a_table_tensor_end_to_end(tmp_path) -> None:
    """`ember compile --int16 pre,act` on Conv -> HardSwish -> Conv: the header records the
    names, and `ember accuracy` finds the program bit-exact against the integer reference."""
    import json

    import onnx

    from simulator.program import Program
    from tests.cli import invoke
    proto = conv_table_conv("HardSwish")
    onnx.save(proto, tmp_path / "m.onnx")
    np.savez(tmp_path / "data.npz", x=np.concatenate([s["x"] for s in samples(proto, 4, 0)]))
    profile = tmp_path / "m.profile.json"
    assert invoke("quantize-profile", tmp_path / "m.onnx", "--data", tmp_path / "data.npz",
                  "-o", profile).exit_code == 0
    result = invoke("compile", tmp_path / "m.onnx", "--int8", "--profile", profile,
                    "--int16", "pre,act", "-o", tmp_path / "m.ember")
    assert result.exit_code == 0, result.output
    program = Program.load(tmp_path / "m.ember")
    assert program.metadata["options"]["int16_tensors"] == ["pre", "act"]
    assert any(i.op is isa.LUT and i.args["in_wide"] and i.args["wide"]
               for i in program.instructions)
    result = invoke("accuracy", tmp_path / "m.onnx", tmp_path / "m.ember", "--profile",
                    profile, "--data", tmp_path / "data.npz", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["bit_exact"] is True, report["first_difference"]


def _export_and_reference_sqnr_db(op: str, names: tuple[str, ...]) -> list[tuple[float, float]]:
    """Per sample, the output SQNR against fp32 of onnxruntime running the QDQ export and of
    the integer reference."""
    import onnxruntime as ort

    from quantizer.qdq import export_qdq
    proto = _model(op)[0]
    qgraph = build(op, names).qgraph
    session = ort.InferenceSession(export_qdq(qgraph).SerializeToString())
    graph = optimized_graph(proto)
    found = []
    for sample in samples(proto, 2, 5):
        want = evaluate(graph, sample)["y"].astype(np.float64)
        found.append(tuple(10 * np.log10((want ** 2).sum() / ((want - got) ** 2).sum())
                           for got in (session.run(None, sample)[0],
                                       run_int8(qgraph, sample)["y"])))
    return found


def test_the_qdq_export_of_int16_tables_runs_in_onnxruntime() -> None:
    """The table forms export as their fp32 operators between int16 QuantizeLinear and
    DequantizeLinear nodes (a fused Relu as its clamp): onnxruntime's output is as close to
    fp32 as the integer reference's, within 0.5 dB."""
    for qdq, reference in _export_and_reference_sqnr_db("affine", AFFINE):
        assert reference > 33 and abs(qdq - reference) < 0.5


@pytest.mark.parametrize("case", CASES)
def test_an_int16_swish_exports_as_x_times_its_sigmoid(case: str) -> None:
    """SiLU (Swish once fused) with int16 codes in or out: its integer attributes (out_dtype,
    the knots' window) stay out of the fp32 form, and onnxruntime runs the export, as close to
    fp32 as the integer reference within 0.5 dB."""
    for qdq, reference in _export_and_reference_sqnr_db("SiLU", CASES[case]):
        assert abs(qdq - reference) < 0.5, (qdq, reference)


def _gate(bias: float):
    """x -> Conv 1x1 (bias `bias`) -> pre -> Sigmoid -> act -> Conv 1x1 -> y: with a bias far
    below 0, calibration on small inputs sees the gate's scores only near 0."""
    rng = np.random.default_rng(5)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["pre"], name="c1"),
             n("Sigmoid", ["pre"], ["act"], name="act"),
             n("Conv", ["act", "w2"], ["y"], name="c2")]
    inits = {"w1": rng.normal(0, .5, (8, 4, 1, 1)), "b1": np.full(8, bias),
             "w2": rng.normal(0, .5, (3, 8, 1, 1))}
    return model(nodes, {"x": [1, 4, 5, 5]}, {"y": [1, 3, 5, 5]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def _gate_samples(count: int, seed: int, spread: float) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": (spread * rng.standard_normal((1, 4, 5, 5))).astype(np.float32)}
            for _ in range(count)]


def test_an_int16_saturating_output_spans_its_bounds_beyond_the_calibration(monkeypatch) -> None:
    """PicoDet's class scores (Sigmoid outputs) calibrated on 8 images reached 0.23, and one
    evaluation image's 0.78 was read as 0.23. An int16 output of a function that saturates
    spans its bounds ([0, 1] here) when they lie within MAX_BOUND_WIDENING of the calibrated
    range: the scores the calibration never saw are kept, at a step still far below int8's;
    a bound far beyond the calibrated range is left to it. Bit-exact either way."""
    from quantizer import quantize as quantize_module
    from quantizer.wide import MAX_BOUND_WIDENING
    evaluation = _gate_samples(4, 2, spread=4.0)

    def quantized(bias: float, bounds: bool = True):
        proto = _gate(bias)
        graph = optimized_graph(proto)
        profile = profile_of(proto, _gate_samples(8, 1, spread=0.5), graph)
        if not bounds:
            monkeypatch.setattr(quantize_module, "within_bounds", lambda g, n, lo, hi: (lo, hi))
        built = compile_model(proto, profile, CompileOptions(
            quant=QuantOptions(int16_tensors=("act",))), "default")
        monkeypatch.undo()
        return proto, graph, built

    def top(built) -> float:
        params = built.qgraph.values["act"].type.quant
        return float(params.scale[0]) * 32767

    proto, graph, built = quantized(-4.0)
    calibrated = top(quantized(-4.0, bounds=False)[2])
    assert calibrated < 0.3 and top(built) == pytest.approx(1.0, rel=1e-3)
    seen = max(float(evaluate(graph, s, keep_all=True)["act"].max()) for s in evaluation)
    assert seen > 2 * calibrated  # the evaluation leaves the calibrated range
    assert value_sqnr_db(graph, built.qgraph, "act", evaluation) > \
        value_sqnr_db(graph, quantized(-4.0, bounds=False)[2].qgraph, "act", evaluation) + 20
    check_bit_exact(built.qgraph, built.compiled, evaluation[:2])
    _, _, far = quantized(-9.0)  # scores near 1e-3: [0, 1] is past MAX_BOUND_WIDENING
    assert top(far) * MAX_BOUND_WIDENING < 1.0
