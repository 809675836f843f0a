"""Lowering (`compiler.backend.lower.lower`): a tiny quantized graph (Before) against the
layers, tensors, views and bindings it must become (Expected). Each layer is compared by its
kind, its node, what it reads and writes, and the shape facts tiling and codegen rely on."""

from __future__ import annotations

import numpy as np
from onnx import helper

from compiler.backend.layers import Binding, Layout, Lowered, Tensor, View
from compiler.backend.lower import lower
from tests.compiler.tiny import quantize_model
from tests.onnx_builder import model, weights

# The facts compared per layer kind, beside its kind, node, inputs and output.
_SHAPE = {"ConvLayer": ("in_hw", "out_hw", "in_channels", "out_channels", "kernel", "pads",
                        "y_view"),
          "PoolLayer": ("in_hw", "out_hw", "channels", "kernel", "strides", "pad_value"),
          "LutLayer": ("size", "views")}


def _facts(lowered: Lowered) -> list[tuple]:
    out = []
    for layer in lowered.layers:
        kind = type(layer).__name__
        out.append((kind, layer.node, layer.x, layer.y,
                    {name: getattr(layer, name) for name in _SHAPE[kind]}))
    return out


def conv_relu_flatten_gemm():
    """Before: x (1x3x4x4) → Conv 3x3 pad 1 (6 channels) → Relu → Flatten → Gemm (5)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="conv", pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], name="fc", transB=1)]
    return model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 5]},
                 {"w1": weights(rng, 6, 3, 3, 3), "b1": weights(rng, 6),
                  "w2": weights(rng, 5, 96), "b2": weights(rng, 5)})


def test_conv_and_gemm_become_array_layers_and_flatten_a_view() -> None:
    """Expected: two convolutions on the array (the Relu fused into the first's clamp, the
    Gemm a 1x1 convolution over 96 channels), no layer for the Flatten, only a view of the
    Conv's buffer; three DRAM tensors, channels-last (so the input binding's strides are
    NHWC's); the host's QuantizeLinear and DequantizeLinear are the bindings."""
    qgraph = quantize_model(conv_relu_flatten_gemm())
    lowered = lower(qgraph)
    assert _facts(lowered) == [
        ("ConvLayer", "conv", "x/q", "r", dict(in_hw=(4, 4), out_hw=(4, 4), in_channels=3,
                                               out_channels=6, kernel=(3, 3),
                                               pads=(1, 1, 1, 1), y_view=None)),
        ("ConvLayer", "fc", "r", "y/q", dict(in_hw=(1, 1), out_hw=(1, 1), in_channels=96,
                                             out_channels=5, kernel=(1, 1),
                                             pads=(0, 0, 0, 0), y_view=None)),
    ]
    assert lowered.views == {"f": "r"}
    assert lowered.tensors == {"x/q": Tensor("x/q", 48), "r": Tensor("r", 96),
                               "y/q": Tensor("y/q", 5)}
    x_q = qgraph.node("x/QuantizeLinear")
    scale, zero_point = (qgraph.values[name].const for name in x_q.inputs[1:])
    assert lowered.inputs == (Binding("x", "x/q", (1, 3, 4, 4), float(scale),
                                      int(zero_point), strides=(48, 1, 12, 3)),)
    assert [(b.name, b.tensor, b.strides) for b in lowered.outputs] == [("y", "y/q", (5, 1))]


def test_gemm_permutes_its_weight_rows_to_read_the_flattened_map_channels_last() -> None:
    """Expected: the Gemm's int8 weights (5 x 96, columns in the Flatten's C, H, W order) as
    the layer's weights in the order its input's bytes are in: H, W, C. The Conv's weights
    are the quantized node's own, and the fused Relu is its clamp at the output zero point."""
    qgraph = quantize_model(conv_relu_flatten_gemm())
    conv, fc = lower(qgraph).layers
    gemm_weights = qgraph.values[qgraph.node("fc").inputs[1]].const
    hwc = Layout.channels_last((1, 6, 4, 4)).order()  # physical byte → logical (C, H, W) index
    np.testing.assert_array_equal(fc.weights[:, :, 0, 0], gemm_weights[:, hwc])
    np.testing.assert_array_equal(conv.weights, qgraph.values["w1"].const)
    assert conv.qclamp == (conv.out_zero_point, 127)  # the fused Relu: nothing below real 0


def two_convs_concat_pool_sigmoid():
    """Before: x → 1x1 Conv (4) and 1x1 Conv (3) → Concat on channels → MaxPool 2x2/2 →
    Sigmoid."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b"),
             helper.make_node("Concat", ["a", "b"], ["c"], name="cat", axis=1),
             helper.make_node("MaxPool", ["c"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Sigmoid", ["p"], ["y"], name="sig")]
    return model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 7, 2, 2]},
                 {"wa": weights(rng, 4, 3, 1, 1), "wb": weights(rng, 3, 3, 1, 1)})


def test_concat_inputs_are_written_in_place_and_sigmoid_is_a_table() -> None:
    """Expected: no layer for the Concat: each convolution writes its channels straight into
    the Concat's one buffer (a view: 7 channels a pixel, conv_b's from channel 4), which the
    pool reads whole (padding with the int8 minimum: max pooling ignores it); the Sigmoid is
    a LUT layer whose table is the quantized node's own."""
    qgraph = quantize_model(two_convs_concat_pool_sigmoid())
    lowered = lower(qgraph)
    pixels = (1 * 4 * 4 * 7, 4 * 7, 7)
    assert _facts(lowered) == [
        ("ConvLayer", "conv_a", "x/q", "c", dict(in_hw=(4, 4), out_hw=(4, 4), in_channels=3,
                                                 out_channels=4, kernel=(1, 1),
                                                 pads=(0, 0, 0, 0),
                                                 y_view=View((1, 4, 4, 4), 0, pixels))),
        ("ConvLayer", "conv_b", "x/q", "c", dict(in_hw=(4, 4), out_hw=(4, 4), in_channels=3,
                                                 out_channels=3, kernel=(1, 1),
                                                 pads=(0, 0, 0, 0),
                                                 y_view=View((1, 4, 4, 3), 4, pixels))),
        ("PoolLayer", "pool", "c", "p", dict(in_hw=(4, 4), out_hw=(2, 2), channels=7,
                                             kernel=(2, 2), strides=(2, 2), pad_value=-128)),
        ("LutLayer", "sig", "p", "y/q", dict(size=28, views=None)),
    ]
    assert lowered.views == {"a": "c", "b": "c"}
    assert set(lowered.tensors) == {"x/q", "c", "p", "y/q"}
    np.testing.assert_array_equal(lowered.layers[-1].table, qgraph.values["sig/table"].const)
