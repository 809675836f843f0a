"""int16 weights on the array: the Conv, Gemm and MatMul nodes named in
`QuantOptions.int16_weights` have symmetric int16 weight codes (as many bits, up to 15, as keep
their int32 accumulators from overflowing for any input), and the array runs each weight tile
as two passes of its int8 parts (`numerics.split_weight`: COMPUTE shift=7 for the high one)
into the same accumulator rows. Bit-exact against the integer reference on every preset,
batched, for every convolution form; the weights' own error over 30 dB smaller; the codes
narrowed where the accumulators need it, exact at the extremes; the node's array time twice the
int8 one's, as the cost model says; refusals one line each."""

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
from simulator import isa, numerics
from simulator.arch import Arch
from tests.e2e.flow import (assert_busy_is_own_cycles, check_bit_exact, compute_cycles,
                            output_sqnr_db)
from tests.e2e.models import CONV_FORMS, conv_form
from tests.e2e.test_int16_array import gemm_gemm, matmul_matmul
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

PRESETS = ("default", "edge", "large")


def conv_conv():
    """x (RGB) -> Conv 3x3 (20 channels, padded) -> Relu -> Conv 3x3 (24 channels) -> y."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["mid"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["mid"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="c2", pads=[1, 1, 1, 1])]
    inits = {"w1": rng.normal(0, .3, (20, 3, 3, 3)), "b1": rng.normal(0, .1, 20),
             "w2": rng.normal(0, .1, (24, 20, 3, 3)), "b2": rng.normal(0, .1, 24)}
    return model(nodes, {"x": [2, 3, 10, 10]}, {"y": [2, 24, 10, 10]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


MODELS = {"conv": (conv_conv, ("c1", "c2")), "gemm": (gemm_gemm, ("g1", "g2")),
          "matmul": (matmul_matmul, ("m1", "m2"))}


def samples(proto, count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    value = proto.graph.input[0]
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    return [{value.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def build(proto, options: QuantOptions, preset: str = "default"):
    profile = profile_of(proto, samples(proto, 8, 0), optimized_graph(proto))
    return compile_model(proto, profile, CompileOptions(quant=options), preset)


def _wide(names) -> QuantOptions:
    return QuantOptions(int16_weights=tuple(names))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kind", MODELS)
def test_int16_weights_run_bit_exactly(kind: str, preset: str) -> None:
    """Both layers' weights int16: 15-bit codes, split into two tiles a tap (shift 7, then 0);
    three samples in one batch, then the last alone (`check_bit_exact`)."""
    make, names = MODELS[kind]
    built = build(make(), _wide(names), preset)
    for node in built.qgraph.nodes:
        if node.name in names:
            codes = built.qgraph.values[node.inputs[1]].const
            assert codes.dtype == np.int16 and np.abs(codes).max() == 2**14 - 1
    computes = [i for i in built.compiled.program.instructions if i.op is isa.COMPUTE]
    high = [i for i in computes if i.args["shift"] == numerics.WEIGHT_HIGH_SHIFT]
    assert high and 2 * len(high) == len(computes)
    check_bit_exact(built.qgraph, built.compiled, samples(make(), 3, 1))


def test_a_tap_packed_first_layer_with_int16_weights_is_bit_exact() -> None:
    """The RGB layer packs kernel columns into K (a padded input copy): each packed tile is two
    parts as well."""
    proto = conv_conv()
    for preset in PRESETS:
        built = build(proto, _wide(["c1"]), preset)
        lowered = lower(optimize(built.qgraph, INT8_PASSES))
        layer = next(layer for layer in lowered.layers if layer.node == "c1")
        assert layer.weight_passes == 2
        if preset == "default":
            assert tile(layer, Arch.load(preset), packable=True).packed_taps > 1
        check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 4))


@pytest.mark.parametrize("kind, attrs, weight, out_hw", CONV_FORMS)
def test_every_convolution_form_is_bit_exact(kind, attrs, weight, out_hw) -> None:
    """Grouped and depthwise (dense block-diagonal tiles, zero blocks skipped), strided,
    dilated and padded ones, and a 1x1 (its input loaded as whole channel blocks), on every
    preset."""
    proto = conv_form(attrs, weight, out_hw)
    for preset in PRESETS:
        built = build(proto, _wide(["c2"]), preset)
        check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 1))


@pytest.mark.parametrize("cin, cout, hw, whole, resident", [
    (32, 48, 12, True, False), (64, 64, 8, False, False), (16, 256, 8, False, True)])
def test_every_tiling_plan_is_bit_exact(cin, cout, hw, whole, resident) -> None:
    """On edge's small scratchpad, the doubled weight rows pick each plan the tiler has: pixel
    tiles outermost with weights streamed per visit; output-channel blocks outermost with a
    K slice's weights at a time, or a block's resident."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="c", pads=[1, 1, 1, 1])]
    proto = model(nodes, {"x": [1, cin, hw, hw]}, {"y": [1, cout, hw, hw]},
                  {"w": rng.normal(0, .1, (cout, cin, 3, 3)).astype(np.float32)})
    built = build(proto, _wide(["c"]), "edge")
    layer = next(layer for layer in lower(optimize(built.qgraph, INT8_PASSES)).layers
                 if layer.node == "c")
    t = tile(layer, Arch.load("edge"))
    assert (t.whole_layer, t.resident_weights) == (whole, resident)
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 1))


