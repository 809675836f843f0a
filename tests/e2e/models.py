"""Small hand-built ONNX models that exercise every lowering: odd sizes (not multiples of the
array), tiling on every dimension on the edge preset, strides, dilations, groups, residuals."""

from __future__ import annotations

import numpy as np
from onnx import helper

from tests.onnx_builder import model
from tests.onnx_builder import weights as _w


def big_conv(seed: int = 0):
    """20 → 21 channels on 19 x 23 pixels, 3x3 pad 1, fused ReLU, then a 3x3/2 max-pool with
    ceil_mode: on edge (8x8 array, 256 accumulator rows) every dimension needs tiling."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[3, 3],
                              strides=[2, 2], ceil_mode=1)]
    return model(nodes, {"x": [1, 20, 19, 23]}, {"y": [1, 21, 9, 11]},
                 {"w": _w(rng, 21, 20, 3, 3, scale=0.1), "b": _w(rng, 21)})


def strided(seed: int = 1):
    """Batch 2, stride 2 with asymmetric pads, a dilated conv, an average pool and a sigmoid."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="down", strides=[2, 2],
                              pads=[0, 1, 2, 1], kernel_shape=[3, 3]),
             helper.make_node("Conv", ["a", "w2", "b2"], ["d"], name="dilated",
                              dilations=[2, 2], pads=[2, 2, 2, 2]),
             helper.make_node("AveragePool", ["d"], ["p"], name="avg", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Sigmoid", ["p"], ["y"], name="sigmoid")]
    return model(nodes, {"x": [2, 3, 17, 14]}, {"y": [2, 9, 4, 3]},
                 {"w1": _w(rng, 11, 3, 3, 3), "w2": _w(rng, 9, 11, 3, 3, scale=0.15),
                  "b2": _w(rng, 9)})


def mobile_block(seed: int = 2):
    """An inverted residual: 1x1 expand (ReLU), 3x3 depthwise (ReLU), 1x1 project, Add, then
    global average pool, flatten and a classifier; a standalone Relu and a Sub on the way."""
    rng = np.random.default_rng(seed)
    c, e = 12, 36
    nodes = [helper.make_node("Conv", ["x", "we", "be"], ["e"], name="expand"),
             helper.make_node("Relu", ["e"], ["er"], name="expand_relu"),
             helper.make_node("Conv", ["er", "wd", "bd"], ["d"], name="depthwise", group=e,
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["d"], ["dr"], name="depthwise_relu"),
             helper.make_node("Conv", ["dr", "wp", "bp"], ["p"], name="project"),
             helper.make_node("Add", ["x", "p"], ["s"], name="residual"),
             helper.make_node("Sub", ["s", "x"], ["t"], name="sub"),
             helper.make_node("GlobalAveragePool", ["t"], ["g"], name="gap"),
             helper.make_node("Relu", ["g"], ["gr"], name="gap_relu"),
             helper.make_node("Flatten", ["gr"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1)]
    return model(nodes, {"x": [1, c, 9, 11]}, {"y": [1, 7]},
                 {"we": _w(rng, e, c, 1, 1), "be": _w(rng, e), "wd": _w(rng, e, 1, 3, 3),
                  "bd": _w(rng, e), "wp": _w(rng, c, e, 1, 1, scale=0.1), "bp": _w(rng, c),
                  "wf": _w(rng, 7, c), "bf": _w(rng, 7)})


def matmul(seed: int = 3):
    """Rows of a 2-D input (M = 5, K = 37) times a constant (37, 19), then Tanh."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Tanh", ["m"], ["y"], name="tanh")]
    return model(nodes, {"x": [5, 37]}, {"y": [5, 19]}, {"w": _w(rng, 37, 19)})


def misc_ops(seed: int = 4):
    """Clip fused into a conv, padded max and average pools (count_include_pad), HardSwish and
    LeakyRelu tables, a global max pool, a Reshape view to 4-D read by a 1x1 conv, a Gemm
    with transB = 0, and a Mul and an Add by scalar constants (LUTs)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["k"], name="clip"),
             helper.make_node("MaxPool", ["k"], ["m"], name="maxpool", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("HardSwish", ["m"], ["h"], name="hardswish"),
             helper.make_node("AveragePool", ["h"], ["a"], name="avgpool", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], count_include_pad=1),
             helper.make_node("LeakyRelu", ["a"], ["l"], name="leaky", alpha=0.1),
             helper.make_node("GlobalMaxPool", ["l"], ["g"], name="gmp"),
             helper.make_node("Reshape", ["g", "shape"], ["r"], name="reshape"),
             helper.make_node("Conv", ["r", "w2"], ["p"], name="pointwise"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "w3"], ["z"], name="fc"),
             helper.make_node("Mul", ["z", "half"], ["u"], name="scale"),
             helper.make_node("Add", ["u", "one"], ["y"], name="shift")]
    return model(nodes, {"x": [1, 5, 6, 7]}, {"y": [1, 4]},
                 {"w1": _w(rng, 10, 5, 3, 3), "b1": _w(rng, 10),
                  "lo": np.float32(-0.5), "hi": np.float32(1.0),
                  "shape": np.array([1, 10, 1, 1], np.int64), "w2": _w(rng, 6, 10, 1, 1),
                  "w3": _w(rng, 6, 4), "half": np.float32(0.5), "one": np.float32(1.0)})


ALL = {"big_conv": big_conv, "strided": strided, "mobile_block": mobile_block,
       "matmul": matmul, "misc_ops": misc_ops}


def chain(seed: int = 0):
    """3x3 conv (ReLU) → 3x3/2 conv → 1x1 conv → 3x3/2 max-pool with padding: the first two
    convolutions and the last conv → pool pair can each keep their tensor on chip (a padded
    window, a strided one whose last input row no output reads, a pool's -128 padding)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["ar"], name="relu1"),
             helper.make_node("Conv", ["ar", "w2", "b2"], ["b"], name="conv2", pads=[1] * 4,
                              strides=[2, 2]),
             helper.make_node("Conv", ["b", "w3", "b3"], ["c"], name="conv3"),
             helper.make_node("MaxPool", ["c"], ["y"], name="pool", kernel_shape=[3, 3],
                              strides=[2, 2], pads=[1] * 4)]
    return model(nodes, {"x": [1, 5, 10, 12]}, {"y": [1, 12, 3, 3]},
                 {"w1": _w(rng, 18, 5, 3, 3), "b1": _w(rng, 18),
                  "w2": _w(rng, 10, 18, 3, 3, scale=0.15), "b2": _w(rng, 10),
                  "w3": _w(rng, 12, 10, 1, 1), "b3": _w(rng, 12)})
