"""An int16 input times int16 weights on the array: a Conv, Gemm or MatMul named in both
`QuantOptions.int16_tensors` (its input) and `QuantOptions.int16_weights` runs four passes per
weight tile (`numerics.wide_passes`: COMPUTE shifts 15, 7, 8 and 0) into one accumulator, the
two widths chosen jointly (`quantizer.wide_weights`). Bit-exact against the integer reference
on every preset and convolution form; the node's output closer to fp32 than with either widened
alone; four times the int8 array time, as the cost model says; no partial sum leaves int32 for
worst-case codes; where the bound leaves too few bits, a one-line refusal."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from onnx import helper

from compiler.backend.lower import lower
from compiler.backend.tiling import conv_array_cycles, tile
from compiler.pipeline import INT8_PASSES, optimize
from ember.flow import optimized_graph
from quantizer.errors import QuantizeError, QuantizeWarning
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from quantizer.wide_weights import pass_bound
from compiler.graph.ops import OPS, int8_attrs
from simulator import isa, machine, numerics
from simulator.arch import Arch
from simulator.machine import State
from tests.e2e.flow import (assert_busy_is_own_cycles, check_bit_exact, compute_cycles,
                            value_sqnr_db)
from tests.e2e.models import CONV_FORMS, conv_form
from tests.e2e.test_int16_array import wide_gemm
from tests.e2e.test_int16_weights import (MODELS, assert_export_within_a_step, build,
                                          samples, signed_gemm)
from tests.onnx_builder import model

PRESETS = ("default", "edge", "large")
# Each model's int16 tensor between its two layers (read by the second).
INNER = {"conv": "r", "gemm": "mid", "matmul": "mid"}
WIDE_PASSES = {shift for _, _, shift in numerics.wide_passes()}


def _both(kind: str) -> QuantOptions:
    """The model input and the inner tensor int16, both layers' weights int16: every layer
    reads an int16 input by int16 weights."""
    return QuantOptions(int16_tensors=("x", INNER[kind]), int16_weights=MODELS[kind][1])


def _layer(built, node: str):
    return next(layer for layer in lower(optimize(built.qgraph, INT8_PASSES)).layers
                if layer.node == node)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kind", MODELS)
def test_both_int16_run_bit_exactly(kind: str, preset: str) -> None:
    """Each tap is four COMPUTEs, one per shift; three samples in one batch, then the last
    alone (`check_bit_exact`). The model input keeps all 16 bits, so its reader's weights take
    what the accumulator leaves."""
    make, names = MODELS[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizeWarning)
        built = build(make(), _both(kind), preset)
    qgraph = built.qgraph
    assert qgraph.values["x/q"].type.dtype == qgraph.values[INNER[kind]].type.dtype == "int16"
    for node in qgraph.nodes:
        if node.name in names:
            assert qgraph.values[node.inputs[1]].type.dtype == "int16"
    computes = [i for i in built.compiled.program.instructions if i.op is isa.COMPUTE]
    by_shift = {s: sum(i.args["shift"] == s for i in computes) for s in WIDE_PASSES}
    assert set(by_shift) == {0, 7, 8, 15} and len(set(by_shift.values())) == 1
    assert 4 * by_shift[15] == len(computes)
    check_bit_exact(qgraph, built.compiled, samples(make(), 3, 1))


def test_the_node_whose_input_is_int16_takes_int16_weights_too() -> None:
    """What was refused (`--int16 r --int16-weights c2`) runs: 'r' and c2's weights share the
    accumulator's bits, as equally as it allows (`wide_weights.input_bits`), each warning how
    many it has."""
    make, _ = MODELS["conv"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = build(make(), QuantOptions(int16_tensors=("r",), int16_weights=("c2",)))
    said = " / ".join(str(w.message) for w in caught if isinstance(w.message, QuantizeWarning))
    found = re.search(r"int16 tensor 'r': ([0-9]+)-bit codes.*int16 weights of node 'c2' "
                      r"\(Conv\): ([0-9]+)-bit codes against its ([0-9]+)-bit int16 input", said)
    assert found, said
    x_bits, w_bits, against = (int(g) for g in found.groups())
    assert x_bits == against and abs(x_bits - w_bits) <= 1 and w_bits >= 9
    assert built.qgraph.values["r"].type.dtype == "int16"
    check_bit_exact(built.qgraph, built.compiled, samples(make(), 2, 2))


@pytest.mark.parametrize("kind, attrs, weight, out_hw", CONV_FORMS)
def test_every_convolution_form_is_bit_exact(kind, attrs, weight, out_hw) -> None:
    """Grouped and depthwise (block-diagonal tiles), strided with uneven padding (the low
    plane's padding is the code of 0's low byte), dilated, and a 1x1 (whole channel blocks,
    both planes), on every preset."""
    proto = conv_form(attrs, weight, out_hw)
    options = QuantOptions(int16_tensors=("mid",), int16_weights=("c2",))
    for preset in PRESETS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", QuantizeWarning)
            built = build(proto, options, preset)
        assert _layer(built, "c2").x_plane and _layer(built, "c2").weight_passes == 2
        check_bit_exact(built.qgraph, built.compiled, samples(proto, 2, 1))


def single(kind: str):
    """One layer reading the model input: a strided, padded Conv 3x3 of an RGB image (a stem),
    a Gemm or a MatMul, its output the model's."""
    rng = np.random.default_rng(11)
    if kind == "conv":
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="n", strides=[2, 2],
                                  pads=[1, 1, 1, 1])]
        return model(nodes, {"x": [2, 3, 16, 16]}, {"y": [2, 16, 8, 8]},
                     {"w": rng.normal(0, .3, (16, 3, 3, 3)).astype(np.float32),
                      "b": rng.normal(0, .1, 16).astype(np.float32)})
    if kind == "gemm":
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="n", transB=1)]
        return model(nodes, {"x": [6, 48]}, {"y": [6, 24]},
                     {"w": rng.normal(0, .3, (24, 48)).astype(np.float32),
                      "b": rng.normal(0, .1, 24).astype(np.float32)})
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="n")]
    return model(nodes, {"x": [2, 5, 48]}, {"y": [2, 5, 24]},
                 {"w": rng.normal(0, .3, (48, 24)).astype(np.float32)})


