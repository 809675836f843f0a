"""ConvTranspose on the accelerator: one stride-1 convolution per output phase, each writing a
strided View of the output (or of the Concat that reads it), with no zeros in DRAM, bit-exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import helper

from compiler.backend.layers import ConvLayer
from compiler.backend.lower import lower
from compiler.errors import CompileError
from compiler.graph.evaluate import evaluate
from compiler.graph.reference import conv_transpose_pads
from ember.flow import optimized_graph
from ember.reports.metrics import ErrorStats
from quantizer.reference import run_int8
from tests.cli import assert_one_line_error, invoke
from tests.e2e.flow import compile_and_check, quantized, samples
from tests.onnx_builder import model, weights


def decoder(size=(5, 6), kernel=(3, 3), group=1, bias=True, seed=0, **attrs):
    """x → Conv → ConvTranspose(attrs) → Relu: a decoder's upsampling step."""
    rng = np.random.default_rng(seed)
    channels, out_channels = 4, 2 * group
    shape = conv_transpose_pads(size, kernel, attrs.get("strides"), attrs.get("dilations"),
                                attrs.get("pads"), attrs.get("output_padding"),
                                attrs.get("output_shape"), attrs.get("auto_pad", "NOTSET"))[1]
    inits = {"w": weights(rng, channels, 3, 3, 3), "b": weights(rng, channels),
             "wt": weights(rng, channels, out_channels // group, *kernel)}
    inputs = ["c", "wt"]
    if bias:
        inits["bt"] = weights(rng, out_channels)
        inputs.append("bt")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("ConvTranspose", inputs, ["t"], name="up", group=group, **attrs),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    return model(nodes, {"x": [1, 3, *size]}, {"y": [1, out_channels, *shape]}, inits)


CASES = {
    "stride1": dict(pads=[1, 1, 1, 1]),
    "stride2-kernel4": dict(kernel=(4, 4), strides=[2, 2], pads=[1, 1, 1, 1]),
    "stride2-kernel3-output-padding": dict(strides=[2, 2], pads=[1, 1, 1, 1],
                                           output_padding=[1, 1]),
    "stride3-kernel2-no-bias": dict(kernel=(2, 2), strides=[3, 3], bias=False),
    "strides-3-2-dilations": dict(kernel=(2, 3), strides=[3, 2], dilations=[2, 1],
                                  pads=[0, 2, 1, 0]),
    "stride2-groups": dict(group=2, strides=[2, 2], pads=[0, 1, 1, 0]),
    "stride2-depthwise": dict(group=4, kernel=(4, 4), strides=[2, 2], pads=[1, 1, 1, 1]),
    "stride2-same-upper": dict(strides=[2, 2], auto_pad="SAME_UPPER"),
    "stride2-output-shape": dict(strides=[2, 2], output_shape=[10, 12]),
}


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("name", list(CASES))
def test_conv_transpose_runs_on_the_accelerator(preset, name) -> None:
    compiled, _ = compile_and_check(decoder(**CASES[name]), preset)
    assert compiled.program.host_segments == ()


@settings(derandomize=True, max_examples=25, deadline=None)
@given(st.data())
def test_conv_transpose_over_attributes_is_bit_exact(data) -> None:
    """Any 2-D stride, kernel, dilation, pads, output_padding and groups: every phase (those
    without taps too, and those whose pads crop the input) matches the integer reference."""
    def pair(lo, hi):
        return [data.draw(st.integers(lo, hi)) for _ in range(2)]
    kernel, strides, dilations = pair(1, 4), pair(1, 3), pair(1, 2)
    pads = pair(0, 3) + pair(0, 3)
    adjust = [data.draw(st.integers(0, s - 1)) for s in strides]
    size = tuple(pair(1, 5))
    out = conv_transpose_pads(size, kernel, strides, dilations, pads, adjust)[1]
    assume(min(out) >= 1)
    proto = decoder(size, tuple(kernel), group=data.draw(st.sampled_from([1, 2, 4])),
                    bias=data.draw(st.booleans()), strides=strides, dilations=dilations,
                    pads=pads, output_padding=adjust)
    compiled, _ = compile_and_check(proto, "edge", count=1)
    assert compiled.program.host_segments == ()


def test_a_unet_decoder_block_writes_its_part_of_the_concat_in_place() -> None:
    """Conv → ConvTranspose stride 2 → Concat with a skip → Conv: the phases write straight
    into the Concat's buffer (no copy layer of the ConvTranspose's output)."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1], name="enc"),
             helper.make_node("ConvTranspose", ["c", "wt", "bt"], ["t"], strides=[2, 2],
                              pads=[1, 1, 1, 1], name="up"),
             helper.make_node("Concat", ["t", "skip"], ["u"], axis=1, name="cat"),
             helper.make_node("Conv", ["u", "w2", "b2"], ["y"], pads=[1, 1, 1, 1], name="dec")]
    proto = model(nodes, {"x": [1, 4, 6, 6], "skip": [1, 3, 12, 12]}, {"y": [1, 4, 12, 12]},
                  {"w1": weights(rng, 8, 4, 3, 3), "b1": weights(rng, 8),
                   "wt": weights(rng, 8, 5, 4, 4), "bt": weights(rng, 5),
                   "w2": weights(rng, 4, 8, 3, 3), "b2": weights(rng, 4)})
    compiled, _ = compile_and_check(proto, "edge")
    assert compiled.program.host_segments == ()
    layers = lower(quantized(proto, samples({"x": [1, 4, 6, 6], "skip": [1, 3, 12, 12]}, 4)))
    phases = [layer for layer in layers.layers if layer.node == "up"]
    assert len(phases) == 4 and all(isinstance(layer, ConvLayer) for layer in phases)
    assert {layer.y for layer in phases} == {"u"}  # the Concat's buffer, rows and columns
    assert {layer.y_view.strides for layer in phases} == {(12 * 12 * 8, 2 * 12 * 8, 2 * 8)}
    copies = [layer.x for layer in layers.layers if layer.node == "cat"]
    assert copies == ["skip/q"]  # only the model input is copied into the Concat


def test_a_3d_conv_transpose_is_named_and_runs_on_the_host() -> None:
    rng = np.random.default_rng(2)
    proto = model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2, 2],
                                    name="up3d")],
                  {"x": [1, 2, 3, 3, 3]}, {"y": [1, 2, 7, 7, 7]}, {"w": weights(rng, 2, 2, 3, 3, 3)})
    qgraph = quantized(proto, samples({"x": [1, 2, 3, 3, 3]}, 4))
    with pytest.raises(CompileError, match=r"'up3d' \(ConvTranspose\): kernel_shape \[3, 3, 3\] "
                                           r"has 3 spatial axes; only 2-D ConvTranspose lowers"):
        lower(qgraph)
    assert any(layer.__class__.__name__ == "HostLayer"
               for layer in lower(qgraph, allow_host=True).layers)


def test_compiling_a_3d_conv_transpose_is_one_line_naming_it(tmp_path) -> None:
    rng = np.random.default_rng(2)
    proto = model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2, 2],
                                    name="up3d")],
                  {"x": [1, 2, 3, 3, 3]}, {"y": [1, 2, 7, 7, 7]}, {"w": weights(rng, 2, 2, 3, 3, 3)})
    path = tmp_path / "up3d.onnx"
    path.write_bytes(proto.SerializeToString())
    assert invoke("quantize-profile", path, "--random", "2", "-o", tmp_path / "p.json") \
        .exit_code == 0
    result = invoke("compile", path, "--profile", tmp_path / "p.json", "-o", tmp_path / "m.ember")
    assert_one_line_error(result, "node 'up3d' (ConvTranspose)", "only 2-D ConvTranspose lowers")
    assert not (tmp_path / "m.ember").exists()


@pytest.mark.parametrize("name", ["stride2-groups", "stride2-depthwise"])
def test_a_grouped_conv_transpose_is_quantized_per_output_channel(name) -> None:
    """One weight scale per output channel, each from the channel's own weights (the weight
    made block-diagonal, one group: `compiler.passes.ungroup_conv_transpose`); the array still
    does, and counts, only its groups' multiply-accumulates."""
    case = dict(CASES[name])
    group = case["group"]
    proto = decoder(**case)
    qgraph = quantized(proto, samples({"x": [1, 3, 5, 6]}, 4))
    up = next(node for node in qgraph.nodes if node.name == "up")
    weight = qgraph.values[up.inputs[1]]
    assert weight.type.quant.axis == 1 and len(weight.type.quant.scale) == 2 * group
    assert np.all(np.abs(weight.const).max(axis=(0, 2, 3)) == 127)  # each channel's own range
    phases = [layer for layer in lower(qgraph).layers if layer.node == "up"]
    channel_pairs = 2 * group * (4 // group)  # each output channel reads its group's inputs
    assert all(layer.macs == int(np.prod(layer.out_hw)) * channel_pairs * int(np.prod(
        layer.kernel)) for layer in phases)


def test_a_depthwise_conv_transpose_follows_fp32() -> None:
    proto = decoder(**CASES["stride2-depthwise"])
    graph = optimized_graph(proto)
    qgraph = quantized(proto, samples({"x": [1, 3, 5, 6]}, 16))
    error = ErrorStats()
    for feed in samples({"x": [1, 3, 5, 6]}, 4, seed=3):
        error.add(evaluate(graph, feed)["y"], run_int8(qgraph, feed)["y"])
    assert error.sqnr_db > 25.0, error.sqnr_db
