"""Random small graphs of the operators the compiler lowers, through the whole int8 flow: the
simulator's raw int8 outputs equal the quantizer's integer reference bit for bit.

Each graph is a chain with skip connections (residual Add/Sub/Mul of an earlier tensor of the
same shape; Mul by a squeeze-and-excitation gate) of convolutions (random kernel, stride,
asymmetric pads, dilation, groups up to depthwise, optional bias, fused Relu/Clip), pools (max
with ceil_mode, average with one window size), global pools, lookup-table maps (PRelu too) and
scalar Add/Sub/Mul, optionally ending in a dense tail
(Flatten or Reshape, then Gemm/MatMul) and a Softmax or LogSoftmax over the channels, and views: channel Splits into branches concatenated
again (a value twice included), Slices (crops, row and column steps, channel ranges) and
Concats with earlier tensors (the model input included), so that producers write into their
Concat's buffer, consumers read views in place, and what cannot be in place is copied. Channel
counts and planes are drawn past the edge preset's 8x8 array and 32 KiB scratchpad, so tiling
happens on every dimension; the target is drawn among the presets, with double buffering on or
off; and what real detectors and decoders add: nearest upsampling, ConvTranspose, a zero Pad
before a Conv, spatial means, per-channel constant maps and SiLU written out; and what sequence
models add: LayerNorm over the channels (and a ReduceMax, ReduceMin or ReduceL2 of its
rows), Pow by a constant (or a magnitude: the square root
of two channel halves' squares summed, fused into a Hypot), 1-D convolutions, reflect Pads
of rank-3 values and a residual stream with an outlier channel into a LayerNorm (int16). Only graphs the
compiler lowers are drawn: no Transpose, other Pads, Softmax over other axes, ...; average pools
whose windows all hold the same number of counted elements; MatMul only on rank-2
activations.
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np
import onnx
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from onnx import helper

from compiler.backend.program import BackendOptions
from compiler.graph.reference import resolve_pads
from compiler.pipeline import compile_int8
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from simulator.arch import Arch
from tests.e2e.flow import check_bit_exact, quantized
from tests.onnx_builder import model

# Schemes the accelerator runs: affine int8 (default), per-tensor weights, symmetric
# activations (zero point 0), power-of-two scales (ties on half steps are common), uint8
# activations (run as int8 codes offset by -128).
SCHEMES = (QuantOptions(), QuantOptions(per_channel=False),
           QuantOptions(symmetric_activations=True),
           QuantOptions(schema="power2", per_channel=False), QuantOptions(calibration="percentile"),
           QuantOptions(activation_dtype="uint8"))
PRESETS = ("edge", "default", "edge", "large")  # edge twice: its small memories tile most

Pick = Callable[[int, int], int]  # an integer in [lo, hi]


def random_model(pick: Pick) -> tuple[onnx.ModelProto, list[dict], list[dict]]:
    """A random lowerable graph, its calibration samples and its evaluation feeds."""
    rng = np.random.default_rng(pick(0, 2**16))
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    current = "x"

    def add(op: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> None:
        nonlocal current
        name = f"t{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [name], name=f"{op.lower()}{len(nodes)}",
                                      **attrs))
        shapes[name] = tuple(int(s) for s in shape)
        current = name

    def const(array) -> str:
        name = f"k{len(inits)}"
        inits[name] = np.asarray(array)
        return name

    def weight(*shape: int, fan_in: int) -> str:
        w = rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
        return const(w.astype(np.float32))

    def dense_tail(features: int) -> None:
        for _ in range(pick(1, 2)):
            units = pick(1, 20)
            kind = pick(0, 2)
            if kind == 0:
                add("MatMul", [current, weight(features, units, fan_in=features)],
                    (shapes[current][0], units))
            else:
                trans = pick(0, 1)
                w = weight(*((units, features) if trans else (features, units)),
                           fan_in=features)
                inputs = [current, w]
                if pick(0, 1):
                    inputs.append(const((rng.standard_normal(units) * 0.3).astype(np.float32)))
                add("Gemm", inputs, (shapes[current][0], units), transB=trans)
            features = units
            if pick(0, 1):
                add(("Relu", "Tanh", "Sigmoid")[pick(0, 2)], [current], shapes[current])

    def views(n: int, c: int, h: int, w: int) -> None:
        nonlocal current
        kind = pick(0, 2)
        if kind == 0 and c >= 2:  # a channel Split into a conv branch and a LUT branch, joined
            first = pick(1, c - 1)
            parts = [f"t{len(nodes)}a", f"t{len(nodes)}b"]
            nodes.append(helper.make_node("Split", [current, const(np.array([first, c - first]))],
                                          parts, name=f"split{len(nodes)}", axis=1))
            shapes[parts[0]], shapes[parts[1]] = (n, first, h, w), (n, c - first, h, w)
            k, out = (1, 3)[pick(0, 1)], pick(1, 24)
            add("Conv", [parts[0], weight(out, first, k, k, fan_in=first * k * k)],
                (n, out, h, w), kernel_shape=[k, k], pads=[k // 2] * 4)
            branches = [current, parts[1]]
            if pick(0, 1):
                add(("Relu", "Sigmoid", "Tanh")[pick(0, 2)], [parts[1]], shapes[parts[1]])
                branches[1] = current
            if pick(0, 1):
                branches.reverse()
            if pick(0, 3) == 0:
                branches.append(branches[0])  # a value twice: not in place, copied
            add("Concat", branches, (n, sum(shapes[b][1] for b in branches), h, w), axis=1)
        elif kind == 1:  # a Slice: a crop (row and column steps), a channel range, or both
            axes, starts, ends, steps, shape = [], [], [], [], [n, c, h, w]
            for axis, size in ((1, c), (2, h), (3, w)):
                if size < 2 or pick(0, 1) == 0:
                    continue
                start = pick(0, size - 1)
                end = pick(start + 1, size)
                step = 1 if axis == 1 else pick(1, 2)
                axes.append(axis)
                starts.append(start)
                ends.append(end - size if end < size and pick(0, 1) else end)  # negative ends
                steps.append(step)
                shape[axis] = len(range(start, end, step))
            if axes:
                add("Slice", [current, const(np.array(starts)), const(np.array(ends)),
                              const(np.array(axes)), const(np.array(steps))], tuple(shape))
        else:  # a Concat with an earlier tensor of the same plane (the model input included)
            axis = pick(1, 2)
            same = [t for t, s in shapes.items() if t != current and len(s) == 4
                    and all(s[a] == (n, c, h, w)[a] for a in range(4) if a != axis)]
            if same:
                other = same[pick(0, len(same) - 1)]
                operands = [current, other] if pick(0, 1) else [other, current]
                shape = [n, c, h, w]
                shape[axis] += shapes[other][axis]
                add("Concat", operands, tuple(shape), axis=axis)

    if pick(0, 5) == 0:  # a 2-D input straight into a dense stack
        shapes["x"] = (pick(1, 300), pick(1, 100)) if pick(0, 1) else (pick(1, 40), pick(1, 40))
        dense_tail(shapes["x"][1])
    else:
        big = pick(0, 2) < 2  # most graphs large enough to tile every dimension on edge
        shapes["x"] = (pick(1, 2), pick(9, 48) if big else pick(1, 12),
                       pick(17, 32) if big else pick(1, 12), pick(17, 32) if big else pick(1, 12))
        for _ in range(pick(1, 6)):
            n, c, h, w = shapes[current]
            choice = pick(0, 14)
            if choice <= 2:  # Conv, perhaps with a fused Relu or Clip
                divisors = [g for g in range(1, c + 1) if c % g == 0]
                groups = (1, c, divisors[pick(0, len(divisors) - 1)])[pick(0, 2)]
                out = groups * pick(1, max(1, 24 // groups) if groups > 1 else 40)
                kernel = (pick(1, 5), pick(1, 5)) if pick(0, 2) == 0 else (pick(1, 3),) * 2
                strides = (pick(1, 3), pick(1, 3)) if pick(0, 2) == 0 else (1, 1)
                dilations = (pick(1, 3), pick(1, 3)) if pick(0, 3) == 0 else (1, 1)
                pads = [pick(0, kernel[0] - 1), pick(0, kernel[1] - 1),
                        pick(0, kernel[0] - 1), pick(0, kernel[1] - 1)]
                _, (oh, ow), _, _ = resolve_pads((h, w), kernel, strides, dilations, pads, "NOTSET")
                if oh < 1 or ow < 1:
                    continue
                inputs = [current, weight(out, c // groups, *kernel,
                                          fan_in=c // groups * kernel[0] * kernel[1])]
                if pick(0, 2):
                    inputs.append(const((rng.standard_normal(out) * 0.3).astype(np.float32)))
                add("Conv", inputs, (n, out, oh, ow), kernel_shape=list(kernel),
                    strides=list(strides), pads=pads, dilations=list(dilations), group=groups)
                clamp = pick(0, 2)
                if clamp == 1:
                    add("Relu", [current], shapes[current])
                elif clamp == 2:
                    lo, hi = -0.1 * pick(0, 10), 0.2 * pick(1, 10)
                    add("Clip", [current, const(np.float32(lo)), const(np.float32(hi))],
                        shapes[current])
            elif choice == 3:  # MaxPool, ceil_mode included
                kernel = (pick(1, 3), pick(1, 3))
                strides = (pick(1, 3), pick(1, 3))
                pads = [pick(0, kernel[0] // 2), pick(0, kernel[1] // 2),
                        pick(0, kernel[0] // 2), pick(0, kernel[1] // 2)]
                ceil = pick(0, 1)
                _, (oh, ow), _, _ = resolve_pads((h, w), kernel, strides, None, pads, "NOTSET",
                                                 ceil)
                _, plain, _, _ = resolve_pads((h, w), kernel, strides, None, pads, "NOTSET")
                naive = [-(-(size + pads[a] + pads[a + 2] - kernel[a]) // strides[a]) + 1
                         for a, size in enumerate((h, w))] if ceil else plain
                # A last window starting in the end padding: the reference drops it (ONNX's
                # current text), opset 17's shape inference does not; keep clear of the case.
                if oh < 1 or ow < 1 or list(naive) != [oh, ow]:
                    continue
                add("MaxPool", [current], (n, c, oh, ow), kernel_shape=list(kernel),
                    strides=list(strides), pads=pads, ceil_mode=ceil)
            elif choice == 4:  # AveragePool: every window counts the same number of elements
                kernel = (pick(1, 3), pick(1, 3))
                strides = (pick(1, 3), pick(1, 3))
                padded = pick(0, 1)
                pads = [pick(0, kernel[0] // 2), pick(0, kernel[1] // 2),
                        pick(0, kernel[0] // 2), pick(0, kernel[1] // 2)] if padded else [0] * 4
                _, (oh, ow), _, _ = resolve_pads((h, w), kernel, strides, None, pads, "NOTSET")
                if oh < 1 or ow < 1:
                    continue
                add("AveragePool", [current], (n, c, oh, ow), kernel_shape=list(kernel),
                    strides=list(strides), pads=pads, count_include_pad=padded)
            elif choice == 5:  # residual Add/Sub/Mul of an earlier tensor, or a scalar constant
                op = ("Add", "Sub", "Mul")[pick(0, 2)]
                same = [t for t, s in shapes.items() if s == shapes[current] and t != current]
                if op == "Mul" and pick(0, 2) == 0:  # a squeeze-and-excitation gate
                    block = current
                    add("GlobalAveragePool", [current], (n, c, 1, 1))
                    add(("Sigmoid", "HardSigmoid")[pick(0, 1)], [current], (n, c, 1, 1))
                    operands = [block, current] if pick(0, 1) else [current, block]
                    add("Mul", operands, (n, c, h, w))
                    continue
                if same and pick(0, 3):
                    other = same[pick(0, len(same) - 1)]
                    operands = [current, other] if pick(0, 1) else [other, current]
                else:
                    scalar = const(np.float32(rng.uniform(-2, 2)))
                    operands = [current, scalar] if pick(0, 2) else [scalar, current]
                add(op, operands, shapes[current])
            elif choice in (6, 7):  # lookup-table maps
                op = ("Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu",
                      "PRelu", "Elu", "Softplus", "Softsign", "Erf", "Neg")[pick(0, 11)]
                attrs = {"alpha": 0.05 * pick(1, 6)} if op == "LeakyRelu" else {}
                slope = [const(rng.uniform(-0.5, 1.0, (c, 1, 1) if pick(0, 1) else (1,))
                               .astype(np.float32))] if op == "PRelu" else []
                add(op, [current, *slope], shapes[current], **attrs)
            elif choice == 8 and pick(0, 2) == 0:  # global pools: rarely, they end the plane
                add(("GlobalAveragePool", "GlobalMaxPool")[pick(0, 1)], [current],
                    (n, c, 1, 1))
            elif choice == 10:  # a residual block: a same-size conv, then Add/Sub of its input
                k = (1, 3, 5)[pick(0, 2)]
                groups = (1, c)[pick(0, 1)]
                inputs = [current, weight(c, c // groups, k, k, fan_in=c // groups * k * k)]
                if pick(0, 1):
                    inputs.append(const((rng.standard_normal(c) * 0.3).astype(np.float32)))
                block = current
                add("Conv", inputs, (n, c, h, w), kernel_shape=[k, k], pads=[k // 2] * 4,
                    group=groups)
                if pick(0, 1):
                    add("Relu", [current], shapes[current])
                operands = [block, current] if pick(0, 1) else [current, block]
                add(("Add", "Sub")[pick(0, 1)], operands, shapes[current])
            elif choice == 11:  # views: Split into branches, Slice, Concat
                views(n, c, h, w)
            elif choice == 12:  # what real detectors and decoders add (issue #12)
                kind = pick(0, 5)
                if kind == 0 and h * w <= 256:  # nearest upsampling by whole factors
                    fh, fw = pick(1, 3), pick(1, 3)
                    add("Resize", [current, "", const(np.array([1, 1, fh, fw], np.float32))],
                        (n, c, h * fh, w * fw), mode="nearest")
                elif kind == 1 and h * w <= 256:  # ConvTranspose: phases into strided views
                    k, stride, out = pick(1, 4), pick(1, 3), pick(1, 24)
                    pad = pick(0, (k - 1) // 2)
                    oh, ow = ((size - 1) * stride + k - 2 * pad for size in (h, w))
                    if oh < 1 or ow < 1:
                        continue
                    add("ConvTranspose", [current, weight(c, out, k, k, fan_in=c * k * k)],
                        (n, out, oh, ow), kernel_shape=[k, k], strides=[stride, stride],
                        pads=[pad] * 4)
                elif kind == 2:  # a zero Pad that folds into the Conv reading it
                    top, left, bottom, right = (pick(0, 2) for _ in range(4))
                    add("Pad", [current, const(np.array([0, 0, top, left, 0, 0, bottom, right]))],
                        (n, c, h + top + bottom, w + left + right))
                    _, _, ph, pw = shapes[current]
                    k = 3 if min(ph, pw) >= 3 else 1
                    add("Conv", [current, weight(c, c, k, k, fan_in=c * k * k)],
                        (n, c, ph - k + 1, pw - k + 1), kernel_shape=[k, k])
                elif kind == 3:  # a spatial mean, as squeeze-and-excitation takes it
                    axes = ([2, 3], [2], [3])[pick(0, 2)]
                    add("ReduceMean", [current], (n, c, 1 if 2 in axes else h,
                                                  1 if 3 in axes else w), axes=axes)
                elif kind == 4:  # a per-channel constant scale and offset: a depthwise conv
                    op = ("Mul", "Add", "Div")[pick(0, 2)]
                    values = rng.uniform(0.5, 2.0, (1, c, 1, 1)) * rng.choice([-1, 1],
                                                                             (1, c, 1, 1))
                    add(op, [current, const(values.astype(np.float32))], shapes[current])
                else:  # SiLU written out, fused into one table
                    x = current
                    add("Sigmoid", [x], shapes[x])
                    add("Mul", [x, current], shapes[x])
            elif choice == 13:  # what the vision models whole on the accelerator added
                kind = pick(0, 6)
                if kind == 0 and h * w <= 256:  # Resize to any size, nearest or linear
                    oh, ow = pick(1, 2 * h), pick(1, 2 * w)
                    mode = ("nearest", "linear")[pick(0, 1)]
                    ctm = ("half_pixel", "asymmetric", "align_corners",
                           "pytorch_half_pixel")[pick(0, 3)]
                    add("Resize", [current, "", "", const(np.array([n, c, oh, ow], np.int64))],
                        (n, c, oh, ow), mode=mode, coordinate_transformation_mode=ctm)
                elif kind == 1:  # Transpose of H and W: a strided copy
                    add("Transpose", [current], (n, c, w, h), perm=[0, 1, 3, 2])
                elif kind == 2:  # a Pad no Conv absorbs: a value, or border copies
                    mode = ("constant", "edge", "reflect", "wrap")[pick(0, 3)]
                    most = 1 if mode == "reflect" else 2
                    if mode == "reflect" and min(h, w) < 2:
                        continue
                    top, left, bottom, right = (pick(0, most) for _ in range(4))
                    inputs = [current, const(np.array([0, 0, top, left, 0, 0, bottom, right]))]
                    if mode == "constant":
                        inputs.append(const(np.float32(rng.uniform(-1, 1))))
                    add("Pad", inputs, (n, c, h + top + bottom, w + left + right), mode=mode)
                elif kind == 3:  # a dilated MaxPool
                    k, d, stride = pick(2, 3), pick(2, 3), pick(1, 2)
                    span = (k - 1) * d + 1
                    if min(h, w) < span:
                        continue
                    add("MaxPool", [current], (n, c, (h - span) // stride + 1,
                                               (w - span) // stride + 1),
                        kernel_shape=[k, k], dilations=[d, d], strides=[stride, stride])
                elif kind == 4:  # a mean over the channels (a convolution by ones)
                    axes = ([1], [1, 2, 3])[pick(0, 1)]
                    add("ReduceMean", [current], (n, 1, 1 if 2 in axes else h,
                                                  1 if 3 in axes else w), axes=axes)
                elif kind == 5:  # a constant that varies over H and W (a positional table)
                    op = ("Add", "Sub", "Mul")[pick(0, 2)]
                    values = rng.uniform(0.5, 1.5, ((1, c, h, w), (1, 1, h, w))[pick(0, 1)])
                    constant = const(values.astype(np.float32))
                    add(op, [current, constant] if pick(0, 1) else [constant, current],
                        shapes[current])
                elif h * w <= 256:  # a depthwise ConvTranspose, per-channel weights
                    add("ConvTranspose", [current, weight(c, 1, 2, 2, fan_in=4)],
                        (n, c, 2 * h, 2 * w), kernel_shape=[2, 2], strides=[2, 2], group=c)
            elif choice == 14:  # what sequence models add (issue #11)
                kind = pick(0, 4)
                if kind == 0:  # LayerNorm over the channels of tokens [n, h * w, c], and back
                    add("Reshape", [current, const(np.array([n, c, h * w], np.int64))],
                        (n, c, h * w))
                    add("Transpose", [current], (n, h * w, c), perm=[0, 2, 1])
                    gamma = const(rng.uniform(-1.5, 1.5, c).astype(np.float32))
                    beta = const(rng.normal(0, 0.3, c).astype(np.float32))
                    digits = pick(1, 6)
                    add("LayerNormalization", [current, gamma, beta], (n, h * w, c),
                        epsilon=10.0 ** -digits)
                    if digits == 6:  # a row reduction over the channels: REDUCE
                        op = ("ReduceMax", "ReduceMin", "ReduceL2")[int(rng.integers(3))]
                        add(op, [current], (n, h * w, 1), axes=[-1], keepdims=1)
                        c = 1
                    add("Transpose", [current], (n, c, h * w), perm=[0, 2, 1])
                    add("Reshape", [current, const(np.array([n, c, h, w], np.int64))],
                        (n, c, h, w))
                elif kind == 1:  # a power by a constant exponent: a table
                    exponent = (2.0, 3.0, 0.5, -1.0)[pick(0, 3)]
                    if exponent == 2.0 and c % 2 == 0:  # a magnitude of the channels' halves:
                        #                               Hypot (`fuse_hypot`), ADD op hypot
                        source, half = current, (n, c // 2, h, w)
                        squares = []
                        for begin in (0, c // 2):
                            add("Slice", [source, const(np.array([begin], np.int64)),
                                          const(np.array([begin + c // 2], np.int64)),
                                          const(np.array([1], np.int64))], half)
                            add("Pow", [current, const(np.float32(2.0))], half)
                            squares.append(current)
                        add("Add", squares, half)
                        add("Sqrt", [current], half)
                        continue
                    if exponent in (0.5, -1.0):
                        add("Abs", [current], shapes[current])
                    add("Pow", [current, const(np.float32(exponent))], shapes[current])
                elif kind == 2 and h * w > 1:  # a 1-D convolution over the flattened plane
                    add("Reshape", [current, const(np.array([n, c, h * w], np.int64))],
                        (n, c, h * w))
                    k, out = pick(1, 5), pick(1, 24)
                    stride = pick(1, 2)
                    length = (h * w + 2 * (k // 2) - k) // stride + 1
                    add("Conv", [current, weight(out, c, k, fan_in=c * k)], (n, out, length),
                        kernel_shape=[k], pads=[k // 2, k // 2], strides=[stride])
                    add("Reshape", [current, const(np.array([n, out, 1, length], np.int64))],
                        (n, out, 1, length))
                elif kind == 3:  # a reflect Pad of a rank-3 view
                    add("Reshape", [current, const(np.array([n * c, h, w], np.int64))],
                        (n * c, h, w))
                    if min(h, w) >= 2:
                        add("Pad", [current, const(np.array([0, 1, 1, 0, 1, 1]))],
                            (n * c, h + 2, w + 2), mode="reflect")
                        h, w = h + 2, w + 2
                    add("Reshape", [current, const(np.array([n, c, h, w], np.int64))],
                        (n, c, h, w))
                elif kind == 4:  # a residual stream with an outlier channel into a LayerNorm:
                    #            int16 planes (`quantizer.wide`), and back
                    width = pick(2, 40)
                    add("Reshape", [current, const(np.array([n, c, h * w], np.int64))],
                        (n, c, h * w))
                    add("Transpose", [current], (n, h * w, c), perm=[0, 2, 1])
                    add("MatMul", [current, weight(c, width, fan_in=c)], (n, h * w, width))
                    stream = current
                    w_out = rng.standard_normal((width, width)) / np.sqrt(width)
                    w_out[:, pick(0, width - 1)] *= 60.0
                    add("MatMul", [current, const(w_out.astype(np.float32))], (n, h * w, width))
                    add("Add", [current, stream], (n, h * w, width))
                    gamma = const(rng.uniform(0.02, 1.5, width).astype(np.float32))
                    add("LayerNormalization", [current, gamma], (n, h * w, width))
                    add("Transpose", [current], (n, width, h * w), perm=[0, 2, 1])
                    add("Reshape", [current, const(np.array([n, width, h, w], np.int64))],
                        (n, width, h, w))
            elif choice == 9 and pick(0, 1):  # a Reshape view of a 1x1 plane, read by what follows
                if h * w != 1:
                    continue
                add("Reshape", [current, const(np.array([n, c, 1, 1], np.int64))],
                    (n, c, 1, 1))
        if pick(0, 2) == 0:  # a dense tail
            n = shapes[current][0]
            features = int(np.prod(shapes[current][1:]))
            if pick(0, 1):
                add("Flatten", [current], (n, features))
            else:
                add("Reshape", [current, const(np.array([n, -1], np.int64))], (n, features))
            dense_tail(features)
    if pick(0, 3) == 0:  # a classifier's head: along the channels, the contiguous axis
        add(("Softmax", "LogSoftmax")[pick(0, 1)], [current], shapes[current],
            axis=1 if len(shapes[current]) == 4 else -1)
    outputs = {current: shapes[current]}
    # An intermediate tensor as a second output (not a view: its bytes are another tensor's,
    # in an order no binding describes when a channels-last map is flattened).
    earlier = [node.output[0] for node in nodes[:-1] if node.op_type not in ("Flatten", "Reshape")]
    if pick(0, 3) == 0 and earlier:
        first = earlier[pick(0, len(earlier) - 1)]
        outputs.setdefault(first, shapes[first])
    proto = model(nodes, {"x": list(shapes["x"])}, {k: list(v) for k, v in outputs.items()},
                  inits)
    scale = 0.5 * pick(1, 6)
    calibration = [{"x": (rng.standard_normal(shapes["x"]) * scale).astype(np.float32)}
                   for _ in range(pick(1, 4))]
    feeds = [{"x": (rng.standard_normal(shapes["x"]) * scale * 1.2).astype(np.float32)}
             for _ in range(2)]
    return proto, calibration, feeds


def check_random(pick: Pick, note: Callable[[str], None] = lambda _: None) -> bool:
    """Compile a random graph for a drawn target and compare every output; False when the
    graph cannot be quantized (a degenerate, all-constant activation)."""
    proto, calibration, feeds = random_model(pick)
    if not proto.graph.node:
        return False
    try:
        qgraph = quantized(proto, calibration,
                           SCHEMES[pick(0, len(SCHEMES) - 1)] if pick(0, 1) else SCHEMES[0])
    except QuantizeError:
        return False
    preset, double_buffer = PRESETS[pick(0, len(PRESETS) - 1)], bool(pick(0, 1))
    x = proto.graph.input[0].type.tensor_type.shape.dim
    note(f"{preset}, {'large' if np.prod([d.dim_value for d in x]) > 8192 else 'small'} input")
    compiled = compile_int8(qgraph, Arch.load(preset), BackendOptions(double_buffer))
    check_bit_exact(qgraph, compiled, feeds)
    return True


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_graphs_are_bit_exact(data) -> None:
    """150 graphs: 15 to 40 s on 2 cores (the draws follow this source's hash). Measured
    beyond: `python -m tests.e2e.test_random_graphs 0 320` gives 313 bit-exact, 7 not
    quantizable, 0 failed (2026-11-26, with int16 residual streams and, in 3 of the 320,
    Hypot magnitudes among the draws; seed 99's failure fixed); earlier drafts of this generator drew 8800 graphs, 400 of them on
    output-stationary arrays, with no failure left unfixed."""
    assume(check_random(lambda lo, hi: data.draw(st.integers(lo, hi)), event))


@pytest.mark.parametrize("seed", [1233, 223, 246, 66, 165, 99])
def test_seeds_that_once_failed(seed: int) -> None:
    """1233: a LOAD needing both the store and the vector queue, whose compute neighbour
    already followed the store but not the vector: the relay needed a SYNC after the token
    was taken (fixed in `compiler.backend.schedule._Tokens.make_after`). 223, 246: a reader
    took its input's buffer before `Walk.need_view` copied the input into order (a LayerNorm's
    round trip through Transposes; a reflect Pad of a rank-3 view), and read the old bytes
    through the new View. 66, 165: a Reshape merging a map's batch and channels ([N, C, H, W]
    → [N C, H, W], for a Pad of rank 3) was refused as no strided order; the copy into order
    now walks the axes both shapes split into (`layers.common_axes`). 99: a model input
    [2, 3, 7, 12] reshaped to [2, 3, 84] for a 1-D Conv was stored pre-padded, its binding's
    strides those of the Conv's [2, 3, 1, 84] map applied to its own axes, so the host wrote
    the input over the next layer's parameters; an input a Reshape splits or merges is not
    pre-padded now (`program.packable`). The seed draws through
    this generator, so it stays a random graph when the generator changes; it must still draw
    a quantizable one, or the seed no longer tests anything."""
    rng = np.random.default_rng(seed)
    assert check_random(lambda lo, hi: int(rng.integers(lo, hi + 1))), \
        f"seed {seed} now draws a graph that cannot be quantized: pick a new one"


def main(first: int, count: int) -> None:
    """Seeded graphs first .. first + count - 1: prints the seeds that fail."""
    failed = passed = 0
    for seed in range(first, first + count):
        rng = np.random.default_rng(seed)
        try:
            passed += check_random(lambda lo, hi: int(rng.integers(lo, hi + 1)))
        except Exception as error:  # noqa: BLE001 - report every failure, keep going
            failed += 1
            print(f"seed {seed}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
    print(f"{passed} bit-exact, {failed} failed, {count - passed - failed} not quantizable")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
