"""Small hand-built ONNX models that exercise every lowering: odd sizes (not multiples of the
array), tiling on every dimension on the edge preset, strides, dilations, groups, residuals."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

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


def jax_layer_norm(nodes: list, inits: dict, x: str, shape: tuple[int, ...], axis: int,
                   prefix: str, rng) -> str:
    """A LayerNorm over `axis` as JAX writes it through tf2onnx (Magika's): the sums of x and
    x² over the axis (keepdims 0) times 1/n, the variance as Max(0, E[x²] - E[x]²), each
    statistic reshaped back, + eps, Sqrt then Reciprocal, times gamma, (x - mean) times that,
    + beta; gamma and beta laid along the axis. Returns the output's name."""
    n = helper.make_node
    kept = list(shape)
    kept[axis] = 1
    reduced = [d for i, d in enumerate(shape) if i != axis]
    along = [1] * len(shape)
    along[axis] = shape[axis]
    p = prefix
    inits.update({f"{p}/axes": np.array([axis], np.int64),
                  f"{p}/inv_n": np.float32(1.0 / shape[axis]), f"{p}/zero": np.float32(0.0),
                  f"{p}/eps": np.float32(1e-6), f"{p}/kept": np.array(kept, np.int64),
                  f"{p}/gamma": rng.uniform(0.5, 1.5, along).astype(np.float32),
                  f"{p}/beta": rng.normal(0, 0.2, along).astype(np.float32)})
    nodes += [n("ReduceSum", [x, f"{p}/axes"], [f"{p}/sum"], keepdims=0),
              n("Mul", [x, x], [f"{p}/square"]),
              n("ReduceSum", [f"{p}/square", f"{p}/axes"], [f"{p}/sum2"], keepdims=0),
              n("Mul", [f"{p}/sum2", f"{p}/inv_n"], [f"{p}/mean2"]),
              n("Mul", [f"{p}/sum", f"{p}/inv_n"], [f"{p}/mean"]),
              n("Mul", [f"{p}/mean", f"{p}/mean"], [f"{p}/mean_sq"]),
              n("Sub", [f"{p}/mean2", f"{p}/mean_sq"], [f"{p}/var0"]),
              n("Max", [f"{p}/zero", f"{p}/var0"], [f"{p}/var"]),
              n("Reshape", [f"{p}/var", f"{p}/kept"], [f"{p}/var_kept"]),
              n("Add", [f"{p}/var_kept", f"{p}/eps"], [f"{p}/var_eps"]),
              n("Sqrt", [f"{p}/var_eps"], [f"{p}/root"]),
              n("Reciprocal", [f"{p}/root"], [f"{p}/inv"]),
              n("Mul", [f"{p}/inv", f"{p}/gamma"], [f"{p}/scale"]),
              n("Reshape", [f"{p}/mean", f"{p}/kept"], [f"{p}/mean_kept"]),
              n("Sub", [x, f"{p}/mean_kept"], [f"{p}/centred"]),
              n("Mul", [f"{p}/centred", f"{p}/scale"], [f"{p}/scaled"]),
              n("Add", [f"{p}/scaled", f"{p}/beta"], [f"{p}/y"])]
    assert reduced  # the statistics' shape: x's without the axis
    return f"{p}/y"


def jax_softmax(nodes: list, inits: dict, x: str, shape: tuple[int, ...], prefix: str) -> str:
    """Softmax over the last axis as JAX writes it: ReduceMax (keepdims 0), Max with -inf,
    reshaped back, Sub, Exp, ReduceSum (keepdims 0), reshaped back, Div."""
    n = helper.make_node
    p = prefix
    kept = [*shape[:-1], 1]
    inits.update({f"{p}/axes": np.array([len(shape) - 1], np.int64),
                  f"{p}/floor": np.float32(-np.inf), f"{p}/kept": np.array(kept, np.int64)})
    nodes += [n("ReduceMax", [x], [f"{p}/max"], axes=[len(shape) - 1], keepdims=0),
              n("Max", [f"{p}/floor", f"{p}/max"], [f"{p}/peak"]),
              n("Reshape", [f"{p}/peak", f"{p}/kept"], [f"{p}/peak_kept"]),
              n("Sub", [x, f"{p}/peak_kept"], [f"{p}/shifted"]),
              n("Exp", [f"{p}/shifted"], [f"{p}/e"]),
              n("ReduceSum", [f"{p}/e", f"{p}/axes"], [f"{p}/total"], keepdims=0),
              n("Reshape", [f"{p}/total", f"{p}/kept"], [f"{p}/total_kept"]),
              n("Div", [f"{p}/e", f"{p}/total_kept"], [f"{p}/y"])]
    return f"{p}/y"


def byte_classifier(length: int = 64, dim: int = 8, group: int = 4, channels: int = 24,
                    classes: int = 10, seed: int = 3):
    """A file-type classifier as Magika's JAX model exports through tf2onnx, small: int32
    bytes [1, length] (256 the padding) one-hot encoded against a range of 257 and multiplied
    by a table (+ bias), a tanh GELU written out, grouped into [1, length / group, group * dim],
    a LayerNorm over the positions (axis 1), a [5, 1] convolution over the positions (through
    Unsqueeze and Transpose), its bias, GELU, a global max over positions, a LayerNorm over the
    channels, a dense layer and a softmax, both written out."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    positions, features = length // group, group * dim
    inits = {"one_hot/range": np.arange(257, dtype=np.int32).reshape(1, 1, 257),
             "one_hot/shape": np.array([-1, length, 1], np.int64),
             "dense0/w": _w(rng, 257, dim, scale=0.5), "dense0/b": _w(rng, dim, scale=0.1),
             "gelu/c": np.float32(0.044715), "gelu/k": np.float32(0.7978846),
             "gelu/one": np.float32(1.0), "gelu/half": np.float32(0.5),
             "group/shape": np.array([1, positions, features], np.int64),
             "unsqueeze/axes": np.array([3], np.int64),
             "conv/w": _w(rng, channels, features, 5, 1, scale=features ** -0.5),
             "conv/b": _w(rng, channels, 1, scale=0.1),
             "squeeze/axes": np.array([3], np.int64),
             "pooled/axes": np.array([2], np.int64),
             "dense1/w": _w(rng, channels, classes, scale=channels ** -0.5),
             "dense1/b": _w(rng, classes, scale=0.1)}
    nodes = [n("Reshape", ["bytes", "one_hot/shape"], ["ids"]),
             n("Equal", ["ids", "one_hot/range"], ["hot"]),
             n("Cast", ["hot"], ["one_hot"], to=1),
             n("MatMul", ["one_hot", "dense0/w"], ["embedded"]),
             n("Add", ["embedded", "dense0/b"], ["dense0"])]

    def gelu(x: str, p: str) -> str:
        nodes.extend([n("Mul", ["gelu/c", x], [f"{p}/a"]), n("Mul", [x, f"{p}/a"], [f"{p}/b"]),
                      n("Mul", [x, f"{p}/b"], [f"{p}/cube"]),
                      n("Add", [x, f"{p}/cube"], [f"{p}/inner"]),
                      n("Mul", ["gelu/k", f"{p}/inner"], [f"{p}/t"]),
                      n("Tanh", [f"{p}/t"], [f"{p}/tanh"]),
                      n("Add", ["gelu/one", f"{p}/tanh"], [f"{p}/one_plus"]),
                      n("Mul", ["gelu/half", f"{p}/one_plus"], [f"{p}/half"]),
                      n("Mul", [x, f"{p}/half"], [f"{p}/y"])])
        return f"{p}/y"

    x = gelu("dense0", "gelu0")
    nodes.append(n("Reshape", [x, "group/shape"], ["grouped"]))
    x = jax_layer_norm(nodes, inits, "grouped", (1, positions, features), 1, "norm0", rng)
    out = positions - 4
    nodes += [n("Unsqueeze", [x, "unsqueeze/axes"], ["planes"]),
              n("Transpose", ["planes"], ["channels_first"], perm=[0, 2, 1, 3]),
              n("Conv", ["channels_first", "conv/w"], ["conv"], kernel_shape=[5, 1]),
              n("Squeeze", ["conv", "squeeze/axes"], ["conv1d"]),
              n("Add", ["conv1d", "conv/b"], ["conv_b"])]
    x = gelu("conv_b", "gelu1")
    nodes += [n("GlobalMaxPool", [x], ["pooled3"]),
              n("Squeeze", ["pooled3", "pooled/axes"], ["pooled"])]
    x = jax_layer_norm(nodes, inits, "pooled", (1, channels), 1, "norm1", rng)
    nodes += [n("MatMul", [x, "dense1/w"], ["logits0"]),
              n("Add", ["logits0", "dense1/b"], ["logits"])]
    y = jax_softmax(nodes, inits, "logits", (1, classes), "softmax")
    nodes.append(n("Identity", [y], ["probs"]))
    graph = helper.make_graph(
        nodes, "byte_classifier",
        [helper.make_tensor_value_info("bytes", onnx.TensorProto.INT32, [1, length])],
        [helper.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, [1, classes])],
        [numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    proto.ir_version = 8
    assert out > 0
    return proto


def byte_samples(count: int, seed: int, length: int = 64) -> list[dict]:
    """Byte sequences as Magika reads files: text-like runs, binary noise, padding (256)."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(count):
        kind = int(rng.integers(3))
        row = rng.integers(32, 127, length) if kind == 0 else rng.integers(0, 256, length)
        if kind == 2:
            row[int(rng.integers(length // 2, length)):] = 256
        found.append({"bytes": row.astype(np.int32)[None]})
    return found


# Every form of a Conv the array runs (kind, attributes, weight shape, output H x W) for
# `conv_form`: block-diagonal tiles, strided with uneven padding, dilated, whole channel blocks.
CONV_FORMS = [
    ("grouped", dict(group=4, pads=[1, 1, 1, 1]), (16, 5, 3, 3), (9, 9)),
    ("depthwise", dict(group=20, pads=[1, 1, 1, 1]), (20, 1, 3, 3), (9, 9)),
    ("strided", dict(strides=[2, 2], pads=[1, 0, 2, 1]), (16, 20, 3, 3), (5, 4)),
    ("dilated", dict(dilations=[2, 2], pads=[2, 2, 2, 2]), (16, 20, 3, 3), (9, 9)),
    ("pointwise", dict(), (16, 20, 1, 1), (9, 9)),
]


def conv_form(attrs: dict, weight: tuple[int, ...], out_hw: tuple[int, int], seed: int = 5):
    """x [2, 3, 9, 9] -> Conv c1 (3x3, 20 channels) -> mid -> Conv c2 of one of `CONV_FORMS`
    -> y: the form under test reads an activation of 20 channels."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["mid"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["mid", "w2", "b2"], ["y"], name="c2", **attrs)]
    return model(nodes, {"x": [2, 3, 9, 9]}, {"y": [2, weight[0], *out_hw]},
                 {"w1": rng.normal(0, .3, (20, 3, 3, 3)).astype(np.float32),
                  "w2": rng.normal(0, .1, weight).astype(np.float32),
                  "b2": rng.normal(0, .1, weight[0]).astype(np.float32)})


def wide_table(spread: float = 5.0, seed: int = 0):
    """x [1, 3, 8, 8] → Conv c1 (8 channels, 3x3, weights of deviation `spread`: an output
    range of tens) → pre → HardSwish → act → Conv c2 (1x1, 4 channels) → y. With `pre` and
    `act` int16, the HardSwish is a table of 257 knots over pre's whole range, its bend
    between -3 and 3 spanning a few of them: without its window of finer knots
    (`int8.knot_window`), a kernel whose interpolation errs far beyond its int16 output's
    rounding."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["pre"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["pre"], ["act"], name="hardswish"),
             helper.make_node("Conv", ["act", "w2", "b2"], ["y"], name="c2")]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]},
                 {"w1": _w(rng, 8, 3, 3, 3, scale=spread), "b1": _w(rng, 8, scale=0.2),
                  "w2": _w(rng, 4, 8, 1, 1), "b2": _w(rng, 4, scale=0.1)})


