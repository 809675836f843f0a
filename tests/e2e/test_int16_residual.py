"""int16 through residual Adds (issue #16 part 5): a tensor named in
`QuantOptions.int16_tensors` may be an Add's output (ADD wide=1, clamped to its b-bit range by
the instruction's high-byte clamp) and may be read by Adds (a_wide, b_wide) besides the array's
Convs, Gemms and MatMuls. An inverted-residual network (EfficientNet's, MobileNetV2's) carries
its error along the skip path: every tensor of that path can now be int16 on the accelerator,
bit-exact against the integer reference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.errors import QuantizeWarning
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from quantizer.wide import accumulator_bits
from simulator import isa, numerics
from tests.e2e.flow import check_bit_exact, output_sqnr_db, value_sqnr_db
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

PRESETS = ("default", "edge", "large")
# Every tensor of the skip path: a Conv's + Relu's output read by a Conv and an Add, a Conv's
# read by an Add, an Add's read by a Conv and an Add, an Add's read by a Conv.
SKIP_PATH = ("t", "u", "s", "w")


def residual(channels: int = 16, k2: float = 0.1):
    """x -> Conv 3x3 + Relu -> t; t -> Conv 3x3 -> u; s = t + u; s -> Conv 1x1 -> v;
    w = s + v; w -> Conv 1x1 -> y: two residual Adds, as an inverted-residual network's."""
    rng = np.random.default_rng(0)
    c = channels
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["t0"], name="c0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["t0"], ["t"], name="r0"),
             helper.make_node("Conv", ["t", "w1", "b1"], ["u"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["t", "u"], ["s"], name="add1"),
             helper.make_node("Conv", ["s", "w2", "b2"], ["v"], name="c2"),
             helper.make_node("Add", ["s", "v"], ["w"], name="add2"),
             helper.make_node("Conv", ["w", "w3", "b3"], ["y"], name="c3")]
    inits = {"w0": rng.normal(0, .3, (c, 3, 3, 3)), "b0": rng.normal(0, .1, c),
             "w1": rng.normal(0, .1, (c, c, 3, 3)), "b1": rng.normal(0, .1, c),
             "w2": rng.normal(0, k2, (c, c, 1, 1)), "b2": rng.normal(0, .1, c),
             "w3": rng.normal(0, .1, (10, c, 1, 1)), "b3": rng.normal(0, .1, 10)}
    return model(nodes, {"x": [2, 3, 8, 8]}, {"y": [2, 10, 8, 8]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def samples(proto, count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def build(proto, options: QuantOptions, preset: str = "default"):
    profile = profile_of(proto, samples(proto, 8, 0), optimized_graph(proto))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizeWarning)
        return compile_model(proto, profile, CompileOptions(quant=options), preset)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("names", [SKIP_PATH, ("s",), ("u",), ("w",)])
def test_the_skip_path_in_int16_runs_bit_exactly(names, preset) -> None:
    """Each tensor alone and all four together: three samples in a batch, then the last alone."""
    proto = residual()
    built = build(proto, QuantOptions(int16_tensors=names), preset)
    for name in names:
        assert built.qgraph.values[name].type.dtype == "int16"
    adds = [i for i in built.compiled.program.instructions if i.op is isa.ADD]
    if "s" in names or "w" in names:
        assert any(i.args["wide"] for i in adds)
    if "u" in names or "s" in names:
        assert any(i.args["a_wide"] or i.args["b_wide"] for i in adds)
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 3, 1))


def test_the_skip_path_in_int16_is_closer_to_fp32() -> None:
    """Each of the four tensors' own error (fp32's values in its type and back, over the
    calibration samples: rounding, not clipping) is over 30 dB smaller, and the output, over
    other samples, improves."""
    proto = residual()
    wide = build(proto, QuantOptions(int16_tensors=SKIP_PATH)).qgraph
    narrow = build(proto, QuantOptions()).qgraph
    graph = optimized_graph(proto)
    for name in SKIP_PATH:
        assert _own_sqnr_db(graph, wide, name, samples(proto, 8, 0)) > \
            _own_sqnr_db(graph, narrow, name, samples(proto, 8, 0)) + 30, name
    feeds = samples(proto, 4, 9)
    assert output_sqnr_db(graph, wide, feeds, "y") > output_sqnr_db(graph, narrow, feeds, "y") + 1