@pytest.mark.parametrize("kind", ["conv", "gemm", "matmul"])
def test_the_output_is_closer_to_fp32_than_with_either_widened_alone(kind: str) -> None:
    """The node's int16 output (so that its own codes do not hide the difference) against
    fp32: with the input int16 alone its int8 weights bound it, with the weights int16 alone
    its int8 input does; both widened, each gives up a few bits to the shared accumulator and
    the output is over 10 dB closer than either. Over the calibration samples: others clip at
    the calibrated ranges, an error neither widening changes."""
    proto = single(kind)
    graph, feeds = optimized_graph(proto), samples(proto, 8, 0)

    def sqnr(tensors, weights) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", QuantizeWarning)
            qgraph = build(proto, QuantOptions(int16_tensors=tensors,
                                               int16_weights=weights)).qgraph
        return value_sqnr_db(graph, qgraph, "y", feeds, stored=False, coded="y/q")

    narrow = sqnr(("y",), ())
    inputs = sqnr(("x", "y"), ())
    weights = sqnr(("y",), ("n",))
    both = sqnr(("x", "y"), ("n",))
    assert min(inputs, weights) > narrow
    assert both > max(inputs, weights) + 10


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kind", ["conv", "gemm", "matmul"])
def test_the_node_takes_four_times_the_array_time_as_the_cost_model_says(kind, preset):
    """Each tap is four passes: the node's COMPUTE cycles are four times the int8 program's
    and twice either widened alone's (the tiler picks the same tiles: an int16 RGB stem packs
    kernel columns into K as the int8 one does, `test_int16_taps`), and equal the
    tiler's cost model (`conv_array_cycles`, which counts 2 planes x 2 weight parts); the
    simulator's busy time on the array is the instructions' own cycles."""
    proto = single(kind)
    arch = Arch.load(preset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizeWarning)
        both = build(proto, QuantOptions(int16_tensors=("x",), int16_weights=("n",)), preset)
        alone = [build(proto, options, preset) for options in (
            QuantOptions(), QuantOptions(int16_tensors=("x",)),
            QuantOptions(int16_weights=("n",)))]
    cycles = compute_cycles(both.compiled.program, "n")
    layer = _layer(both, "n")
    assert layer.x_plane and layer.weight_passes == 2
    t = tile(layer, arch, packable=True)  # it alone reads the model input
    (oh, ow), (th, tw) = layer.out_hw, t.tile_hw
    if oh % th == 0 and ow % tw == 0:  # the model prices every tile as the first
        assert cycles == conv_array_cycles(layer, t, arch)
    for factor, other in zip((4, 2, 2), alone):
        other_tiles = tile(_layer(other, "n"), arch, packable=True)
        assert (other_tiles.tile_hw, other_tiles.packed_taps) == (t.tile_hw, t.packed_taps)
        assert cycles == factor * compute_cycles(other.compiled.program, "n")
    result = assert_busy_is_own_cycles(both.compiled.program, "n", "array", "compute")
    assert result.stats.macs == both.compiled.summary.array_macs


