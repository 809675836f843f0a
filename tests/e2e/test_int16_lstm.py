"""int16 through an unrolled LSTM's steps: each step's Add of its slice of the sequence's input
projection and its recurrent MatMul (ADD reading a View of both planes), the gate Slices or
Split of that sum, the gates' Sigmoid and Tanh tables reading int16 parts where they are (LUT
in_wide through a View), the cell's products and its Add, a bias Add broadcast over the batch
rows (its constant int16 codes too), a per-sequence term broadcast over the rows (ADD b_once)
and a per-row one over the gates (ADD b_splat), a peephole's Mul by a constant vector and a
gate's clip; a GRU's Subs and its reset gate's product with a constant bias likewise.
Bit-exact against the integer reference on the default and edge presets, batched; the int16
tensors' own rounding error far below int8's and the output closer to fp32; the ADD's and
LUT's cycles one pass per plane; and what is still refused, in one line."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from ember.flow import CompileOptions, compile_model, optimized_graph, quantize_model
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from simulator import isa
from tests.e2e.flow import (assert_busy_is_own_cycles, check_bit_exact, model_samples,
                            output_sqnr_db, value_sqnr_db)
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

PRESETS = ("default", "edge")
T, B, F, H, CLASSES, K = 5, 2, 6, 12, 4, 3


def recurrent(op: str = "LSTM", direction: str = "forward", batch: int = B, **attrs):
    """x [T, B, F] -> LSTM or GRU (ONNX's operator, unrolled on import) -> Y [T, dirs, B, H]
    (an output) and Y_h -> MatMul -> logits [B, CLASSES]."""
    rng = np.random.default_rng(7)
    gates = 4 if op == "LSTM" else 3
    dirs = 2 if direction == "bidirectional" else 1
    inputs = ["x", "W", "R", "B"] + (["", "", "", "P"] if "P" in attrs else [])
    inits = {"W": rng.normal(0, .5, (dirs, gates * H, F)), "R": rng.normal(0, .4,
                                                                        (dirs, gates * H, H)),
             "B": rng.normal(0, .3, (dirs, 2 * gates * H)),
             "fc": rng.normal(0, .3, (dirs * H, CLASSES)),
             "flat": np.array([batch, dirs * H], np.int64)}
    if attrs.pop("P", None):
        inits["P"] = rng.normal(0, .5, (dirs, 3 * H))
    nodes = [helper.make_node(op, inputs, ["y", "y_h"], name="rnn", hidden_size=H,
                              direction=direction, **attrs),
             helper.make_node("Transpose", ["y_h"], ["y_bh"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["y_bh", "flat"], ["h"]),
             helper.make_node("MatMul", ["h", "fc"], ["logits"])]
    return model(nodes, {"x": [T, batch, F]},
                 {"logits": [batch, CLASSES], "y": [T, dirs, batch, H]},
                 {k: v if v.dtype == np.int64 else v.astype(np.float32)
                  for k, v in inits.items()})


def written_out(batch: int = B):
    """An LSTM cell written out step by step, as exporters that unroll it do: z = x_t W + h U
    (an Add of two MatMuls), + b (a bias Add broadcast over the rows, not foldable into a
    MatMul), + ctx V (a per-sequence term [1, 4H] broadcast over the rows), + x_t w (a
    per-row term [B, 1] broadcast over the gates); a Split into i, f, g, o; c = f c + i g,
    h = o tanh(c). Inputs x [T, B, F] and ctx [1, K]; the last h -> MatMul -> logits."""
    rng = np.random.default_rng(11)
    inits = {"W": rng.normal(0, .5, (F, 4 * H)), "U": rng.normal(0, .4, (H, 4 * H)),
             "b": rng.normal(0, .3, 4 * H), "V": rng.normal(0, .5, (K, 4 * H)),
             "w": rng.normal(0, .3, (F, 1)), "fc": rng.normal(0, .3, (H, CLASSES)),
             "rows": np.array([batch, F], np.int64), "split": np.array([H] * 4, np.int64)}
    nodes = [helper.make_node("MatMul", ["ctx", "V"], ["cv"], name="ctx_proj")]
    h = c = None
    for t in range(T):
        s = f"t{t}"
        nodes += [helper.make_node("Slice", ["x", f"{s}/start", f"{s}/end", "axis0"],
                                   [f"{s}/x3"], name=f"{s}/slice"),
                  helper.make_node("Reshape", [f"{s}/x3", "rows"], [f"{s}/x"], name=f"{s}/rows"),
                  helper.make_node("MatMul", [f"{s}/x", "W"], [f"{s}/xw"], name=f"{s}/xw")]
        inits.update({f"{s}/start": np.array([t], np.int64),
                      f"{s}/end": np.array([t + 1], np.int64)})
        z = f"{s}/xw"
        if h is not None:
            nodes += [helper.make_node("MatMul", [h, "U"], [f"{s}/hu"], name=f"{s}/hu"),
                      helper.make_node("Add", [z, f"{s}/hu"], [f"{s}/z"], name=f"{s}/z")]
            z = f"{s}/z"
        nodes += [helper.make_node("Add", [z, "b"], [f"{s}/zb"], name=f"{s}/bias"),
                  helper.make_node("Add", [f"{s}/zb", "cv"], [f"{s}/zc"], name=f"{s}/ctx"),
                  helper.make_node("MatMul", [f"{s}/x", "w"], [f"{s}/r"], name=f"{s}/row"),
                  helper.make_node("Add", [f"{s}/zc", f"{s}/r"], [f"{s}/pre"], name=f"{s}/pre"),
                  helper.make_node("Split", [f"{s}/pre", "split"],
                                   [f"{s}/{g}0" for g in "ifgo"], name=f"{s}/gates", axis=1),
                  helper.make_node("Sigmoid", [f"{s}/i0"], [f"{s}/i"], name=f"{s}/i"),
                  helper.make_node("Sigmoid", [f"{s}/f0"], [f"{s}/f"], name=f"{s}/f"),
                  helper.make_node("Tanh", [f"{s}/g0"], [f"{s}/g"], name=f"{s}/g"),
                  helper.make_node("Sigmoid", [f"{s}/o0"], [f"{s}/o"], name=f"{s}/o"),
                  helper.make_node("Mul", [f"{s}/i", f"{s}/g"], [f"{s}/ig"], name=f"{s}/ig")]
        if c is None:
            c = f"{s}/ig"
        else:
            nodes += [helper.make_node("Mul", [f"{s}/f", c], [f"{s}/fc"], name=f"{s}/fc"),
                      helper.make_node("Add", [f"{s}/fc", f"{s}/ig"], [f"{s}/c"],
                                       name=f"{s}/c")]
            c = f"{s}/c"
        nodes += [helper.make_node("Tanh", [c], [f"{s}/tc"], name=f"{s}/tc"),
                  helper.make_node("Mul", [f"{s}/o", f"{s}/tc"], [f"{s}/h"], name=f"{s}/h")]
        h = f"{s}/h"
    nodes.append(helper.make_node("MatMul", [h, "fc"], ["logits"], name="head"))
    inits["axis0"] = np.array([0], np.int64)
    return model(nodes, {"x": [T, batch, F], "ctx": [1, K]}, {"logits": [batch, CLASSES]},
                 {k: v if v.dtype == np.int64 else v.astype(np.float32)
                  for k, v in inits.items()})


MODELS = {
    "lstm": lambda: recurrent(),
    "lstm-bidirectional": lambda: recurrent(direction="bidirectional", batch=1),
    "lstm-peephole": lambda: recurrent(P=True),
    "lstm-clip": lambda: recurrent(clip=3.0),
    "gru": lambda: recurrent("GRU", linear_before_reset=1),
    "written-out": written_out,
}


def _profile(proto):
    return profile_of(proto, model_samples(proto, 32, 0), optimized_graph(proto))


def build(proto, names=(), preset: str = "default", profile=None):
    return compile_model(proto, profile or _profile(proto),
                         CompileOptions(quant=QuantOptions(int16_tensors=tuple(names))), preset)


def step_tensors(proto) -> list[str]:
    """Every float activation of the recurrence: the unrolled layer's values (named under its
    node, `rnn/...`), or the written-out cell's (named by step, `t0/...`), and the context's
    projection; not the model's input x."""
    graph = optimized_graph(proto)
    return [name for name, value in graph.values.items()
            if not value.is_const and value.type.dtype == "float32" and
            (name.startswith(("rnn/", "t")) or name == "cv")]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_step_tensor_may_be_int16_and_runs_bit_exactly(kind, preset) -> None:
    """All of the recurrence's activations int16 at once (their groups: the slices of the
    input projection, the gates' parts, the outputs' Concats): accepted, int16 in the integer
    graph, and the program equal to the integer reference bit for bit, three samples batched
    and the last alone, with no host segment."""
    proto = MODELS[kind]()
    names = step_tensors(proto)
    assert len(names) > 10 * T
    built = build(proto, names, preset)
    graph = built.qgraph
    wide = {graph.origin.get(name, name) for name, value in graph.values.items()
            if value.type.dtype == "int16"}
    assert set(names) <= wide
    assert not built.compiled.program.host_segments
    check_bit_exact(graph, built.compiled, model_samples(proto, 3, 1))