def _own_sqnr_db(graph, qgraph, name: str, feeds, coded: str | None = None) -> float:
    return value_sqnr_db(graph, qgraph, name, feeds, True, coded)


def test_an_add_whose_int16_sum_the_array_reads_clamps_to_its_bits() -> None:
    """A 1x1 Conv of K = 2048 channels of +-127 codes after the Add leaves its sum 14 bits: the
    ADD's high-byte clamp holds it there, and inputs far past the calibrated range (every code
    at the clamp) still run bit-exactly, the reader's accumulators inside int32."""
    rng = np.random.default_rng(2)
    k = 2048
    w2 = np.where(rng.random((8, k, 1, 1)) < 0.5, -0.01, 0.01)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="ca"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="cb"),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Conv", ["s", "w2"], ["y"], name="c2")]
    proto = model(nodes, {"x": [1, 4, 3, 3]}, {"y": [1, 8, 3, 3]},
                  {"wa": rng.normal(0, .5, (k, 4, 1, 1)).astype(np.float32),
                   "wb": rng.normal(0, .5, (k, 4, 1, 1)).astype(np.float32),
                   "w2": w2.astype(np.float32)})
    bits = accumulator_bits(optimized_graph(proto), "s", 3.0, True, False)
    assert bits == 14 and 2**13 * 127 * k < 2**31 < 2**14 * 127 * k
    built = build(proto, QuantOptions(int16_tensors=("s",)))
    add = next(node for node in built.qgraph.nodes if node.outputs[0] == "s")
    assert tuple(add.attrs["qclamp"]) == (-2**13, 2**13 - 1)
    wide_adds = [i for i in built.compiled.program.instructions
                 if i.op is isa.ADD and i.args["wide"]]
    assert wide_adds and all((i.args["qmin"], i.args["qmax"]) == (-32, 31) for i in wide_adds)
    extreme = [{"x": s["x"] * 1000} for s in samples(proto, 2, 3)]
    codes = run_int8(built.qgraph, extreme[0], keep_all=True)["s"]
    assert codes.min() == -2**13 and codes.max() == 2**13 - 1
    check_bit_exact(built.qgraph, built.compiled, extreme)


def test_a_dead_channel_of_the_reader_does_not_narrow_the_codes() -> None:
    """A depthwise reader whose channel has weights of 1e-9 beside a bias of 1 (BatchNorm's
    dead channel): its bias code per input step would be 2^36, but the quantizer's floor holds
    every bias code within 2^24, so the bound keeps all 16 bits."""
    rng = np.random.default_rng(7)
    w2 = rng.normal(0, .3, (6, 1, 3, 3))
    w2[2] = 1e-9
    b2 = np.zeros(6)
    b2[2] = 1.0
    nodes = [helper.make_node("Conv", ["x", "w1"], ["mid"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["mid", "w2", "b2"], ["y"], name="c2", group=6,
                              pads=[1, 1, 1, 1])]
    proto = model(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 6, 6, 6]},
                  {"w1": rng.normal(0, .3, (6, 3, 3, 3)).astype(np.float32),
                   "w2": w2.astype(np.float32), "b2": b2.astype(np.float32)})
    assert accumulator_bits(optimized_graph(proto), "mid", 3.0, True, False) == 16
    built = build(proto, QuantOptions(int16_tensors=("mid",)))
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 4))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("names", [("mid",), ("g",), ("y",), ("mid", "g", "y")], ids="+".join)
def test_an_add_that_broadcasts_a_value_per_channel_takes_int16(names, preset) -> None:
    """An Add of a [1, C, 1, 1] gate over [1, C, H, W]: ADD reads the gate's one row for the
    tile's pixels (b_once), both planes of each int16 operand, and writes an int16 sum; bit-
    exact, batched (once refused: its operands were not whole tensors of its shape)."""
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["mid"], name="c1"),
             helper.make_node("GlobalAveragePool", ["mid"], ["g"], name="gap"),
             helper.make_node("Add", ["mid", "g"], ["y"], name="add")]
    proto = model(nodes, {"x": [2, 3, 4, 4]}, {"y": [2, 5, 4, 4]},
                  {"w1": rng.normal(0, .3, (5, 3, 1, 1)).astype(np.float32)})
    built = build(proto, QuantOptions(int16_tensors=names), preset)
    adds = [i for i in built.compiled.program.instructions if i.op is isa.ADD]
    assert adds and all(i.args["b_once"] == 1 and (i.args["a_wide"], i.args["b_wide"],
                                                   i.args["wide"]) ==
                        tuple(int(n in names) for n in ("mid", "g", "y")) for i in adds)
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 3, 4))