@pytest.mark.parametrize("options", [
    dict(activation_dtype="uint8"), dict(per_channel=False), dict(schema="power2"),
    dict(symmetric_activations=True)])
def test_other_quantization_options_stay_bit_exact(options) -> None:
    """uint8 activations (offset to int8 codes, the fold's correction in the bias), one scale
    per tensor, power-of-two scales, symmetric activations."""
    proto = conv_conv()
    built = build(proto, QuantOptions(int16_weights=("c1", "c2"), **options))
    assert built.qgraph.values["w2"].type.dtype == "int16"
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 2))


def test_bias_correction_with_int16_weights_is_bit_exact(tmp_path) -> None:
    """The correction (W_q - W times the input's channel means, from a profile made with
    channel means) moves the bias the accumulator bound counts: still bit-exact."""
    from profiler.model_inputs import input_specs
    from profiler.run import RunOptions, profile
    from profiler.sources.arrays import ArrayFile
    proto = conv_conv()
    path = tmp_path / "calib.npz"
    np.savez(path, x=np.concatenate([s["x"] for s in samples(proto, 4, 0)]))
    specs = input_specs(proto, {})
    prof = profile(proto, ArrayFile(path, specs), specs, RunOptions(channel_means=True))
    options = QuantOptions(int16_weights=("c1", "c2"), bias_correction=True)
    built = compile_model(proto, prof, CompileOptions(quant=options))
    plain = compile_model(proto, prof, CompileOptions(quant=_wide(["c1", "c2"])))
    assert not np.array_equal(built.qgraph.values["c2/bias"].const,
                              plain.qgraph.values["c2/bias"].const)
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 6))


@pytest.mark.parametrize("kind, tensor, node", [("conv", "r", "c1"), ("gemm", "mid", "g1")])
def test_a_node_with_int16_weights_writes_an_int16_tensor(kind, tensor, node) -> None:
    """int16 weights and an int16 output on one node (`--int16` of its output): its int8 input
    times int16 weights requantized to int16 planes (REQUANT wide), read by an int8-weight
    reader in two plane passes; every preset."""
    make, _ = MODELS[kind]
    for preset in PRESETS:
        built = build(make(), QuantOptions(int16_tensors=(tensor,), int16_weights=(node,)),
                      preset)
        assert built.qgraph.values[tensor].type.dtype == "int16"
        check_bit_exact(built.qgraph, built.compiled, samples(make(), 2, 3))


def _weight_sqnr_db(graph, qgraph, name: str) -> float:
    """SQNR of a weight's dequantized codes against its fp32 values."""
    want = graph.values[name].const.astype(np.float64)
    value = qgraph.values[name]
    params = value.type.quant
    scale = np.asarray(params.scale, np.float64)
    if params.axis is not None:
        scale = scale.reshape([-1 if i == params.axis else 1 for i in range(want.ndim)])
    got = value.const.astype(np.float64) * scale
    return 10 * np.log10((want ** 2).sum() / ((want - got) ** 2).sum())