def _adds(program, node_part: str) -> list[isa.Insn]:
    return [i for i, source in zip(program.instructions, program.source)
            if i.op is isa.ADD and node_part in source]


@pytest.mark.parametrize("preset", PRESETS)
def test_the_step_adds_read_slices_and_broadcast_operands_in_int16(preset) -> None:
    """The unrolled LSTM's step Add reads a View of the input projection (its row of the whole
    sequence's) and the recurrent MatMul's sum, both int16; the written-out cell's bias is
    int16 codes (b_wide), its per-sequence term one row for all rows (b_once, b_wide) and its
    per-row term lane 0 for every gate (b_splat, b_wide)."""
    proto = recurrent()
    names = step_tensors(proto)
    program = build(proto, names, preset).compiled.program
    step = _adds(program, "/t2/pre")
    assert step and all((i.args["a_wide"], i.args["b_wide"], i.args["wide"]) == (1, 1, 1)
                        for i in step)
    proto = written_out()
    built = build(proto, step_tensors(proto), preset)
    program = built.compiled.program
    assert built.qgraph.values["b/q"].type.dtype == "int16"
    for part, flags in (("t2/bias", dict(b_wide=1, b_once=0, b_splat=0)),
                        ("t2/ctx", dict(b_wide=1, b_once=1, b_splat=0)),
                        ("t2/pre", dict(b_wide=1, b_once=0, b_splat=1))):
        adds = _adds(program, part)
        assert adds and all(i.args["a_wide"] == i.args["wide"] == 1 and
                            {k: i.args[k] for k in flags} == flags for i in adds), part


