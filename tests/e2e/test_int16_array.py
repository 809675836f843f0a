"""int16 activations read by the array (issue #16 part 5): a tensor named in
`QuantOptions.int16_tensors` is written by its Conv/Gemm producer as two byte planes (REQUANT
wide=1) and read by its Conv/Gemm readers as two passes into the same accumulator rows (COMPUTE
shift=8 for the high plane, x_offset=-128 for the low one). Bit-exact against the integer
reference on every preset, batched; far closer to fp32 than int8; its codes narrowed so that
no reader's int32 accumulator can overflow; the readers' array time twice the int8 one's,
exactly what the cost model says."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

from compiler.backend.lower import lower
from compiler.backend.tiling import conv_array_cycles, tile
from compiler.pipeline import INT8_PASSES, optimize
from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.errors import QuantizeError, QuantizeWarning
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from quantizer.wide import accumulator_bits
from simulator import isa, numerics
from simulator.arch import Arch
from tests.e2e.flow import (assert_busy_is_own_cycles, check_bit_exact, compute_cycles,
                            output_sqnr_db, value_sqnr_db)
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

PRESETS = ("default", "edge", "large")
WIDE = QuantOptions(int16_tensors=("mid",))


def conv_conv():
    """x -> Conv 3x3 (20 channels) -> mid -> Conv 3x3 (24 channels) -> y, padded."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["mid"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["mid", "w2", "b2"], ["y"], name="c2", pads=[1, 1, 1, 1])]
    inits = {"w1": rng.normal(0, .3, (20, 3, 3, 3)), "b1": rng.normal(0, .1, 20),
             "w2": rng.normal(0, .1, (24, 20, 3, 3)), "b2": rng.normal(0, .1, 24)}
    return model(nodes, {"x": [2, 3, 10, 10]}, {"y": [2, 24, 10, 10]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def gemm_gemm():
    """x -> Gemm (transB, 40 outputs) -> mid -> Gemm (30 outputs) -> y."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["mid"], name="g1", transB=1),
             helper.make_node("Gemm", ["mid", "w2", "b2"], ["y"], name="g2")]
    inits = {"w1": rng.normal(0, .3, (40, 24)), "b1": rng.normal(0, .1, 40),
             "w2": rng.normal(0, .1, (40, 30)), "b2": rng.normal(0, .1, 30)}
    return model(nodes, {"x": [5, 24]}, {"y": [5, 30]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def matmul_matmul():
    """x [2, 5, 24] -> MatMul (40 outputs) -> mid [2, 5, 40] -> MatMul (30 outputs) -> y."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["mid"], name="m1"),
             helper.make_node("MatMul", ["mid", "w2"], ["y"], name="m2")]
    return model(nodes, {"x": [2, 5, 24]}, {"y": [2, 5, 30]},
                 {"w1": rng.normal(0, .3, (24, 40)).astype(np.float32),
                  "w2": rng.normal(0, .1, (40, 30)).astype(np.float32)})


MODELS = {"conv": conv_conv, "gemm": gemm_gemm, "matmul": matmul_matmul}


def samples(proto, count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    value = proto.graph.input[0]
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    return [{value.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def build(proto, options: QuantOptions = WIDE, preset: str = "default"):
    profile = profile_of(proto, samples(proto, 8, 0), optimized_graph(proto))
    return compile_model(proto, profile, CompileOptions(quant=options), preset)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kind", MODELS)
def test_an_int16_tensor_read_by_the_array_runs_bit_exactly(kind: str, preset: str) -> None:
    """Three samples in one batch, then the last alone (`check_bit_exact`)."""
    built = build(MODELS[kind](), preset=preset)
    assert built.qgraph.values["mid"].type.dtype == "int16"
    program = built.compiled.program
    computes = [i for i in program.instructions if i.op is isa.COMPUTE]
    high = [i for i in computes if i.args["shift"] == numerics.WIDE_HIGH_SHIFT]
    low = [i for i in computes if i.args["x_offset"] == -numerics.WIDE_LOW_OFFSET]
    assert high and len(high) == len(low)
    assert any(i.op is isa.REQUANT and i.args["wide"] for i in program.instructions)
    check_bit_exact(built.qgraph, built.compiled, samples(MODELS[kind](), 3, 1))


def _sqnr_db(proto, qgraph, name: str, stored: bool) -> float:
    """`value_sqnr_db` over the calibration samples (stored) or other samples."""
    return value_sqnr_db(optimized_graph(proto), qgraph, name,
                         samples(proto, 8, 0) if stored else samples(proto, 4, 9), stored)


@pytest.mark.parametrize("kind", MODELS)
def test_the_int16_tensor_is_far_closer_to_fp32_than_int8(kind: str) -> None:
    """Its own error (its 16-bit codes against 8-bit ones) is over 30 dB smaller; what reaches
    it from before (the int8 input and weights of its producer) stays, so the integer
    reference's value improves less, but improves, and so does the model's output."""
    proto = MODELS[kind]()
    wide, narrow = build(proto).qgraph, build(proto, QuantOptions()).qgraph
    assert _sqnr_db(proto, wide, "mid", True) >= _sqnr_db(proto, narrow, "mid", True) + 30
    assert _sqnr_db(proto, wide, "mid", False) > _sqnr_db(proto, narrow, "mid", False) + 1
    graph, feeds = optimized_graph(proto), samples(proto, 4, 9)
    assert output_sqnr_db(graph, wide, feeds, "y") > output_sqnr_db(graph, narrow, feeds, "y")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kind, reader", [("conv", "c2"), ("gemm", "g2"), ("matmul", "m2")])
def test_the_reader_takes_twice_the_array_time_as_the_cost_model_says(kind, reader, preset):
    """Each tap streams two planes: the reader's COMPUTE cycles are twice the int8 program's
    (the same tiles here), and equal the tiler's cost model (`conv_array_cycles`); the
    simulator's busy time on the array is the instructions' own cycles."""
    proto = MODELS[kind]()
    wide, narrow = build(proto, preset=preset), build(proto, QuantOptions(), preset)
    arch = Arch.load(preset)
    cycles = compute_cycles(wide.compiled.program, reader)
    assert cycles == 2 * compute_cycles(narrow.compiled.program, reader)
    lowered = lower(optimize(wide.qgraph, INT8_PASSES))
    layer = next(layer for layer in lowered.layers if layer.node == reader)
    assert layer.x_plane
    t = tile(layer, arch)
    (oh, ow), (th, tw) = layer.out_hw, t.tile_hw
    if oh % th == 0 and ow % tw == 0:  # the model prices every tile as the first
        assert cycles == conv_array_cycles(layer, t, arch)
    result = assert_busy_is_own_cycles(wide.compiled.program, reader, "array", "compute")
    assert result.stats.macs == wide.compiled.summary.array_macs


def wide_gemm(k: int, bias: float = 0.0):
    """A Gemm of K = k inputs whose weights are all +-0.01 (each int8 code +-127) after one
    producing the int16 tensor: sum |w_q| = 127 k, the bound's worst case."""
    rng = np.random.default_rng(2)
    w2 = np.where(rng.random((k, 8)) < 0.5, -0.01, 0.01)
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["mid"], name="g1"),
             helper.make_node("Gemm", ["mid", "w2", "b2"], ["y"], name="g2")]
    inits = {"w1": rng.normal(0, .5, (16, k)), "w2": w2, "b2": np.full(8, bias)}
    return model(nodes, {"x": [3, 16]}, {"y": [3, 8]},
                 {name: v.astype(np.float32) for name, v in inits.items()})


def test_accumulator_bits_keep_the_worst_case_sum_inside_int32() -> None:
    """2^(b-1) sum |w_q| < 2^31: K = 4096 codes of 127 leave b = 13 (2^12 * 520,192 < 2^31 <
    2^13 * 520,192); a bias adds its codes per step of the input; K = 64 keeps all 16 bits."""
    proto = wide_gemm(4096)
    graph = optimized_graph(proto)
    assert accumulator_bits(graph, "mid", 3.0, True, False) == 13
    assert 2**12 * 127 * 4096 < 2**31 < 2**13 * 127 * 4096
    assert accumulator_bits(optimized_graph(wide_gemm(64)), "mid", 3.0, True, False) == 16
    # A bias of 0.5 against amax 3 and s_w = 0.01/127: 0.5 / (3 * 0.01/127) = 2117 more a step.
    biased = optimized_graph(wide_gemm(4096, bias=0.5))
    assert accumulator_bits(biased, "mid", 3.0, True, False) == \
        1 + int(np.floor(np.log2((2**31 - 2) / (127 * 4096 + 0.5 * 127 / 0.03))))


def test_where_the_bound_bites_the_codes_narrow_and_stay_exact_at_the_extremes() -> None:
    """K = 4096: 'mid' gets 13-bit codes (a warning says so), its producer clamps to them, and
    inputs far past the calibrated range (every code at the clamp, each weight code +-127) still
    run bit-exactly, the accumulators' sum inside int32."""
    proto = wide_gemm(4096)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = build(proto)
    assert any(isinstance(w.message, QuantizeWarning) and "13-bit codes" in str(w.message)
               for w in caught)
    qgraph = built.qgraph
    producer = next(node for node in qgraph.nodes if node.outputs[0] == "mid")
    assert tuple(producer.attrs["qclamp"]) == (-2**12, 2**12 - 1)
    extreme = [{"x": s["x"] * 1000} for s in samples(proto, 2, 3)]
    codes = run_int8(qgraph, extreme[0], keep_all=True)["mid"]
    assert codes.min() == -2**12 and codes.max() == 2**12 - 1
    check_bit_exact(qgraph, built.compiled, extreme)


def test_a_bound_that_leaves_too_few_bits_is_refused() -> None:
    with pytest.raises(QuantizeError, match="int16 tensor 'mid': its readers' weights leave "
                                            "only 8 bits"):
        build(wide_gemm(2**17))


@pytest.mark.parametrize("name, why", [
    ("nowhere", "not an activation"),
])
def test_a_tensor_that_cannot_be_int16_is_named(name: str, why: str) -> None:
    with pytest.raises(QuantizeError, match=f"int16 tensor '{name}': {why}"):
        build(conv_conv(), QuantOptions(int16_tensors=(name,)))


def test_a_reader_that_cannot_read_int16_is_named() -> None:
    """A Softmax reads int8 codes only (a MaxPool reads int16 too: test_int16_movement)."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["mid"], name="c1"),
             helper.make_node("Softmax", ["mid"], ["y"], name="softmax", axis=1)]
    proto = model(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 4, 6, 6]},
                  {"w1": rng.normal(0, .3, (4, 3, 1, 1)).astype(np.float32)})
    with pytest.raises(QuantizeError, match="int16 tensor 'mid': read by Softmax 'softmax'"):
        build(proto)


def test_a_relu_fused_into_the_producer_clamps_the_int16_codes_at_zero() -> None:
    """Conv -> Relu -> Conv with the Relu's output int16: the wide REQUANT's clamp [0, max]."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["pre"], name="c1"),
             helper.make_node("Relu", ["pre"], ["mid"], name="relu"),
             helper.make_node("Conv", ["mid", "w2"], ["y"], name="c2")]
    proto = model(nodes, {"x": [2, 8, 6, 6]}, {"y": [2, 12, 6, 6]},
                  {"w1": rng.normal(0, .3, (40, 8, 1, 1)).astype(np.float32),
                   "w2": rng.normal(0, .1, (12, 40, 1, 1)).astype(np.float32)})
    with pytest.raises(QuantizeError, match="its Relu is fused into 'c1'; name the Relu's "
                                            "output 'mid'"):
        build(proto, QuantOptions(int16_tensors=("pre",)))
    for preset in PRESETS:
        built = build(proto, preset=preset)
        requants = [i for i in built.compiled.program.instructions
                    if i.op is isa.REQUANT and i.args["wide"]]
        assert requants and all(i.args["qmin"] == 0 for i in requants)
        check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 5))