def wide_map_by_constant(op: str, constant_first: bool):
    """x → Conv → HardSwish → c → Add or Sub of a scalar constant 40 (c's range is a few
    units: the constant's scale and the output's are some twenty times c's) → a → Conv → y.
    (The HardSwish keeps the map out of the Conv's bias.)"""
    rng = np.random.default_rng(7)
    operands = ["k", "c"] if constant_first else ["c", "k"]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["h"], ["c"], name="hswish"),
             helper.make_node(op, operands, ["a"], name="map"),
             helper.make_node("Conv", ["a", "w2"], ["y"], name="conv2")]
    return model(nodes, {"x": [1, 3, 6, 5]}, {"y": [1, 4, 6, 5]},
                 {"w1": _w(rng, 6, 3, 3, 3), "w2": _w(rng, 4, 6, 1, 1, scale=0.05),
                  "k": np.array(40.0, np.float32)})


def cancelling_sum():
    """x → Conv (W) → q, int8, and x → Conv (ε N - W) → p, int16: their int16 sum s = p + q
    → Conv → y is some hundred times narrower than q, so s's step is near 2^-12 of q's, where
    TFLite's alignment of an int16 operand's ADD rounded q's term before the sum rounded."""
    rng = np.random.default_rng(8)
    w = _w(rng, 6, 3, 1, 1, scale=2.0)
    nodes = [helper.make_node("Conv", ["x", "wq"], ["q"], name="convq"),
             helper.make_node("Conv", ["x", "wp"], ["p"], name="convp"),
             helper.make_node("Add", ["p", "q"], ["s"], name="add"),
             helper.make_node("Conv", ["s", "w2"], ["y"], name="conv2")]
    return model(nodes, {"x": [1, 3, 6, 5]}, {"y": [1, 4, 6, 5]},
                 {"wq": w, "wp": (_w(rng, 6, 3, 1, 1, scale=0.02) - w).astype(np.float32),
                  "w2": _w(rng, 4, 6, 1, 1)})