@pytest.mark.parametrize("kind", ["lstm", "written-out"])
def test_the_int16_steps_are_far_closer_to_fp32_than_int8(kind) -> None:
    """A step's pre-activations and cell state lose over 30 dB less to their own rounding in
    int16 than in int8; the integer reference's output, every step tensor int16, is closer to
    fp32 than the all-int8 one by over 3 dB. Both on profiled samples, which no range clips:
    the comparison is of precision (a held-out sample past a calibrated end clips alike in
    int8 and int16)."""
    proto = MODELS[kind]()
    graph = optimized_graph(proto)
    profile = _profile(proto)
    names = step_tensors(proto)
    wide = quantize_model(proto, profile, QuantOptions(int16_tensors=tuple(names))).qgraph
    narrow = quantize_model(proto, profile).qgraph
    calibration = model_samples(proto, 32, 0)[:6]
    for name in ("rnn/d0/t3/pre", "rnn/d0/t3/c") if kind == "lstm" else ("t3/pre", "t3/c"):
        assert value_sqnr_db(graph, wide, name, calibration) >= \
            value_sqnr_db(graph, narrow, name, calibration) + 30, name
    assert output_sqnr_db(graph, wide, calibration, "logits") > \
        output_sqnr_db(graph, narrow, calibration, "logits") + 3