@pytest.mark.parametrize("kind, attrs, weight, out_hw", [
    ("grouped", dict(group=4, pads=[1, 1, 1, 1]), (16, 5, 3, 3), (9, 9)),
    ("depthwise", dict(group=20, pads=[1, 1, 1, 1]), (20, 1, 3, 3), (9, 9)),
    ("strided", dict(strides=[2, 2], pads=[1, 1, 1, 1]), (16, 20, 3, 3), (5, 5)),
    ("dilated", dict(dilations=[2, 2], pads=[2, 2, 2, 2]), (16, 20, 3, 3), (9, 9)),
])
def test_readers_of_every_convolution_form_are_bit_exact(kind, attrs, weight, out_hw) -> None:
    """Grouped and depthwise readers (dense block-diagonal tiles, zero blocks skipped), strided
    and dilated ones (COMPUTE's strides walk both planes alike), on every preset."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["mid"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["mid", "w2"], ["y"], name="c2", **attrs)]
    proto = model(nodes, {"x": [2, 3, 9, 9]}, {"y": [2, weight[0], *out_hw]},
                  {"w1": rng.normal(0, .3, (20, 3, 3, 3)).astype(np.float32),
                   "w2": rng.normal(0, .1, weight).astype(np.float32)})
    for preset in PRESETS:
        built = build(proto, preset=preset)
        check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 1))


def test_the_command_line_names_int16_tensors(tmp_path) -> None:
    """`ember compile --int16 NAME[,NAME...]`: recorded in the program's header; a tensor that
    cannot be int16 is a one-line error naming it."""
    import onnx

    from simulator.program import Program
    from tests.cli import assert_one_line_error, invoke
    proto = conv_conv()
    onnx.save(proto, tmp_path / "m.onnx")
    np.save(tmp_path / "cal.npy", np.concatenate([s["x"] for s in samples(proto, 4, 0)]))
    profile = tmp_path / "m.profile.json"
    assert invoke("quantize-profile", tmp_path / "m.onnx", "--data", tmp_path / "cal.npy",
                  "-o", profile).exit_code == 0
    result = invoke("compile", tmp_path / "m.onnx", "--int8", "--profile", profile,
                    "--int16", "mid", "-o", tmp_path / "m.ember")
    assert result.exit_code == 0, result.output
    header = Program.load(tmp_path / "m.ember").metadata["options"]
    assert header["int16_tensors"] == ["mid"]
    assert_one_line_error(invoke("compile", tmp_path / "m.onnx", "--int8", "--profile", profile,
                                 "--int16", "mid,nowhere", "-o", tmp_path / "bad.ember"),
                          "int16 tensor 'nowhere': not an activation")