@pytest.mark.parametrize("kind", MODELS)
def test_the_weights_are_far_closer_to_fp32_and_so_is_the_output(kind: str) -> None:
    """15-bit codes against 8-bit ones: the weights' own error over 30 dB smaller (7 bits are
    about 42 dB); the int8 activations then bound the output, which still improves."""
    make, names = MODELS[kind]
    proto = make()
    wide, narrow = build(proto, _wide(names)).qgraph, build(proto, QuantOptions()).qgraph
    graph = optimized_graph(proto)
    for node in graph.nodes:
        if node.name in names:
            assert _weight_sqnr_db(graph, wide, node.inputs[1]) >= \
                _weight_sqnr_db(graph, narrow, node.inputs[1]) + 30
    feeds = samples(proto, 4, 9)
    assert output_sqnr_db(graph, wide, feeds, "y") > output_sqnr_db(graph, narrow, feeds, "y")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kind, node", [("conv", "c2"), ("gemm", "g2"), ("matmul", "m2")])
def test_the_node_takes_twice_the_array_time_as_the_cost_model_says(kind, node, preset):
    """Each tap is two weight tiles: the node's COMPUTE cycles are twice the int8 program's
    (the same tiles here), and equal the tiler's cost model (`conv_array_cycles`); the DRAM
    image holds its weight bytes twice; the simulator's busy time on the array is the
    instructions' own cycles."""
    make, _ = MODELS[kind]
    proto = make()
    wide, narrow = build(proto, _wide([node]), preset), build(proto, QuantOptions(), preset)
    arch = Arch.load(preset)
    cycles = compute_cycles(wide.compiled.program, node)
    assert cycles == 2 * compute_cycles(narrow.compiled.program, node)
    lowered = lower(optimize(wide.qgraph, INT8_PASSES))
    layer = next(layer for layer in lowered.layers if layer.node == node)
    assert layer.weight_passes == 2
    t = tile(layer, arch)
    (oh, ow), (th, tw) = layer.out_hw, t.tile_hw
    if oh % th == 0 and ow % tw == 0:  # the model prices every tile as the first
        assert cycles == conv_array_cycles(layer, t, arch)
    assert len(wide.compiled.program.dram_image) > len(narrow.compiled.program.dram_image)
    result = assert_busy_is_own_cycles(wide.compiled.program, node, "array", "compute")
    assert result.stats.macs == wide.compiled.summary.array_macs


def signed_gemm(k: int, bias: float = 0.5):
    """A Gemm of K = k inputs (the model input, read only by it) whose weights are all
    +-0.01 (each code its largest), every column with the same signs: an input of +-1000 by
    those signs puts every accumulator at its worst case at once."""
    rng = np.random.default_rng(2)
    signs = np.where(rng.random(k) < 0.5, -1.0, 1.0)
    w = np.repeat(signs[:, None], 8, axis=1) * 0.01
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="g")]
    return model(nodes, {"x": [3, k]}, {"y": [3, 8]},
                 {"w": w.astype(np.float32), "b": np.full(8, bias, np.float32)}), signs


def test_where_the_accumulators_bite_the_codes_narrow_and_stay_exact_at_the_extremes() -> None:
    """K = 4096 codes of +-(2^(b-1) - 1): the most bits b whose worst-case accumulator (input
    codes at the ends of int8 by the weights' signs, from the zero point, plus the bias) fits
    int32 are taken, and a warning says how many; one more bit would overflow. Inputs at the
    clamp by the weights' signs (every accumulator at its largest, then its least) run
    bit-exactly."""
    proto, signs = signed_gemm(4096)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = build(proto, _wide(["g"]))
    qgraph = built.qgraph
    node = next(node for node in qgraph.nodes if node.name == "g")
    codes = qgraph.values[node.inputs[1]].const.astype(np.int64)
    qmax = int(np.abs(codes).max())
    bits = int(np.log2(qmax + 1)) + 1
    assert qmax == 2**(bits - 1) - 1 and 9 <= bits < 15
    assert any(isinstance(w.message, QuantizeWarning) and f"{bits}-bit codes" in str(w.message)
               for w in caught)
    zero = qgraph.type_of(node.inputs[0]).quant.zero_point[0]
    positive, negative = int((signs > 0).sum()), int((signs < 0).sum())
    # The bias without the folded zero point: its real code, which grows with the codes.
    bias = int((qgraph.values[node.inputs[2]].const.astype(np.int64) +
                zero * codes.sum(axis=0)).max())
    per_code = positive * (127 - zero) + negative * (zero + 128) + bias / qmax
    assert qmax * per_code <= 2**31 - 1 < (2 * qmax + 1) * per_code
    extreme = [{"x": np.repeat(s * signs[None, :] * 1000, 3, axis=0).astype(np.float32)}
               for s in (1.0, -1.0)]
    for sample, sign in zip(extreme, (1, -1)):
        x = run_int8(qgraph, sample, keep_all=True)[node.inputs[0]].astype(np.int64)
        assert np.array_equal(x[0], np.where(sign * signs > 0, 127, -128))
    largest = (x[0] - zero) @ codes  # the last: every accumulator at its least
    assert largest.min() < -2**30  # within a factor of two of the wrap
    check_bit_exact(qgraph, built.compiled, extreme)
    for preset in ("edge", "large"):  # K in slices of other array sizes, streamed weights
        with pytest.warns(QuantizeWarning, match=f"{bits}-bit codes"):
            other = build(proto, _wide(["g"]), preset)
        check_bit_exact(other.qgraph, other.compiled, extreme)


