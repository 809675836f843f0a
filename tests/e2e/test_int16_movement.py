"""int16 activations through data movement and pools: a value named in
`QuantOptions.int16_tensors` takes with it every value holding the same codes through views
(Reshape, Flatten, Split, Slice), Transposes, Concats, MaxPools and nearest Resizes
(`quantizer.wide.wide_group`: int16 together, in one scale), and AveragePool,
GlobalAveragePool and ConvTranspose read and write int16 as the array's and vector unit's
requantizing ops do. Bit-exact against the integer reference on every preset, batched; far
closer to fp32 than int8; copies cost two planes' copies, a pool two planes' windows and its
output's second plane, a ConvTranspose's phases two passes each; what cannot take int16 is
refused in one line naming the tensor and the node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.backend.program import BackendOptions
from ember.flow import CompileOptions, compile_model, optimized_graph, quantize_model
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from tests.e2e import int16_movement_models as models
from tests.e2e.flow import check_bit_exact, compute_cycles, model_samples, value_sqnr_db
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

PRESETS = ("default", "edge", "large")


def _wide(program, mnemonic: str, flag: str) -> bool:
    return any(i.op.mnemonic == mnemonic and i.args.get(flag) for i in program.instructions)


# case -> (model, names, the values int16 in the quantized graph, a check of the program)
CASES = {
    "max_pool": (models.max_pool, ("m",), {"mid", "m"},
                 lambda p: _wide(p, "MAXPOOL", "wide")),
    "average_pool_in": (models.average_pool, ("mid",), {"mid"},
                        lambda p: _wide(p, "AVGPOOL", "in_wide")
                        and not _wide(p, "AVGPOOL", "wide")),
    "average_pool_in_out": (models.average_pool, ("mid", "m"), {"mid", "m"},
                            lambda p: _wide(p, "AVGPOOL", "wide")),
    "global_average_pool": (models.global_average_pool, ("mid",), {"mid"},
                            lambda p: _wide(p, "AVGPOOL", "in_wide")),
    "global_max_pool": (models.global_max_pool, ("m",), {"mid", "m"},
                        lambda p: _wide(p, "MAXPOOL", "wide")),
    "concat": (models.concat, ("m",), {"a", "b", "m"}, lambda p: True),
    "resize_nearest": (models.resize_nearest, ("mid",), {"mid", "m"}, lambda p: True),
    "conv_transpose": (models.conv_transpose, ("mid", "up"), {"mid", "up"},
                       lambda p: _wide(p, "REQUANT", "wide")),
    "upsample_concat": (models.upsample_concat, ("u",), {"mid", "u", "t", "m"}, lambda p: True),
    "views": (models.views, ("y1", "g"),
              {"head", "s0", "s1", "r1", "y1/q", "g", "r0", "y0/q"}, lambda p: True),
    "slices": (models.slices, ("m",), {"mid", "s0", "s1", "t", "u", "m"}, lambda p: True),
    "flatten_gemm": (models.flatten_gemm, ("m",), {"mid", "p", "m"},
                     lambda p: _wide(p, "MAXPOOL", "wide")),
    "concat_with_mul": (models.concat_with_mul, ("m",), {"a", "g", "m"},
                        lambda p: _wide(p, "MUL", "wide")),
}


def build(proto, names=(), preset: str = "default", keep=()):
    profile = profile_of(proto, model_samples(proto, 8, 0), optimized_graph(proto))
    options = QuantOptions(int16_tensors=tuple(names), keep_fp32=tuple(keep))
    return compile_model(proto, profile, CompileOptions(quant=options), preset)


def wide_values(qgraph) -> set[str]:
    return {name for name, v in qgraph.values.items()
            if not v.is_const and v.type.dtype == "int16"}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("case", CASES)
def test_int16_flows_through_and_runs_bit_exactly(case: str, preset: str) -> None:
    """Three samples in one batch, then the last alone (`check_bit_exact`)."""
    make, names, want, check = CASES[case]
    proto = make()
    built = build(proto, names, preset)
    assert wide_values(built.qgraph) == want
    assert check(built.compiled.program)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))


@pytest.mark.parametrize("case, named, other", [
    ("max_pool", "m", "mid"), ("upsample_concat", "m", "u"), ("views", "y1", "head"),
    ("slices", "t", "mid")])
def test_naming_a_views_output_or_its_input_gives_the_same_int16_values(case, named, other):
    """The group is the same from any of its values: producers and readers stay consistent."""
    make = CASES[case][0]
    proto = make()
    profile = profile_of(proto, model_samples(proto, 8, 0), optimized_graph(proto))
    found = [wide_values(quantize_model(proto, profile,
                                        QuantOptions(int16_tensors=(name,))).qgraph)
             for name in (named, other)]
    assert found[0] == found[1] and named in found[0] | {n.removesuffix("/q") for n in found[0]}


@pytest.mark.parametrize("case, parts", [("concat", ("a", "b", "m")),
                                         ("upsample_concat", ("mid", "u", "t", "m")),
                                         ("slices", ("t", "u", "m"))])
def test_a_group_shares_one_scale_and_no_value_is_rescaled(case, parts) -> None:
    """As the int8 path unifies a Concat's inputs by Rescales to the output's parameters, the
    int16 group has one: each producer requantizes into it, so no Rescale is needed."""
    make, names, _, _ = CASES[case]
    qgraph = build(make(), names).qgraph
    params = {qgraph.values[name].type.quant for name in parts}
    assert len(params) == 1
    assert not any(node.op == "Rescale" for node in qgraph.nodes)


# The value measured: the group's value after the movement (its codes are the group's).
MEASURED = {"max_pool": "m", "global_max_pool": "m", "average_pool_in_out": "m", "global_average_pool": "mid",
            "concat": "m", "resize_nearest": "m", "conv_transpose": "up",
            "upsample_concat": "m", "views": "y1", "slices": "m", "flatten_gemm": "m"}


@pytest.mark.parametrize("case", MEASURED)
def test_the_int16_value_is_far_closer_to_fp32_than_int8(case: str) -> None:
    """Its own error (16-bit codes against 8-bit ones of the same range) is over 30 dB smaller;
    what the integer reference computes for it is closer to fp32 too, by less (the error of its
    producer's int8 input and weights stays)."""
    make, names, _, _ = CASES[case]
    proto = make()
    name = MEASURED[case]
    wide, narrow = build(proto, names).qgraph, build(proto).qgraph
    coded = f"{name}/q" if name in (o.name for o in proto.graph.output) else None
    graph = optimized_graph(proto)

    def sqnr(qgraph, stored: bool, seed: int) -> float:
        return value_sqnr_db(graph, qgraph, name, model_samples(proto, 4, seed), stored, coded)

    assert sqnr(wide, True, 0) >= sqnr(narrow, True, 0) + 30
    assert sqnr(wide, False, 9) > sqnr(narrow, False, 9)


def _cycles(program, node: str, mnemonic: str) -> int:
    arch = program.arch
    return sum(i.op.cycles(arch, i) for i, source in zip(program.instructions, program.source)
               if source == node and i.op.mnemonic == mnemonic)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("case, node", [("resize_nearest", "up"), ("slices", "cat")])
def test_a_copy_of_int16_costs_two_planes_copies(case, node, preset) -> None:
    """A nearest Resize and a Concat of views copy by identity tables: over int16 each plane is
    copied, exactly twice the int8 program's vector cycles and twice its DMA bytes."""
    make, names, _, _ = CASES[case]
    proto = make()
    wide = build(proto, names, preset).compiled.program
    narrow = build(proto, (), preset).compiled.program
    assert _cycles(wide, node, "LUT") == 2 * _cycles(narrow, node, "LUT") > 0
    for mnemonic in ("LOAD", "STORE"):
        moved = [sum(i.args["y_size"] * i.args["x_size"] * i.args["elem_bytes"]
                     for i, source in zip(p.instructions, p.source)
                     if source == node and i.op.mnemonic == mnemonic) for p in (wide, narrow)]
        assert moved[0] == 2 * moved[1] > 0


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("case, mnemonic", [("max_pool", "MAXPOOL"),
                                            ("average_pool_in_out", "AVGPOOL"),
                                            ("average_pool_in", "AVGPOOL")])
def test_an_int16_pool_costs_two_planes_windows_and_its_second_output_plane(case, mnemonic,
                                                                            preset) -> None:
    """Each int16 pool instruction reads both planes' windows (twice the int8 one's time) and
    writes its result's second plane (one pass over the output pixels): what
    `vector.pool_cycles` says, with no 16-bit mode of the vector unit. The simulator charges
    the layer its instructions' cycles."""
    make, names, _, _ = CASES[case]
    proto = make()
    built = build(proto, names, preset)
    program = built.compiled.program
    arch = program.arch
    lanes, vector = arch.lanes, arch.vector.lanes
    pools = [i for i, source in zip(program.instructions, program.source)
             if source == "pool" and i.op.mnemonic == mnemonic]
    for insn in pools:
        a = insn.args
        narrow = dict(a, **{flag: 0 for flag in ("wide", "in_wide") if flag in a})
        out_h, out_w = (a["in_h"] - a["kh"]) // a["sh"] + 1, (a["in_w"] - a["kw"]) // a["sw"] + 1
        second = -(-out_h * out_w * lanes // vector) if a["wide"] else 0
        assert insn.op.cycles(arch, insn) == \
            2 * insn.op.cycles(arch, insn.op(**narrow)) + second
    result = check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 1, 2))
    layer = next(layer for layer in result.stats.layers if layer.name == "pool")
    own = sum(i.op.cycles(arch, i) for i, source in zip(program.instructions, program.source)
              if source == "pool" and i.queue == "vector")
    assert layer.busy["vector"] == own