def _replay_checking_partial_sums(program, inputs: dict, monkeypatch) -> dict:
    """Run `program` one instruction at a time in program order (no plan, no fused chains),
    every array pass checked: the accumulator before it plus its shifted product, in int64,
    must lie inside int32 (no wrap ever happens). Returns the outputs."""
    original = numerics.array_pass
    low, high = numerics.RANGES["int32"]
    passes = []

    def checked(acc, x, w, shift=0):
        exact = np.matmul(np.asarray(x, np.int64), np.asarray(w, np.int64)) << shift
        if acc is not None:
            exact = exact + np.asarray(acc, np.int64)
        assert low <= exact.min() and exact.max() <= high, f"pass of shift {shift} wraps"
        passes.append(shift)
        return original(acc, x, w, shift)

    monkeypatch.setattr(numerics, "array_pass", checked)
    size = machine.Machine(program).dram_bytes
    state = State(program.arch, 1, size)
    image = np.frombuffer(program.dram_image, np.uint8)[:size]
    state.dram[:, :len(image)] = image
    for binding in program.inputs:
        state.write(binding, inputs[binding.name][None])
    for insn in program.instructions:
        insn.op.run(state, insn)
    monkeypatch.setattr(numerics, "array_pass", original)
    assert set(passes) == WIDE_PASSES
    return {binding.name: state.read(binding)[0] for binding in program.outputs}