@pytest.mark.parametrize("preset", PRESETS)
def test_an_int16_model_input_is_written_by_the_host_as_two_planes(preset) -> None:
    """The model input int16 (the host quantizes it to 16 bits and writes both planes: an
    int16 binding), read by the first Conv on the array: bit-exact, batched; the input's own
    error 40 dB smaller. That Conv packs taps (3 channels), so each plane lives inside its own
    padded copy: the planes one copy (2 images of 10 x 10 pixels) apart, at its strides."""
    proto = residual()
    built = build(proto, QuantOptions(int16_tensors=("x",)), preset)
    program = built.compiled.program
    (binding,) = program.inputs
    assert binding.dtype == "int16" and binding.plane == 2 * 3 * 10 * 10
    assert binding.strides == (300, 1, 30, 3)
    assert binding.to_dict()["plane"] == binding.plane
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 3, 1))
    if preset == "default":
        narrow = build(proto, QuantOptions()).qgraph
        graph = optimized_graph(proto)
        wide_q = next(n.outputs[0] for n in built.qgraph.nodes if n.op == "QuantizeLinear")
        narrow_q = next(n.outputs[0] for n in narrow.nodes if n.op == "QuantizeLinear")
        feeds = samples(proto, 4, 9)
        assert built.qgraph.values[wide_q].type.dtype == "int16"

        def own(qgraph, name):
            params = qgraph.values[name].type.quant
            codes = run_int8(qgraph, feeds[0], keep_all=True)[name]
            got = numerics.dequantize(codes, params.scale[0], params.zero_point[0],
                                      arithmetic=np.float64)
            want = feeds[0]["x"].astype(np.float64)
            return 10 * np.log10((want ** 2).sum() / ((want - got) ** 2).sum())
        assert own(built.qgraph, wide_q) > own(narrow, narrow_q) + 40
        assert output_sqnr_db(graph, built.qgraph, feeds, "y") > \
            output_sqnr_db(graph, narrow, feeds, "y")


def test_an_int16_binding_must_say_where_its_low_plane_is() -> None:
    from simulator.errors import SimulatorError
    from simulator.program import binding_from_dict
    record = {"name": "x", "dram": 0, "shape": [1, 4], "scale": 0.1, "zero_point": 0,
              "dtype": "int16", "strides": []}
    with pytest.raises(SimulatorError, match="input 'x': plane = None: expected a positive"):
        binding_from_dict(record, "input")
    assert binding_from_dict({**record, "plane": 4}, "input").span() == (0, 8)
    with pytest.raises(SimulatorError, match="plane = 4"):
        binding_from_dict({**record, "dtype": "int8", "plane": 4}, "input")
    with pytest.raises(SimulatorError, match="zero_point = 3"):
        binding_from_dict({**record, "plane": 4, "zero_point": 3}, "input")


@pytest.mark.parametrize("preset", PRESETS)
def test_an_int16_model_output_is_read_by_the_host_from_two_planes(preset) -> None:
    """The model output int16 (its Conv's REQUANT wide=1; the host reads both planes and
    dequantizes: an int16 binding): bit-exact, batched, and closer to fp32."""
    proto = residual()
    built = build(proto, QuantOptions(int16_tensors=("y",)), preset)
    (binding,) = built.compiled.program.outputs
    assert binding.dtype == "int16" and binding.plane == 2 * 10 * 8 * 8
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 3, 1))
    if preset == "default":
        graph, narrow = optimized_graph(proto), build(proto, QuantOptions()).qgraph
        assert built.qgraph.values["y/q"].type.dtype == "int16"
        assert _own_sqnr_db(graph, built.qgraph, "y", samples(proto, 8, 0), "y/q") > \
            _own_sqnr_db(graph, narrow, "y", samples(proto, 8, 0), "y/q") + 30