@pytest.mark.parametrize("preset", PRESETS)
def test_an_int16_step_costs_a_pass_per_plane(preset) -> None:
    """ADD: one pass over the rows per plane, the int16 sum's and each int16 operand's
    (`vector.row_cycles`: three int16 planes besides the first, four times the int8 ADD), a
    b broadcast to every row (b_once) one more pass over its one row only; a
    gate's LUT from an int16 slice to int16: the lookup, the second output plane, the low
    plane read with the knots' weighing and the second knot (four times the int8 LUT,
    `vector.lut_cycles`). The simulator charges the step's Add exactly its instructions'
    cycles."""
    proto = recurrent()
    program = build(proto, step_tensors(proto), preset).compiled.program
    arch = program.arch
    for insn in _adds(program, "/t2/pre"):
        narrow = isa.ADD(**{**insn.args, "wide": 0, "a_wide": 0, "b_wide": 0})
        assert insn.op.cycles(arch, insn) == 4 * insn.op.cycles(arch, narrow) > 0
    gates = [i for i, source in zip(program.instructions, program.source)
             if i.op is isa.LUT and "/t2/i#" in source]
    assert gates and all(i.args["in_wide"] == i.args["wide"] == 1 for i in gates)
    for insn in gates:
        narrow = isa.LUT(**{**insn.args, "wide": 0, "in_wide": 0, "zoom": 0, "origin": 0})
        assert insn.op.cycles(arch, insn) == 4 * insn.op.cycles(arch, narrow) > 0
    step = next(source for i, source in zip(program.instructions, program.source)
                if i.op is isa.ADD and "/t2/pre" in source)
    assert_busy_is_own_cycles(program, step, "vector", "vector")
    proto = written_out()
    program = build(proto, step_tensors(proto), preset).compiled.program
    arch = program.arch
    for insn in _adds(program, "t2/ctx"):  # b's one row, broadcast: its planes joined once
        assert insn.args["b_once"] == 1
        narrow = isa.ADD(**{**insn.args, "wide": 0, "a_wide": 0, "b_wide": 0})
        one_row = isa.ADD(**{**narrow.args, "rows": 1})
        assert insn.op.cycles(arch, insn) == \
            3 * insn.op.cycles(arch, narrow) + insn.op.cycles(arch, one_row)


def _refused(proto, named: str, match: str) -> None:
    with pytest.raises(QuantizeError, match=match):
        quantize_model(proto, _profile(proto), QuantOptions(int16_tensors=(named,)))


def test_an_add_broadcast_along_one_axis_or_a_max_still_refuses_int16() -> None:
    """A term [T, 1, N] added over [T, B, N] broadcasts along one of the two pixel axes: no
    ADD form (a value per channel, pixel or image), in int8 as in int16. A Max of two
    activations (ADD op max) compares int8 codes only. Each refused in one line naming the
    tensor and the node."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.normal(0, .5, (F, H)).astype(np.float32),
             "w2": rng.normal(0, .5, (F, H)).astype(np.float32)}

    def two_terms(op: str, name: str):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["p"], name="proj"),
                 helper.make_node("ReduceMean", ["x"], ["xm"], name="mean", axes=[1]),
                 helper.make_node("MatMul", ["xm", "w2"], ["q"], name="proj_mean"),
                 helper.make_node(op, ["p", "q"], ["y"], name=name)]
        return model(nodes, {"x": [T, B, F]}, {"y": [T, B, H]}, inits, opset=17)

    proto = two_terms("Add", "centre")
    _refused(proto, "y", r"^int16 tensor 'y': made by Add 'centre'; only a Conv")
    _refused(proto, "p", r"^int16 tensor 'p': read by Add 'centre'; only Convs")
    _refused(two_terms("Max", "larger"), "p",
             r"^int16 tensor 'p': read by Max 'larger'; only Convs")


def test_an_lstm_with_peepholes_and_a_clip_runs_int16_through_its_clips() -> None:
    """With peepholes, each gate's Clip (the LSTM's `clip`) is fused into the peephole's Add;
    the Clip's output stands for both. Its bound calibrated the range, so its lower code is
    the symmetric range's end, -(2^15 - 1): clamped at the type's end instead, which a wide
    REQUANT bounds. Every step tensor but the fused Adds' int16, bit-exact."""
    proto = recurrent(P=True, clip=3.0)
    graph = optimized_graph(proto)
    users = graph.users()
    fused = {name for name in step_tensors(proto)
             if [node.op for node in users.get(name, [])] == ["Clip"]}
    names = [name for name in step_tensors(proto) if name not in fused]
    assert len(fused) > T and len(names) > 10 * T
    built = build(proto, names)
    qgraph = built.qgraph
    wide = {qgraph.origin.get(name, name) for name, value in qgraph.values.items()
            if value.type.dtype == "int16"}
    assert set(names) <= wide
    check_bit_exact(qgraph, built.compiled, model_samples(proto, 3, 1))