def test_worst_case_codes_leave_no_partial_sum_outside_int32(monkeypatch) -> None:
    """K = 128 weights of +-0.01 (every code its largest) against the int16 model input: the
    weights narrow to the most bits whose `pass_bound` (A sum P(w) + |bias|, A = 2^15 + 255)
    fits int32, one more would not. Input codes at the clamp by the weights' signs (every
    accumulator at its largest, then its least) and codes whose planes are both largest
    (-2^15 + 255: high plane -128, low byte 255) run bit-exactly through the machine, and
    replayed pass by pass, no accumulator ever holds more than int32; nor does any partial
    sum of the four passes' terms in the plan's order (one product per shift)."""
    proto, signs = signed_gemm(128, bias=1e-4)
    options = QuantOptions(int16_tensors=("x",), int16_weights=("g",))
    with pytest.warns(QuantizeWarning, match="int16 weights of node 'g' \\(Gemm\\): "
                                             "([0-9]+)-bit codes against its 16-bit"):
        built = build(proto, options)
    qgraph = built.qgraph
    node = next(node for node in qgraph.nodes if node.name == "g")
    codes = qgraph.values[node.inputs[1]].const
    bias = qgraph.values[node.inputs[2]].const.astype(np.int64)
    qmax = int(np.abs(codes).max())
    bits = int(np.log2(qmax + 1)) + 1
    assert qmax == 2**(bits - 1) - 1 and 9 <= bits < 15
    attrs = int8_attrs(node)
    weight = OPS["Gemm"].weight
    assert pass_bound(weight, attrs, codes, numerics.RANGES["int16"], bias).max() <= 2**31 - 1
    wider = codes.astype(np.int64) * (2 * qmax + 1) // qmax  # one more bit, the same signs
    assert pass_bound(weight, attrs, wider, numerics.RANGES["int16"], 2 * bias).max() > 2**31 - 1
    scale = qgraph.values["x/q"].type.quant.scale[0]
    extreme = [{"x": np.repeat(s * signs[None, :] * 1000, 3, axis=0).astype(np.float32)}
               for s in (1.0, -1.0)]
    planes = np.where(signs > 0, -2**15 + 255, 2**15 - 1)  # P(x) at its largest, 2^15 + 255
    extreme.append({"x": np.repeat(planes[None, :] * scale, 3, axis=0).astype(np.float32)})
    for sample in extreme:
        x = run_int8(qgraph, sample, keep_all=True)["x/q"].astype(np.int64)
        total = x @ codes.astype(np.int64) + bias
        assert np.abs(total).max() > 2**29  # the accumulators near their bound
        # Every term of every pass, summed by shift as the plan's fused chains do: each prefix
        # of those group sums (in any order of the groups) inside int32.
        high_x, low_x = x >> 8, x & 255
        high_w, low_w = (p.astype(np.int64) for p in numerics.split_weight(codes))
        parts = {15: high_x @ high_w << 15, 7: low_x @ high_w << 7, 8: high_x @ low_w << 8,
                 0: low_x @ low_w}
        assert np.array_equal(sum(parts.values()), x @ codes.astype(np.int64))
        for order in ((15, 7, 8, 0), (0, 8, 7, 15), (15, 8, 7, 0)):
            running = bias.copy()
            for shift in order:
                running = running + parts[shift]
                assert np.abs(running).max() <= 2**31 - 1
        got = _replay_checking_partial_sums(
            built.compiled.program, {"x": x.astype(np.int16)}, monkeypatch)
        assert np.array_equal(got["y"], run_int8(qgraph, sample, keep_all=True)["y/q"])
    check_bit_exact(qgraph, built.compiled, extreme)


def test_an_inner_tensor_shares_the_bits_with_its_readers_weights() -> None:
    """K = 4096 weights of +-0.01 behind an inner int16 tensor: at 16 bits its reader's
    weights would keep fewer than 9 bits; the joint choice gives the two as equal bits as the
    accumulator holds (warnings say how many) and the weights take what is left exactly;
    inputs far past the calibrated range (every code at the clamp) still run bit-exactly."""
    proto = wide_gemm(4096)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = build(proto, QuantOptions(int16_tensors=("mid",), int16_weights=("g2",)))
    said = " / ".join(str(w.message) for w in caught if isinstance(w.message, QuantizeWarning))
    assert "int16 tensor 'mid': " in said and "int16 weights of node 'g2'" in said
    qgraph = built.qgraph
    producer = next(node for node in qgraph.nodes if node.outputs[0] == "mid")
    x_bits = int(np.log2(-producer.attrs["qclamp"][0])) + 1
    codes = qgraph.values["w2"].const
    w_bits = int(np.log2(np.abs(codes).max() + 1)) + 1
    assert 9 <= x_bits < 16 and w_bits >= 9 and abs(x_bits - w_bits) <= 1
    extreme = [{"x": s["x"] * 1000} for s in samples(proto, 2, 3)]
    mid = run_int8(qgraph, extreme[0], keep_all=True)["mid"]
    assert mid.min() == -2**(x_bits - 1) and mid.max() == 2**(x_bits - 1) - 1
    check_bit_exact(qgraph, built.compiled, extreme)


