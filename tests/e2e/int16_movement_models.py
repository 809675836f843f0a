"""Small graphs whose int16 activations flow through views, Concats, Transposes, pools,
nearest Resizes and ConvTransposes (`tests/e2e/test_int16_movement.py`)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from tests.onnx_builder import model

N, C, H, W = 2, 12, 8, 8


def _conv(rng, name: str, x: str, y: str, cin: int, cout: int, k: int = 3, scale: float = .3,
          **attrs):
    """A Conv node (padded to keep H and W for odd k) and its initializers."""
    pad = (k - 1) // 2
    node = helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name,
                            pads=[pad] * 4, **attrs)
    return node, {f"{name}_w": (rng.standard_normal((cout, cin, k, k)) * scale
                                / np.sqrt(cin * k * k) * 3).astype(np.float32),
                  f"{name}_b": (rng.standard_normal(cout) * .1).astype(np.float32)}


def _around(middle, out_shape, seed: int, cin: int = C, head_cin: int | None = None):
    """x [N, 3, H, W] -> Conv c1 (C channels, Relu fused: mid) -> `middle` nodes -> `m` ->
    Conv c2 (1x1 by default) -> y."""
    rng = np.random.default_rng(seed)
    c1, w1 = _conv(rng, "c1", "x", "pre", 3, cin)
    relu = helper.make_node("Relu", ["pre"], ["mid"], name="relu")
    nodes, inits = [c1, relu], dict(w1)
    more_nodes, more_inits = middle(rng)
    nodes += more_nodes
    inits.update(more_inits)
    c2, w2 = _conv(rng, "c2", "m", "y", head_cin or cin, 8, k=1)
    nodes.append(c2)
    inits.update(w2)
    return model(nodes, {"x": [N, 3, H, W]}, {"y": [N, 8, *out_shape]}, inits)


def max_pool():
    """mid -> MaxPool 3x3 stride 2 pad 1 -> m."""
    return _around(lambda rng: ([helper.make_node("MaxPool", ["mid"], ["m"], name="pool",
                                                  kernel_shape=[3, 3], strides=[2, 2],
                                                  pads=[1, 1, 1, 1])], {}), (4, 4), 10)


def average_pool():
    """mid -> AveragePool 2x2 stride 2 -> m."""
    return _around(lambda rng: ([helper.make_node("AveragePool", ["mid"], ["m"], name="pool",
                                                  kernel_shape=[2, 2], strides=[2, 2])], {}),
                   (4, 4), 11)


def global_average_pool():
    """mid -> GlobalAveragePool -> m."""
    return _around(lambda rng: ([helper.make_node("GlobalAveragePool", ["mid"], ["m"],
                                                  name="pool")], {}), (1, 1), 12)


def global_max_pool():
    """mid -> GlobalMaxPool -> m."""
    return _around(lambda rng: ([helper.make_node("GlobalMaxPool", ["mid"], ["m"],
                                                  name="pool")], {}), (1, 1), 21)


def concat():
    """mid -> Conv ca -> a; mid -> Conv cb (Relu fused) -> b; Concat(a, b) on channels -> m."""
    def middle(rng):
        ca, wa = _conv(rng, "ca", "mid", "a", C, 6)
        cb, wb = _conv(rng, "cb", "mid", "b_pre", C, 10, scale=.6)
        relu = helper.make_node("Relu", ["b_pre"], ["b"], name="relu_b")
        cat = helper.make_node("Concat", ["a", "b"], ["m"], name="cat", axis=1)
        return [ca, cb, relu, cat], {**wa, **wb}
    return _around(middle, (H, W), 13, head_cin=16)


def resize_nearest():
    """mid -> Resize x2 nearest -> m."""
    def middle(rng):
        return [helper.make_node("Resize", ["mid", "", "scales"], ["m"], name="up",
                                 mode="nearest")], \
            {"scales": np.array([1, 1, 2, 2], np.float32)}
    return _around(middle, (2 * H, 2 * W), 14)


def resize_linear():
    """mid -> Resize x2 linear -> m (int16 refused: ADDs read whole tensors)."""
    def middle(rng):
        return [helper.make_node("Resize", ["mid", "", "scales"], ["m"], name="up",
                                 mode="linear")], \
            {"scales": np.array([1, 1, 2, 2], np.float32)}
    return _around(middle, (2 * H, 2 * W), 14)


def conv_transpose():
    """mid -> ConvTranspose 2x2 stride 2 (C channels) -> up -> Conv 3x3 -> m."""
    def middle(rng):
        ct = helper.make_node("ConvTranspose", ["mid", "ct_w", "ct_b"], ["up"], name="ct",
                              kernel_shape=[2, 2], strides=[2, 2])
        c3, w3 = _conv(rng, "c3", "up", "m", C, C)
        return [ct, c3], {"ct_w": (rng.standard_normal((C, C, 2, 2)) * .3).astype(np.float32),
                          "ct_b": (rng.standard_normal(C) * .1).astype(np.float32), **w3}
    return _around(middle, (2 * H, 2 * W), 15)


def upsample_concat():
    """A decoder's merge (a DB text detector's): mid -> nearest Resize x2 -> u; mid ->
    ConvTranspose 2x2 stride 2 -> t; Concat(u, t) on channels -> m, its producers writing
    their parts in place."""
    def middle(rng):
        up = helper.make_node("Resize", ["mid", "", "scales"], ["u"], name="up", mode="nearest")
        ct = helper.make_node("ConvTranspose", ["mid", "ct_w", "ct_b"], ["t"], name="ct",
                              kernel_shape=[2, 2], strides=[2, 2])
        cat = helper.make_node("Concat", ["u", "t"], ["m"], name="cat", axis=1)
        return [up, ct, cat], {"scales": np.array([1, 1, 2, 2], np.float32),
                               "ct_w": (rng.standard_normal((C, 6, 2, 2)) * .3)
                               .astype(np.float32),
                               "ct_b": (rng.standard_normal(6) * .1).astype(np.float32)}
    return _around(middle, (2 * H, 2 * W), 20, head_cin=C + 6)


def views():
    """A detection head (PicoDet's): x -> Conv c1 -> head [N, 12, H, W] -> Split on channels
    (4, 8) -> s0, s1; s0 -> Sigmoid -> g -> Reshape [N, 4, H*W] -> Transpose -> y0 [N, H*W, 4];
    s1 -> Reshape [N, 8, H*W] -> Transpose -> y1 [N, H*W, 8]."""
    rng = np.random.default_rng(16)
    c1, w1 = _conv(rng, "c1", "x", "head", 3, C)
    nodes = [c1,
             helper.make_node("Split", ["head", "sizes"], ["s0", "s1"], name="split", axis=1),
             helper.make_node("Sigmoid", ["s0"], ["g"], name="sigmoid"),
             helper.make_node("Reshape", ["g", "shape0"], ["r0"], name="reshape0"),
             helper.make_node("Transpose", ["r0"], ["y0"], name="transpose0", perm=[0, 2, 1]),
             helper.make_node("Reshape", ["s1", "shape1"], ["r1"], name="reshape1"),
             helper.make_node("Transpose", ["r1"], ["y1"], name="transpose1", perm=[0, 2, 1])]
    inits = {**w1, "sizes": np.array([4, 8], np.int64),
             "shape0": np.array([N, 4, H * W], np.int64),
             "shape1": np.array([N, 8, H * W], np.int64)}
    return model(nodes, {"x": [N, 3, H, W]}, {"y0": [N, H * W, 4], "y1": [N, H * W, 8]}, inits)


def slices():
    """mid -> Split on channels (6, 6) -> s0, s1; s0 -> Slice of rows 2..6 -> t; s1 -> Slice
    of rows 2..6 -> u; Concat(u, t) -> m."""
    def middle(rng):
        nodes = [
            helper.make_node("Split", ["mid", "sizes"], ["s0", "s1"], name="split", axis=1),
            helper.make_node("Slice", ["s0", "lo", "hi", "axes"], ["t"], name="slice_t"),
            helper.make_node("Slice", ["s1", "lo", "hi", "axes"], ["u"], name="slice_u"),
            helper.make_node("Concat", ["u", "t"], ["m"], name="cat", axis=1),
        ]
        return nodes, {"sizes": np.array([6, 6], np.int64), "lo": np.array([2], np.int64),
                       "hi": np.array([6], np.int64), "axes": np.array([2], np.int64)}
    return _around(middle, (4, W), 17)


def flatten_gemm():
    """mid -> MaxPool 2x2 -> p -> Flatten -> m [N, C * 16] -> Gemm -> y."""
    rng = np.random.default_rng(18)
    c1, w1 = _conv(rng, "c1", "x", "pre", 3, C)
    nodes = [c1, helper.make_node("Relu", ["pre"], ["mid"], name="relu"),
             helper.make_node("MaxPool", ["mid"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["m"], name="flat"),
             helper.make_node("Gemm", ["m", "gw", "gb"], ["y"], name="fc", transB=1)]
    inits = {**w1, "gw": (rng.standard_normal((10, C * 16)) * .1).astype(np.float32),
             "gb": (rng.standard_normal(10) * .1).astype(np.float32)}
    return model(nodes, {"x": [N, 3, H, W]}, {"y": [N, 10]}, inits)


def concat_with_mul(op: str = "Mul"):
    """Concat(a, g): a a Conv's output, g a Mul (MUL wide writes it into the Concat's buffer,
    plane by plane) or a Div (no int16 writer) of two activations."""
    def middle(rng):
        ca, wa = _conv(rng, "ca", "mid", "a", C, 6)
        cb, wb = _conv(rng, "cb", "mid", "b", C, 6)
        cc, wc = _conv(rng, "cc", "mid", "c", C, 6)
        mul = helper.make_node(op, ["b", "c"], ["g"], name="gate")
        cat = helper.make_node("Concat", ["a", "g"], ["m"], name="cat", axis=1)
        return [ca, cb, cc, mul, cat], {**wa, **wb, **wc}
    return _around(middle, (H, W), 19)