@pytest.mark.parametrize("preset", PRESETS)
def test_a_conv_transpose_reading_int16_streams_two_planes_a_phase(preset) -> None:
    """Each of its four phases (2x2 stride 2) passes both planes through the array: twice the
    int8 program's COMPUTE cycles (the same tiles)."""
    proto = models.conv_transpose()
    wide = build(proto, ("mid", "up"), preset).compiled.program
    narrow = build(proto, (), preset).compiled.program
    assert compute_cycles(wide, "ct") == 2 * compute_cycles(narrow, "ct") > 0


def test_an_int16_concat_is_written_in_place_by_its_producers() -> None:
    """The Conv, the ConvTranspose and the Mul write their int16 outputs into their parts of the
    Concat's buffer, each plane by its View (copy elimination as for int8): the Concat itself
    is no instruction, as in the int8 program."""
    for case, node in (("concat", "cat"), ("upsample_concat", "cat"),
                       ("concat_with_mul", "cat")):
        make, names, _, _ = CASES[case]
        program = build(make(), names).compiled.program
        assert node not in program.source


def _refused(proto, names, keep=()) -> str:
    profile = profile_of(proto, model_samples(proto, 4, 0), optimized_graph(proto))
    with pytest.raises(QuantizeError) as caught:
        compile_model(proto, profile, CompileOptions(
            quant=QuantOptions(int16_tensors=tuple(names), keep_fp32=tuple(keep))))
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_concat_of_an_int16_value_with_one_no_op_writes_as_int16_is_refused() -> None:
    """Naming the Concat's output makes its inputs int16 too: a Div of two activations cannot
    write int16, and the error names it, and the tensor named."""
    message = _refused(models.concat_with_mul("Div"), ("m",))
    assert message.startswith("int16 tensor 'g' (with 'm', which it flows into or from "
                              "unchanged): made by Div 'gate'; only a Conv")