def test_too_few_bits_for_both_are_refused() -> None:
    """The int16 model input keeps its 16 bits: K = 4096 leaves its reader's weights fewer than
    9. An inner tensor of K = 2^17 terms leaves fewer than 9 bits to each however split."""
    proto, _ = signed_gemm(4096)
    with pytest.raises(QuantizeError, match="int16 weights of node 'g' \\(Gemm\\): its int32 "
                                            "accumulators hold only [0-9]-bit weight codes "
                                            "against its 16-bit int16 input"):
        build(proto, QuantOptions(int16_tensors=("x",), int16_weights=("g",)))
    with pytest.raises(QuantizeError, match="int16 tensor 'mid' and the int16 weights of "
                                            "'g2': their int32 accumulators hold fewer than 9 "
                                            "bits of input codes times 9 of weight codes"):
        build(wide_gemm(2**17), QuantOptions(int16_tensors=("mid",), int16_weights=("g2",)))


def test_the_qdq_export_runs_both_in_onnxruntime(tmp_path) -> None:
    """int16 activations and int16 weights on one node export at opset 21 (DequantizeLinear of
    int16 both): onnxruntime runs it, within one output code of the integer reference."""
    make, _ = MODELS["conv"]
    proto = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizeWarning)
        qgraph = build(proto, _both("conv")).qgraph
    assert_export_within_a_step(proto, qgraph, tmp_path)


def _stem(bias_mean: float):
    """x (RGB) -> Conv 3x3 (8 channels) -> y: small weights with BatchNorm-sized biases, as a
    folded stem has them (PicoDet's: weights of 0.04 to 0.4, biases of 2)."""
    rng = np.random.default_rng(5)
    inits = {"w": rng.normal(0, 0.05, (8, 3, 3, 3)),
             "b": rng.normal(bias_mean, 0.5, 8)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="c", pads=[1, 1, 1, 1])]
    return model(nodes, {"x": [2, 3, 10, 10]}, {"y": [2, 8, 10, 10]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def test_a_large_bias_does_not_coarsen_int16_weights() -> None:
    """Against an int16 input the accumulator's step is so fine that an int8 layer's bias
    limit (2^24 codes) floored every channel of a folded stem to a few bits, warned as
    "negligible" weights (PicoDet's stem: 52 dB where its codes hold 69). The bias takes the
    room the products leave: no channel floored, the codes as wide as the bits the
    accumulator allows, the output as close to fp32 as with a zero bias, bit-exact."""
    sqnr = {}
    for mean in (0.0, 2.0):
        proto = _stem(mean)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            built = build(proto, QuantOptions(int16_tensors=("x", "y"), int16_weights=("c",)))
        said = " / ".join(str(w.message) for w in caught)
        assert "negligible" not in said, said
        qgraph = built.qgraph
        node = next(node for node in qgraph.nodes if node.name == "c")
        codes = np.abs(qgraph.values[node.inputs[1]].const.astype(np.int64))
        bits = int(np.log2(codes.max() + 1)) + 1
        assert bits >= 12 and (codes.reshape(8, -1).max(axis=1) >= 2**(bits - 2)).all()
        feeds = samples(proto, 8, 0)  # the calibration samples: nothing clips
        sqnr[mean] = value_sqnr_db(optimized_graph(proto), qgraph, "y", feeds, stored=False,
                                   coded="y/q")
        check_bit_exact(qgraph, built.compiled, feeds[:3])
    assert sqnr[2.0] > 70 and sqnr[2.0] > sqnr[0.0] - 6, sqnr