def test_too_few_bits_are_refused() -> None:
    """K = 2^17 codes against input codes about 128 from the zero point: 2^24 K > 2^31 leaves
    fewer than 9 bits."""
    proto, _ = signed_gemm(2**17, bias=0.0)
    with pytest.raises(QuantizeError, match="int16 weights of node 'g' \\(Gemm\\): its int32 "
                                            "accumulators hold only 8-bit weight codes"):
        build(proto, _wide(["g"]))


@pytest.mark.parametrize("names, options, message", [
    (("nowhere",), {}, "--int16-weights 'nowhere': no such node in graph"),
    (("relu",), {}, "int16 weights of node 'relu' \\(Relu\\): only a Conv, Gemm or MatMul of "
                    "an activation by a constant weight"),
    (("c2",), {"keep_fp32": ("c2",)}, "int16 weights of node 'c2' \\(Conv\\): the node is "
                                      "kept in fp32"),
])
def test_a_node_that_cannot_have_int16_weights_is_named(names, options, message) -> None:
    with pytest.raises(QuantizeError, match=message):
        build(conv_conv(), QuantOptions(int16_weights=names, **options))


def test_a_product_of_two_activations_is_refused() -> None:
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="m1"),
             helper.make_node("MatMul", ["a", "x"], ["y"], name="m2")]
    proto = model(nodes, {"x": [4, 4]}, {"y": [4, 4]},
                  {"w": rng.normal(0, .3, (4, 4)).astype(np.float32)})
    with pytest.raises(QuantizeError, match="int16 weights of node 'm2' \\(MatMul\\): only a "
                                            "Conv, Gemm or MatMul of an activation by a "
                                            "constant weight"):
        build(proto, _wide(["m2"]))


def test_the_qdq_export_runs_int16_weights_in_onnxruntime(tmp_path) -> None:
    """The export keeps the int16 codes (opset 21's DequantizeLinear reads int16):
    onnxruntime runs it, within one output code of the integer reference."""
    proto = conv_conv()
    assert_export_within_a_step(proto, build(proto, _wide(["c1", "c2"])).qgraph, tmp_path)


def assert_export_within_a_step(proto, qgraph, tmp_path) -> None:
    """The QDQ export of `qgraph` runs in onnxruntime, output 'y' within one output code of
    the integer reference."""
    import onnxruntime as ort

    from quantizer.qdq import export_qdq
    path = tmp_path / "qdq.onnx"
    export_qdq(qgraph, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    step = qgraph.values["y/q"].type.quant.scale[0]
    for sample in samples(proto, 2, 3):
        got = session.run(None, sample)[0]
        assert np.abs(got - run_int8(qgraph, sample)["y"]).max() <= step * 1.001


def test_the_command_line_names_int16_weights(tmp_path) -> None:
    """`ember compile --int16-weights NODE[,NODE...]`: recorded in the program's header, and
    `ember accuracy` of that program runs it bit-exactly; a node that cannot have them is a
    one-line error naming it."""
    import json

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
                    "--int16-weights", "c1,c2", "-o", tmp_path / "m.ember")
    assert result.exit_code == 0, result.output
    header = Program.load(tmp_path / "m.ember").metadata["options"]
    assert header["int16_weights"] == ["c1", "c2"]
    result = invoke("accuracy", tmp_path / "m.onnx", tmp_path / "m.ember", "--profile", profile,
                    "--data", tmp_path / "cal.npy", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["bit_exact"] is True and report["options"]["int16_weights"] == ["c1", "c2"]
    assert_one_line_error(invoke("compile", tmp_path / "m.onnx", "--int8", "--profile", profile,
                                 "--int16-weights", "c2,relu", "-o", tmp_path / "bad.ember"),
                          "int16 weights of node 'relu' (Relu): only a Conv, Gemm or MatMul")