def test_a_linear_resize_of_int16_is_refused() -> None:
    message = _refused(models.resize_linear(), ("mid",))
    assert message.startswith("int16 tensor 'mid': read by Resize 'up' (a linear Resize: only "
                              "a nearest one copies int16)")


@pytest.mark.parametrize("names", [("mid",), ("m",), ("mid", "m")], ids="+".join)
def test_a_pool_kept_in_fp32_reads_and_writes_int16(names) -> None:
    """The pool kept in fp32 on the host: its int16 input read from both planes, its output
    quantized into both planes for the Conv after it (host segments' int16 bindings; a
    MaxPool's input and output are one group, int16 together, kept or not); bit-exact, two
    samples in a batch."""
    proto = models.max_pool()
    profile = profile_of(proto, model_samples(proto, 4, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(
        quant=QuantOptions(int16_tensors=names, keep_fp32=("pool",)),
        backend=BackendOptions(allow_host=True)))
    (segment,) = built.compiled.program.host_segments
    bound = segment["inputs"] + segment["outputs"]
    assert [(b["dtype"], b["plane"] > 0) for b in bound] == [("int16", True)] * 2
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 2, 1))


def test_a_concat_with_a_constant_is_refused() -> None:
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["mid"], name="c"),
             helper.make_node("Concat", ["mid", "k"], ["y"], name="cat", axis=1)]
    proto = model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 5, 4, 4]},
                  {"w": rng.normal(0, .3, (3, 3, 1, 1)).astype(np.float32),
                   "k": rng.normal(0, 1, (1, 2, 4, 4)).astype(np.float32)})
    message = _refused(proto, ("mid",))
    assert message.startswith("int16 tensor 'k' (with 'mid', which it flows into or from "
                              "unchanged): a constant")


def test_an_average_whose_window_may_sum_past_int32_is_refused() -> None:
    """A GlobalAveragePool over 257 x 256 int16 codes: its sums may leave int32."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["mid"], name="c"),
             helper.make_node("GlobalAveragePool", ["mid"], ["y"], name="gap")]
    proto = model(nodes, {"x": [1, 2, 257, 256]}, {"y": [1, 2, 1, 1]},
                  {"w": rng.normal(0, .3, (2, 2, 1, 1)).astype(np.float32)})
    message = _refused(proto, ("mid",))
    assert message.startswith("int16 tensor 'mid': read by GlobalAveragePool 'gap', whose "
                              "windows of 65792 codes may sum past int32")
