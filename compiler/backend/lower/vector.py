"""Lowering rules for the vector unit: MaxPool (dilated: one pool per output phase), AveragePool
with one window size, GlobalAveragePool, ReduceMean (over the channels: a convolution on the
array), GlobalMaxPool, Add and Sub, Max and Min (ADD with op max or min), Mul of two
activations (one may be broadcast: a gate per channel, per pixel or per image; so may an Add,
Sub, Max or Min operand, and a mask over attention's row-major scores), Div by an activation (a
reciprocal table and MUL), Softmax and LogSoftmax along the channels (SOFTMAX; along another
axis through element copies); every single-input elementwise integer map (Relu, Clip, Rescale,
Sigmoid, Tanh, ..., and Add/Sub/Mul with a scalar constant operand) is a 256-entry LUT built by
running the node's own int8 kernel on all 256 codes, so it is bit-exact by construction; a table
op with int16 codes in or out is a LUT of the node's own int16 table (`_wide_lut`)."""

from __future__ import annotations

import functools
import math

import numpy as np

from compiler.backend.layers import (NHWC, AddLayer, ConvLayer, Layout, LutLayer, MulLayer,
                                     PoolLayer, SoftmaxLayer, Tensor, View, block_axis,
                                     block_shape)
from compiler.graph.ir import Node
from compiler.graph.ops import OPS, REDUCE_L2, REDUCE_MAX, REDUCE_MIN, int8_attrs
from compiler.graph.int8 import Quant, reduce_axes
from compiler.graph.reference import resolve_pads
from compiler.backend.lower.data import axis_strides
from compiler.backend.lower.resize import border_runs, lower_index_map
from compiler.backend.lower.walk import INT8_CODES, Walk, requant_params, unsupported
from simulator import isa, numerics
from simulator.numerics import RANGES, wide_clamp


INT8_MIN = -128


def _pool(lw: Walk, node: Node, average: bool, kernel, strides, pads, pad_value,
          plane: tuple[int, int] | None = None, **params):
    """`plane`: the (H, W) the window reads x's channels-last pixels as, when not x's own (a
    global pool's row of pixels folded into rows of the window fields' width)."""
    x, y = node.inputs[0], node.outputs[0]
    lw.need_channels_last(node, x)
    n, c, h, w = lw.shape(x)
    oh, ow = lw.shape(y)[2:]
    x_plane = lw.wide_input(node, x)
    if x_plane and not average:  # int16's lowest code never wins a window
        pad_value = RANGES["int16"][0]
    y_tensor, y_view = lw.output(y, Layout.channels_last((n, c, oh, ow)),
                                 planes_in_place=True)  # each plane STOREd by its View
    lw.layers.append(PoolLayer(
        node.name, lw.source(node, x), y_tensor,
        n, plane or (h, w), (oh, ow), c, tuple(kernel), tuple(strides), tuple(pads), pad_value,
        average, **params, x_view=lw.views.get(x), y_view=y_view, x_plane=x_plane,
        y_plane=lw.planes.get(y_tensor, 0)))


def _global_plane(lw: Walk, node: Node) -> tuple[int, int]:
    """The window of a global pool: x's plane, or, when a side is wider than the pooling
    fields hold, the same pixels (channels-last: one after another) as rows of a width that
    does (508 pixels as 2 rows of 254)."""
    x = node.inputs[0]
    h, w = lw.shape(x)[2:]
    widest = isa.MAXPOOL.field("kw").range[1]
    if h <= widest and w <= widest:
        return h, w
    pixels = h * w
    rows = next((r for r in range(1, widest + 1) if pixels % r == 0 and pixels // r <= widest),
                None)
    if rows is None or x in lw.views:
        raise unsupported(node, f"its {h}x{w} window has no factors of at most {widest} "
                                f"(the pooling fields' width) to fold its pixels into")
    return rows, pixels // rows


def _window(lw: Walk, node: Node, a: dict, ceil_mode: int):
    x = node.inputs[0]
    h, w = lw.shape(x)[2:]
    if a.get("dilations") and any(d != 1 for d in a["dilations"]):
        raise unsupported(node, "a dilated average window does not lower (a dilated MaxPool does)")
    kernel = tuple(a["kernel_shape"])
    if len(kernel) != 2:
        raise unsupported(node, "only 2-D pooling lowers")
    pads, out, strides, _ = resolve_pads((h, w), kernel, a["strides"], None, a["pads"],
                                         a["auto_pad"], ceil_mode)
    # The vector unit's window count is (in - k) // s + 1: pad the far side so that every
    # output (ceil_mode's partial windows included) has its full window in the block.
    far = [max(p2, (o - 1) * s + k - size - p1) for p1, p2, o, s, k, size in
           zip(pads[:2], pads[2:], out, strides, kernel, (h, w))]
    return kernel, tuple(strides), (pads[0], pads[1], far[0], far[1])


def lower_pad(lw: Walk, node: Node) -> None:
    """A constant Pad of H and W that no reader absorbed (`compiler.passes.fold_pad`): a 1x1
    MaxPool whose input LOAD fills the border with the pad value's code, so the copy and the
    padding are one pass over the map (written into its Concat's part in place, if planned).
    Negative pads crop: the pool reads a View of the kept part. An edge, reflect or wrap Pad
    copies input rows and columns into the border (`resize.lower_index_map`)."""
    x, y = node.inputs[0], node.outputs[0]
    mode = int8_attrs(node)["mode"]
    given = [*node.inputs[1:4], "", ""][:3]
    pads, value, axes = (lw.g.values[n].const if n else None for n in given)
    shape = lw.shape(x)
    if len(shape) != 4 or any(n and lw.g.values[n].const is None for n in given):
        raise unsupported(node, "only constant pads of an N x C x H x W map lower")
    axes = range(4) if axes is None else [int(a) % 4 for a in np.atleast_1d(axes)]
    pads = [int(p) for p in np.atleast_1d(pads)]
    begin, end = [0] * 4, [0] * 4
    for i, axis in enumerate(axes):
        begin[axis], end[axis] = pads[i], pads[i + len(axes)]
    if any(begin[:2] + end[:2]):
        raise unsupported(node, "it pads the batch or channel axis (only H and W lower)")
    if mode != "constant":  # edge, reflect, wrap: copies of input rows and columns
        lower_index_map(lw, node, border_runs)
        return
    if lw.g.type_of(x).dtype == "int16":
        raise unsupported(node, "a constant Pad of int16 codes (its LOAD pads with one byte; "
                                "an edge, reflect or wrap Pad copies int16 rows)")
    widest = isa.LOAD.field("pad_top").range[1]
    if max(begin + end) > widest:
        raise unsupported(node, f"it pads {max(begin + end)} pixels; a LOAD pads at most "
                                f"{widest}")
    lw.need_channels_last(node, x)
    whole = view = lw.need_view(node, x)
    n, c = shape[:2]
    for axis, lo, hi in ((1, begin[2], end[2]), (2, begin[3], end[3])):  # crop first
        if lo < 0 or hi < 0:
            kept = view.shape[axis] - max(-lo, 0) - max(-hi, 0)
            view = view.sub(axis, max(-lo, 0), kept)
    crop_h, crop_w = view.shape[1:3]
    out_h, out_w = lw.shape(y)[2:]
    code = 0 if value is None else int(np.asarray(value).item())
    y_tensor, y_view = lw.output(y, Layout.channels_last(lw.shape(y)))
    lw.layers.append(PoolLayer(
        node.name, lw.source(node, x), y_tensor, n, (crop_h, crop_w), (out_h, out_w), c,
        (1, 1), (1, 1), (max(begin[2], 0), max(begin[3], 0), max(end[2], 0), max(end[3], 0)),
        code, x_view=view if view != whole or x in lw.views else None, y_view=y_view))


def lower_max_pool(lw: Walk, node: Node) -> None:
    a = int8_attrs(node)
    if a.get("dilations") and any(d != 1 for d in a["dilations"]):
        return _dilated_max_pool(lw, node, a)
    kernel, strides, pads = _window(lw, node, a, a["ceil_mode"])
    _pool(lw, node, False, kernel, strides, pads, INT8_MIN)


def _dilated_max_pool(lw: Walk, node: Node, a: dict) -> None:
    """A dilated max pool as one dense max pool per output phase: every d-th input row (and
    column) is a strided View, over which the window is dense, and each phase writes every
    (d / gcd(s, d))-th output row (and column), a strided View of the output. The pools load
    the same bytes as one undilated pool would, and no instruction is added."""
    x, y = node.inputs[0], node.outputs[0]
    lw.need_channels_last(node, x)
    n, c, h, w = lw.shape(x)
    kernel = tuple(a["kernel_shape"])
    if len(kernel) != 2:
        raise unsupported(node, "only 2-D pooling lowers")
    pads, out, strides, dilations = resolve_pads((h, w), kernel, a["strides"], a["dilations"],
                                                 a["pads"], a["auto_pad"], a["ceil_mode"])
    x_plane = lw.wide_input(node, x)  # an int16 max: both planes in and out
    y_tensor, y_view = lw.output(y, Layout.channels_last((n, c, *out)), planes_in_place=True)
    lowest = RANGES["int16"][0] if x_plane else INT8_MIN
    x_whole = lw.views.get(x) or View.dense(block_shape((n, c, h, w)))
    y_whole = y_view or View.dense(block_shape((n, c, *out)))
    axes = [_dilated_phases(*args) for args in
            zip((h, w), out, kernel, strides, dilations, pads[:2])]
    for (start_h, size_h, first_h, count_h, step_h, stride_h, pads_h) in axes[0]:
        for (start_w, size_w, first_w, count_w, step_w, stride_w, pads_w) in axes[1]:
            if not size_h or not size_w:
                raise unsupported(node, "a phase of its dilated window lies wholly in the "
                                        "padding")
            lw.layers.append(PoolLayer(
                node.name, lw.source(node, x), y_tensor, n, (size_h, size_w),
                (count_h, count_w), c, kernel, (stride_h, stride_w),
                (pads_h[0], pads_w[0], pads_h[1], pads_w[1]), lowest,
                x_view=x_whole.sub(1, start_h, size_h, dilations[0])
                .sub(2, start_w, size_w, dilations[1]),
                y_view=y_whole.sub(1, first_h, count_h, step_h)
                .sub(2, first_w, count_w, step_w), x_plane=x_plane,
                y_plane=lw.planes.get(y_tensor, 0)))


def _dilated_phases(size: int, out: int, kernel: int, stride: int, dilation: int,
                    pad: int) -> list[tuple]:
    """The output phases of one axis of a dilated pool, each (its first input and input
    count, read every `dilation`-th; its first output, output count and output step; its
    dense pool's stride and (begin, end) pads).

    Output o reads inputs o * s + i * d - p. With g = gcd(s, d) and o = q * (d / g) + r, that
    is d * (q * s / g + i) + r * s - p: phase r is a dense window of stride s / g over every
    d-th input from r * s - p on."""
    common = math.gcd(stride, dilation)
    step, dense_stride = dilation // common, stride // common
    phases = []
    for first in range(min(step, out)):
        base = first * stride - pad
        start = base % dilation
        begin = (start - base) // dilation
        inputs = len(range(start, size, dilation))
        count = len(range(first, out, step))
        end = max(0, (count - 1) * dense_stride + kernel - inputs - begin)
        phases.append((start, inputs, first, count, step, dense_stride, (begin, end)))
    return phases


def lower_average_pool(lw: Walk, node: Node) -> None:
    a = int8_attrs(node)
    if len(a["counts"]) != 1:
        raise unsupported(node, f"its windows have {len(a['counts'])} different sizes "
                                f"{list(a['counts'])} (one multiplier per layer lowers)")
    kernel, strides, pads = _window(lw, node, a, a["ceil_mode"])
    mult, shift, out_zp, qclamp = requant_params(node, 1, wide=True)
    _pool(lw, node, True, kernel, strides, pads, int(a.get("x_zero_point", 0)),
               multiplier=int(mult[0]), shift=int(shift[0]), out_zero_point=out_zp,
               qclamp=qclamp)


def lower_global_average_pool(lw: Walk, node: Node) -> None:
    a = int8_attrs(node)
    plane = _global_plane(lw, node)
    mult, shift, out_zp, qclamp = requant_params(node, 1, wide=True)
    _pool(lw, node, True, plane, (1, 1), (0, 0, 0, 0), int(a.get("x_zero_point", 0)),
          plane=plane, multiplier=int(mult[0]), shift=int(shift[0]), out_zero_point=out_zp,
          qclamp=qclamp)


def _reduction(lw: Walk, node: Node, verb: str):
    """(int8 attributes, x, y, x's shape, the reduced axes, the View axes of those of more
    than one element) of a reduction over a rank-2 to 4 value."""
    a = int8_attrs(node)
    x, y = node.inputs[0], node.outputs[0]
    shape = lw.shape(x)
    given = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    axes = reduce_axes(len(shape), lw.g.values[given].const if given else None,
                       a["noop_with_empty_axes"])
    if not 2 <= len(shape) <= 4:
        raise unsupported(node, f"it {verb} a rank-{len(shape)} value; ranks 2 to 4 lower")
    return a, x, y, shape, axes, {block_axis(len(shape), axis) for axis in axes
                                  if shape[axis] > 1}


def lower_reduce_mean(lw: Walk, node: Node) -> None:
    """A mean over any axes of a rank-2 to 4 value, read as its (N, H, W, C) block (a
    row-major [N, T, C] tensor's last axis is its channels): over H, W or both the average
    pool of that window; over the channels (with H and W or not) a convolution to one output
    channel by a kernel of ones spanning the averaged axes, its bias taking x's zero point off.
    Either sums (x - z_x) exactly and requantizes once by s_x / (count * s_out), as
    `reduce_mean_int8`. Axes of size 1 average nothing. ReduceSum lowers the same way: its
    requantization is s_x / s_out, a mean over windows of one."""
    a, x, y, shape, axes, averaged = _reduction(lw, node, "averages")
    if 0 in averaged:
        raise unsupported(node, f"it averages the batch axis of a rank-{len(shape)} value "
                                f"(axes {sorted(axes)})")
    if len(shape) == 4:
        lw.need_channels_last(node, x)
    else:
        lw.need_view(node, x)
    n, h, w, c = block_shape(shape)
    kernel = (h if 1 in averaged else 1, w if 2 in averaged else 1)
    out_hw = (h // kernel[0], w // kernel[1])
    channels = 1 if 3 in averaged else c
    layout = Layout.channels_last((n, channels, *out_hw)) if len(shape) == 4 else \
        Layout.row_major(lw.shape(y))
    if layout.strides(lw.shape(y)) is None:  # keepdims=0 dropped an axis between kept ones:
        kept = [axis for axis in range(4) if axis not in axes]  # the order of those kept
        layout = Layout(lw.shape(y), tuple(kept.index(p) for p in NHWC if p in kept))
    # In place in a Concat only when the value's own block is the layer's (keepdims).
    in_place = block_shape(lw.shape(y)) == (n, *out_hw, channels)
    y_tensor, y_view = lw.output(y, layout, in_place)
    mult, shift, out_zp, qclamp = requant_params(node, 1)
    zero = int(a.get("x_zero_point", 0))
    if 3 not in averaged:
        lw.layers.append(PoolLayer(
            node.name, lw.source(node, x), y_tensor, n, (h, w), out_hw, c, kernel, (1, 1),
            (0, 0, 0, 0), zero, True, int(mult[0]), int(shift[0]), out_zp, qclamp,
            x_view=lw.views.get(x), y_view=y_view))
        return
    count = kernel[0] * kernel[1] * c
    if count * 255 >= 2**31:
        raise unsupported(node, f"it averages {count} values, whose sum may overflow the "
                                f"int32 accumulator")
    bias = None if zero == 0 else np.array([-zero * count], np.int32)
    x_view = lw.views.get(x)
    in_hw, depth = (h, w), c
    if averaged == {1, 2, 3} and (x_view is None or x_view.contiguous):
        # Each image's bytes are one run: a 1x1 convolution over h * w * c input channels,
        # which the tiler splits along K, where a kernel spanning H x W may not fit on chip.
        in_hw, kernel, depth = (1, 1), (1, 1), count
        x_view = None if x_view is None else View((n, 1, 1, count), x_view.offset,
                                                   (count, count, count))
    lw.layers.append(ConvLayer(
        node.name, lw.source(node, x), y_tensor, n, in_hw, out_hw, depth, 1, kernel, (1, 1),
        (1, 1), (0, 0, 0, 0), zero, np.ones((1, depth, *kernel), np.int8), bias, mult, shift,
        out_zp, qclamp, macs=n * out_hw[0] * out_hw[1] * count, x_view=x_view, y_view=y_view))


REDUCE_OP = {REDUCE_MAX.name: "max", REDUCE_MIN.name: "min", REDUCE_L2.name: "l2"}


def lower_reduce(lw: Walk, node: Node) -> None:
    """ReduceMax, ReduceMin, ReduceL2 of a rank-2 to 4 value read as its (N, H, W, C) block:
    over the channels alone (a map's C, a row-major tensor's last axis) the vector unit's
    REDUCE, one value per pixel; a maximum over H, W or both a MAXPOOL of that window."""
    a, x, y, shape, axes, reduced = _reduction(lw, node, "reduces")
    op = REDUCE_OP[node.op]
    if len(shape) == 4:
        lw.need_channels_last(node, x)
    n, h, w, c = block_shape(shape)
    layout = Layout.channels_last(lw.shape(y)) if len(lw.shape(y)) == 4 else \
        Layout.row_major(lw.shape(y))
    if reduced and reduced <= {1, 2} and op == "max":
        kernel = (h if 1 in reduced else 1, w if 2 in reduced else 1)
        out_hw = (h // kernel[0], w // kernel[1])
        if len(shape) == 4:
            layout = Layout.channels_last((n, c, *out_hw))
        y_tensor, y_view = lw.output(y, layout, block_shape(lw.shape(y)) == (n, *out_hw, c))
        lw.layers.append(PoolLayer(
            node.name, lw.source(node, x), y_tensor, n, (h, w), out_hw, c, kernel, (1, 1),
            (0, 0, 0, 0), INT8_MIN, False, x_view=lw.views.get(x), y_view=y_view))
        return
    if reduced != {3}:
        raise unsupported(node, f"it reduces axes {sorted(axes)} of {list(shape)}; the "
                                f"accelerator reduces the contiguous axis (REDUCE), or takes a "
                                f"maximum over H and W (MAXPOOL)")
    view = lw.need_view(node, x)
    tx = lw.source(node, x)
    ty, y_view = lw.output(y, layout, in_place=False)
    table = np.zeros(0, np.int32)
    if op == "l2":  # the rescale REDUCE reads at `table`
        table = np.array([int(np.reshape(a["multiplier"], -1)[0]),
                          int(np.reshape(a["shift"], -1)[0])], np.int32)
    lw.layers.append(SoftmaxLayer(
        node.name, tx, ty, table, False, 0, int(a.get("out_zero_point", 0)),
        (view or View.dense((n, h, w, c)), View.dense((n, h, w, 1))), reduce=op, channels=c,
        in_zero_point=int(a.get("x_zero_point", 0))))


def lower_global_max_pool(lw: Walk, node: Node) -> None:
    plane = _global_plane(lw, node)
    _pool(lw, node, False, plane, (1, 1), (0, 0, 0, 0), INT8_MIN, plane=plane)


def lower_add(lw: Walk, node: Node) -> None:
    """Add: a LUT with a scalar constant operand (an int8 map: every code's sum; an int16 one
    the quantizer made a table), else ADD (an int16 map by a scalar: the constant as b, one
    value for every pixel and lane)."""
    if _scalar_operand(lw, node) and not _wide_sum(lw, node):
        return lower_lut(lw, node)
    _add(lw, node, negate_b=False)


def lower_sub(lw: Walk, node: Node) -> None:
    """Sub: as Add, ADD with b's rescale negated."""
    if _scalar_operand(lw, node) and not _wide_sum(lw, node):
        return lower_lut(lw, node)
    _add(lw, node, negate_b=True)


def _wide_sum(lw: Walk, node: Node) -> bool:
    """Whether an Add or Sub by a scalar constant is the ADD of an int16 operand and the
    constant (`quantizer.quantize.add`: its sum rounds once, `numerics.wide_add`), not a
    table (an int16 table op names its input, `table_of`)."""
    return "table_of" not in node.attrs and any(
        lw.g.type_of(n).dtype == "int16" for n in (*node.inputs[:2], node.outputs[0]))


def lower_max(lw: Walk, node: Node) -> None:
    """Max: a LUT with a scalar constant operand; else ADD with op max, either operand
    broadcast as a MUL's (a Clip's run-time bound: one value per image)."""
    if _scalar_operand(lw, node):
        return lower_lut(lw, node)
    _add(lw, node, negate_b=False, op="max")


def lower_min(lw: Walk, node: Node) -> None:
    """Min: as Max, ADD with op min."""
    if _scalar_operand(lw, node):
        return lower_lut(lw, node)
    _add(lw, node, negate_b=False, op="min")


def lower_hypot(lw: Walk, node: Node) -> None:
    """Hypot: ADD with op hypot (its operands of one shape, in one scale)."""
    _add(lw, node, negate_b=False, op="hypot")


def _add(lw: Walk, node: Node, negate_b: bool, op: str = "add") -> None:
    """ADD of the node's two operands over flat bytes, or over Views when one is a part of a
    buffer (a slice, a Concat's part), a constant (a bias, broadcast by its View's strides) or
    broadcast (`_broadcast_operand`). An int16 operand or sum (`quantizer.wide`) is two planes
    of its tensor, the low one `Walk.planes` bytes after the high one through the same View
    (ADD a_wide, b_wide, wide): over whole tensors, slices and broadcast operands alike."""
    a = int8_attrs(node)
    x, z, y = node.inputs[0], node.inputs[1], node.outputs[0]
    _wide_op(lw, node, op)
    rows = _row_major_views(lw, node, (x, z), y)
    constant = [n for n in (x, z) if lw.g.values[n].is_const]
    if rows is not None:  # attention's scores and their mask, in logical order
        (ta, a_view), (tb, b_view), (ty, y_view) = rows
        views = (a_view, b_view, y_view)
    elif not constant and (lw.shape(x) != lw.shape(y) or lw.shape(z) != lw.shape(y)):
        return _broadcast_operand(lw, node, op, negate_b)
    elif constant:  # the other operand, of the output's shape, and the constant over Views
        (k,), (active,) = constant, [n for n in (x, z) if n not in constant]
        if lw.shape(active) != lw.shape(y):
            raise unsupported(node, f"broadcasting its input {active!r} {lw.shape(active)} "
                                    f"to {lw.shape(y)}")
        view = lw.need_view(node, active)  # first: it may copy the operand into order
        operands = {active: (lw.source(node, active), view),
                    k: lw.constant(node, k, lw.shape(y), over_channels=True)}
        ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)), planes_in_place=True)
        (ta, a_view), (tb, b_view) = operands[x], operands[z]
        views = (a_view, b_view, y_view or View.dense(block_shape(lw.shape(y))))
    else:
        ta, tb = lw.source(node, x), lw.source(node, z)
        parts = x in lw.views or z in lw.views
        if not parts and not lw.layouts[ta].same_bytes(lw.layouts[tb]):
            raise unsupported(node, "its inputs are stored in different orders")
        ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)) if parts
                               else lw.layouts[ta], planes_in_place=True)
        views = None
        if parts or y_view is not None:  # some operand is a part of a buffer: run over Views
            views = (lw.need_view(node, x), lw.need_view(node, z),
                     y_view or View.dense(block_shape(lw.shape(y))))
            ta, tb = lw.source(node, x), lw.source(node, z)  # copied into order, maybe
    mult = list(a["multiplier"])
    if negate_b:  # sub_int8: an ADD whose b rescale is negated
        mult[1] = -mult[1]
    lw.layers.append(AddLayer(
        node.name, ta, tb, ty, math.prod(lw.shape(y)) if views is None else views[2].size,
        int(a["a_zero_point"]), int(a["b_zero_point"]), tuple(int(m) for m in mult),
        tuple(int(s) for s in a["shift"]), int(a["out_zero_point"]), _sum_clamp(node, a, y, lw),
        views, op, _planes(lw, ta, tb, ty)))


def _wide_op(lw: Walk, node: Node, op: str) -> None:
    """Refuse int16 codes where ADD has no wide form: a Max or Min (an extremum of int16
    codes)."""
    a_wide, b_wide, wide = (lw.g.type_of(n).dtype == "int16"
                            for n in (*node.inputs[:2], node.outputs[0]))
    if (a_wide or b_wide or wide) and op not in ("add", "hypot"):
        raise unsupported(node, f"its int16 operand or result is a {node.op}; the vector "
                                f"unit's ADD adds int16 codes or takes their magnitude")


def _sum_clamp(node: Node, a: dict, y: str, lw: Walk) -> tuple[int, int]:
    """The 8-bit clamp fields of an ADD: the int8 sum's bounds, or an int16 sum's high byte's
    (`numerics.wide_clamp`: the node's int16 clamp must be of that form)."""
    if lw.g.type_of(y).dtype != "int16":
        return tuple(int(q) for q in (a.get("qclamp") or (-128, 127)))
    lo, hi = (int(q) for q in (a.get("qclamp") or RANGES["int16"]))
    if wide_clamp(lo >> 8, hi >> 8) != (lo, hi):
        raise unsupported(node, f"its int16 clamp [{lo}, {hi}] is not [qmin * 256, qmax * "
                                f"256 + 255] (a wide ADD clamps the high byte)")
    return lo >> 8, hi >> 8


def _row_major(lw: Walk, name: str) -> bool:
    """Whether value `name` is a whole row-major buffer of rank 4 in no channels-last order: a
    MatMul of two activations' [B, H, S, N] (attention's scores), whose vector consumers read
    it in logical order, its last axis in the lanes."""
    shape = lw.shape(name)
    if len(shape) != 4 or name in lw.views or name in lw.strided or name not in lw.buffer:
        return False
    layout = lw.layouts[lw.buffer[name]]
    return layout.same_bytes(Layout.row_major(shape)) and \
        not layout.same_bytes(Layout.channels_last(shape))


def _logical_view(lw: Walk, node: Node, name: str, out_shape: tuple[int, ...]
                  ) -> tuple[str, View]:
    """The tensor of value `name` and the View that reads it as the block (N, H, W, C) =
    `out_shape` in logical order, its last axis contiguous (a constant's codes are stored so,
    in the DRAM image). One row per image broadcast over both middle axes (a mask [B, 1, 1, S]
    over heads and query rows) is a block of one pixel, which ADD reads once per tile (b_once);
    any other axis of one element is broadcast by stride 0 (the DMA repeats it)."""
    shape = lw.shape(name)
    value = lw.g.values[name]
    if value.is_const and value.type.dtype != "int8":
        raise unsupported(node, f"its constant input {name!r} is {value.type.dtype}; a row-major "
                                f"operand's constant is of int8 codes")
    if value.is_const:
        codes = np.asarray(value.const, np.int8)
        codes = np.broadcast_to(codes, codes.shape[:-1] + (out_shape[-1],)) if codes.ndim else \
            np.broadcast_to(codes, (out_shape[-1],))
        tensor = f"{node.name}/{name}"
        lw.tensors[tensor] = Tensor(tensor, codes.size)
        lw.layouts[tensor] = Layout.row_major(codes.shape)
        lw.constants[tensor] = np.ascontiguousarray(codes).tobytes()
        shape = codes.shape
        found = (0, Layout.row_major(shape).strides(shape))
    else:
        tensor, found = lw.source(node, name), axis_strides(lw, name)
    if found is None or shape[-1] != out_shape[-1] or (shape[-1] > 1 and found[1][-1] != 1):
        raise unsupported(node, f"input {name!r} {list(shape)} is not stored with its last "
                                f"axis contiguous and of the output's length")
    offset, strides = found
    shape = (1,) * (4 - len(shape)) + tuple(shape)
    strides = (0,) * (4 - len(strides)) + tuple(strides)
    strides = tuple(st if n > 1 else 0 for st, n in zip(strides, shape))
    block = tuple(out_shape)
    if shape[1] == shape[2] == 1:
        block = (shape[0], 1, 1, out_shape[3])
    return tensor, View(block, offset, strides[:3])


def _row_major_views(lw: Walk, node: Node, inputs: tuple[str, ...], y: str):
    """(tensor, View) of each input and of the output y, all in logical order, when an input of
    y's shape is `_row_major`: y is then row-major too, and the others broadcast over it by
    their Views (a mask [B, 1, 1, S] over heads and query rows, or a constant one); else
    None."""
    shape = lw.shape(y)
    if not any(_row_major(lw, x) and lw.shape(x) == shape for x in inputs):
        return None
    if any(lw.shape(x) == shape and not _row_major(lw, x) for x in inputs):
        # A row-major operand beside a channels-last map of the same shape (a value a
        # Transpose brought back): run channels-last, the row-major one copied into order.
        for x in inputs:
            if _row_major(lw, x):
                lw.in_order(node, x)
        return None
    views = [_logical_view(lw, node, x, shape) for x in inputs]
    ty = lw.new_tensor(y, Layout.row_major(shape))
    return (*views, (ty, View.dense(tuple(shape))))


def _broadcast_operand(lw: Walk, node: Node, op: str, negate_b: bool) -> None:
    """Add, Sub, Max or Min of two activations, one broadcast over the other: the one of the
    output's shape as a, the other as b (ADD's sum and extremum commute; Sub's negated rescale
    goes with its second input), a value per channel, per pixel or per image (of the same
    rank, or a 0-d scalar), as `_product`'s MUL."""
    a = int8_attrs(node)
    y = node.outputs[0]
    (x, x_zp, x_rescale), (z, z_zp, z_rescale) = (
        (name, int(a[f"{key}_zero_point"]),
         ((-1 if negate_b and key == "b" else 1) * int(a["multiplier"][i]), int(a["shift"][i])))
        for i, (name, key) in enumerate(zip(node.inputs[:2], "ab")))
    if lw.shape(x) != lw.shape(y):
        (x, x_zp, x_rescale), (z, z_zp, z_rescale) = (z, z_zp, z_rescale), (x, x_zp, x_rescale)
    y_block, z_block = block_shape(lw.shape(y)), block_shape(lw.shape(z))
    if lw.shape(x) != lw.shape(y) or len(lw.shape(z)) not in (0, len(lw.shape(y))) or \
            z_block[1:3] not in ((1, 1), y_block[1:3]) or z_block[3] not in (1, y_block[3]) or \
            z_block[0] not in (1, y_block[0]):
        raise unsupported(node, f"broadcasting {lw.shape(node.inputs[0])} with "
                                f"{lw.shape(node.inputs[1])}: only a value per channel, per "
                                f"pixel or per image broadcasts")
    views = lw.need_view(node, x), lw.need_view(node, z)
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)), planes_in_place=True)
    out_rescale = (int(a["multiplier"][2]), int(a["shift"][2]))
    ta, tb = lw.source(node, x), lw.source(node, z)
    lw.layers.append(AddLayer(
        node.name, ta, tb, ty, int(np.prod(y_block)), x_zp,
        z_zp, (x_rescale[0], z_rescale[0], out_rescale[0]),
        (x_rescale[1], z_rescale[1], out_rescale[1]), int(a["out_zero_point"]),
        _sum_clamp(node, a, y, lw), (*views, y_view or View.dense(y_block)), op,
        _planes(lw, ta, tb, ty)))


def lower_lut(lw: Walk, node: Node) -> None:
    """A LUT of the node's own int8 kernel run on all 256 codes of its one activation
    input (other inputs are constants: Clip's bounds, a scalar Add/Mul operand)."""
    activations = [i for i, n in enumerate(node.inputs)
                   if n and not lw.g.values[n].is_const]
    if len(activations) != 1:
        raise unsupported(node, "it has no single activation input")
    index = activations[0]
    x, y = node.inputs[index], node.outputs[0]
    x_wide, y_wide = (lw.g.type_of(n).dtype == "int16" for n in (x, y))
    if x_wide or y_wide:
        return _wide_lut(lw, node, x, y, x_wide, y_wide)
    if lw.g.type_of(x).dtype != "int8":
        raise unsupported(node, "its input is not int8")
    args = [INT8_CODES if i == index else (lw.g.values[n].const if n else None)
            for i, n in enumerate(node.inputs)]
    while args and args[-1] is None:
        args.pop()
    table = np.asarray(OPS[node.op].int8(*args, **int8_attrs(node)))
    if table.dtype != np.int8 or table.size != 256:
        raise unsupported(node, "its int8 kernel is not an elementwise int8 map")
    tensor = lw.source(node, x)
    part = x in lw.views
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)) if part
                             else lw.layouts[tensor])
    views = None
    if part or y_view is not None:  # a part of a buffer in or out: run over Views
        views = (lw.need_view(node, x), y_view or View.dense(block_shape(lw.shape(y))))
        tensor = lw.source(node, x)  # copied into order, maybe
    lw.layers.append(LutLayer(node.name, tensor, ty, lw.tensors[tensor].size_bytes
                                if views is None else views[0].size, table.reshape(256),
                                views))


def _wide_lut(lw: Walk, node: Node, x: str, y: str, x_wide: bool, y_wide: bool) -> None:
    """A table op with int16 codes in or out (`quantizer.wide`; an Add, Mul, ... by a scalar
    or a clamp too, in its table form, `int8.tabled`): one LUT layer over flat bytes with the
    node's own int16 table (its last input: the 256 codes' int16 outputs, LUT
    wide=1, or 257 knots an int16 input interpolates between, LUT in_wide=1, and 257 more in
    its window of finer knots, LUT zoom and origin: the node's `knots`), y a whole tensor
    (an int16 one two planes, the high one first). An int16 x is read where it is: a whole
    tensor, or a part of a buffer (an LSTM step's gate, a slice of its pre-activations)
    through its View, the low plane `Walk.planes` bytes after the high one, over flat bytes
    when the part is contiguous, else pixel by pixel; an int8 x that is a part of a buffer
    is copied out first, as it always was."""
    table = lw.g.values[node.inputs[-1]].const
    knots = tuple(node.attrs.get("knots", (0, 0)))
    entries = isa.lut_entries(int(x_wide), knots[0])
    tabled = OPS[node.op].quant in (Quant.LOOKUP, Quant.CHANNEL_LOOKUP) or \
        "table_of" in node.attrs  # an Add by a scalar, a clamp, ... as a table (`int8.tabled`)
    if not tabled or table is None or np.asarray(table).dtype != np.int16 or \
            np.size(table) != entries:
        raise unsupported(node, "its input or output is int16; only a table op of one table "
                                "(Sigmoid, HardSwish, an Add by a scalar, ...) reads or writes "
                                "int16 codes")
    tensor = lw.source(node, x)
    views, x_plane = None, 0
    if x in lw.views and x_wide:  # both planes through the part's View
        views = (lw.views[x], View.dense(block_shape(lw.shape(y))))
        x_plane = lw.planes[tensor]
        ty, _ = lw.output(y, Layout.channels_last(lw.shape(y)), in_place=False)
    else:
        if x in lw.views:  # an int8 part of a buffer: a dense copy of its own
            tensor = lw.own_copy(node, x)
        ty, _ = lw.output(y, lw.layouts[tensor], in_place=False)
    lw.layers.append(LutLayer(node.name, tensor, ty, math.prod(lw.shape(y)),
                              np.asarray(table, np.int16).reshape(entries), views,
                              wide=y_wide, in_wide=x_wide, knots=knots, x_plane=x_plane))


def lower_channel_lut(lw: Walk, node: Node) -> None:
    """PRelu, ChannelMap: one table (a scalar slope) is a LUT; a table per channel (the last
    input) is a LUT with a table per lane (per_lane=1), pixel by pixel over channel blocks."""
    tables = np.asarray(lw.g.values[node.inputs[-1]].const)
    if tables.shape[0] == 1:
        return lower_lut(lw, node)
    x, y = node.inputs[0], node.outputs[0]
    x_wide, y_wide = (lw.g.type_of(v).dtype == "int16" for v in (x, y))
    # int16 codes in or out (`quantizer.wide`): each channel's int16 entries, its knots for an
    # int16 x (`numerics.interpolate` per lane), in the same pixel-by-pixel walk.
    tables = tables.astype(np.int16 if x_wide or y_wide else np.int8)
    rank = len(lw.shape(x))
    if lw.g.type_of(x).dtype not in ("int8", "int16"):
        raise unsupported(node, "its input is not int8 or int16")
    if block_axis(rank, 1) != 3:
        raise unsupported(node, f"a table per channel of a rank-{rank} input (its channels "
                                f"are not the lanes)")
    if tables.shape[1] != isa.lut_entries(int(x_wide), 0):
        raise unsupported(node, f"tables of {tables.shape[1]} entries a channel; expected "
                                f"{isa.lut_entries(int(x_wide), 0)}")
    views = (lw.need_view(node, x),)
    tensor = lw.source(node, x)
    x_plane = lw.planes[tensor] if x_wide and x in lw.views else 0
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)))
    views += (y_view or View.dense(block_shape(lw.shape(y))),)
    lw.layers.append(LutLayer(node.name, tensor, ty, views[1].size, tables, views,
                              wide=y_wide, in_wide=x_wide, x_plane=x_plane))


def _scalar_operand(lw: Walk, node: Node) -> bool:
    """Whether one operand is a one-element constant: then the op is a map of the other."""
    return any(n and lw.g.values[n].is_const and lw.g.values[n].const.size == 1
               for n in node.inputs)


def lower_mul(lw: Walk, node: Node) -> None:
    """A LUT with a scalar constant operand; else the vector unit's MUL of two activations."""
    if _scalar_operand(lw, node):
        return lower_lut(lw, node)
    a = int8_attrs(node)
    _product(lw, node, int(a["a_zero_point"]), int(a["b_zero_point"]))


def lower_div(lw: Walk, node: Node) -> None:
    """A LUT with a scalar constant operand (k / b is one table); else the divisor's reciprocal
    table (the node's third input) as a LUT layer into a tensor of the node's own, and MUL."""
    if _scalar_operand(lw, node):
        return lower_lut(lw, node)
    a = int8_attrs(node)
    b, table = node.inputs[1], lw.g.values[node.inputs[2]].const
    source = lw.source(node, b)
    part = b in lw.views
    reciprocal = f"{node.name}/reciprocal"
    lw.tensors[reciprocal] = Tensor(reciprocal, int(np.prod(lw.shape(b), dtype=np.int64)))
    lw.layouts[reciprocal] = Layout.channels_last(lw.shape(b)) if part else lw.layouts[source]
    views = (lw.need_view(node, b), View.dense(block_shape(lw.shape(b)))) if part else None
    lw.layers.append(LutLayer(node.name, source, reciprocal, lw.tensors[reciprocal].size_bytes,
                              np.asarray(table, np.int8).reshape(256), views))
    _product(lw, node, int(a["a_zero_point"]), int(a["b_zero_point"]), reciprocal)


def _product(lw: Walk, node: Node, x_zp: int, z_zp: int, z_tensor: str | None = None) -> None:
    """MUL of the node's two operands: the one of the output's shape as a, the other as b, of
    the same shape or broadcast over the pixels (a squeeze-and-excitation gate [N, C, 1, 1]),
    the channels ([N, 1, H, W]) or both ([N, 1, 1, 1]). `z_tensor`: a dense tensor holding b's
    values in place of b's own (Div's reciprocals)."""
    (x, z), y = node.inputs[:2], node.outputs[0]
    if lw.g.values[x].is_const or (z_tensor is None and lw.g.values[z].is_const):
        return _constant_product(lw, node, (x, x_zp), (z, z_zp), z_tensor)
    ta = lw.source(node, x)
    tb = lw.source(node, z) if z_tensor is None else z_tensor
    if lw.shape(x) != lw.shape(y):  # the product commutes: the full-shape operand is a
        (x, x_zp, ta), (z, z_zp, tb) = (z, z_zp, tb), (x, x_zp, ta)
    if lw.shape(x) != lw.shape(y):
        raise unsupported(node, f"neither input has the output's shape {lw.shape(y)} "
                                f"({lw.shape(x)} and {lw.shape(z)})")

    def view(name: str, tensor: str) -> View:
        if tensor == lw.buffer.get(name):
            return lw.need_view(node, name)
        if not lw.layouts[tensor].same_bytes(Layout.channels_last(lw.shape(name))):
            raise unsupported(node, f"input {name!r} is in no strided order")
        return View.dense(block_shape(lw.shape(name)))

    # An int16 product's 8-bit clamp fields bound its high byte (`numerics.wide_clamp`).
    mult, shift, out_zp, qclamp = requant_params(node, 1, wide=True)
    common = (int(mult[0]), int(shift[0]), out_zp, qclamp)
    if lw.shape(z) == lw.shape(y):
        parts = x in lw.views or (z in lw.views and tb == lw.buffer.get(z))
        if parts or lw.layouts[ta].same_bytes(lw.layouts[tb]):
            ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)) if parts
                                   else lw.layouts[ta], planes_in_place=True)
            views = None
            if parts or y_view is not None:
                views = (view(x, ta), view(z, tb), y_view or View.dense(block_shape(lw.shape(y))))
            lw.layers.append(MulLayer(node.name, ta, tb, ty, math.prod(lw.shape(y))
                                      if views is None else views[2].size, x_zp, z_zp,
                                      *common, views, _planes(lw, ta, tb, ty)))
            return
    y_block, z_block = block_shape(lw.shape(y)), block_shape(lw.shape(z))
    if len(lw.shape(z)) != len(lw.shape(y)) or z_block[1:3] not in ((1, 1), y_block[1:3]):
        raise unsupported(node, f"broadcasting {lw.shape(z)} against {lw.shape(y)}: only a "
                                f"value per channel, per pixel or per image broadcasts")
    views = view(x, ta), view(z, tb)
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)), planes_in_place=True)
    lw.layers.append(MulLayer(node.name, ta, tb, ty, int(np.prod(y_block)), x_zp, z_zp,
                              *common, (*views, y_view or View.dense(y_block)),
                              _planes(lw, ta, tb, ty)))


def _planes(lw: Walk, *tensors: str) -> tuple[int, ...]:
    """Each tensor's bytes from its high plane to its low one (`Walk.planes`), 0 for int8
    codes: where a wide MUL finds an int16 operand's or writes an int16 product's low plane,
    through the same View as the high plane's."""
    return tuple(lw.planes.get(t, 0) for t in tensors)


def lower_softmax(lw: Walk, node: Node) -> None:
    """Softmax or LogSoftmax along the axis whose elements are contiguous in memory (the lanes
    of a row): the last axis of a row-major value of rank <= 3, the channels of a map, the last
    axis of a MatMul's row-major [B, H, S, N] (attention's scores: `_row_major_views`). Along
    another axis, through element copies around it (`_softmax_across`). The node's table
    holds the exp entries, and LogSoftmax's the log entries after them."""
    x, y = node.inputs[0], node.outputs[0]
    shape = lw.shape(x)
    a = int8_attrs(node)
    axis = a["axis"] % len(shape)
    dtype = lw.g.type_of(x).dtype
    # int16 codes out (`quantizer.wide`): two planes of a tensor of its own, as a LayerNorm's
    # (SOFTMAX out_wide; an int16 input's: `_wide_rows`).
    y_plane = math.prod(shape) if lw.g.type_of(y).dtype == "int16" else 0
    rows = _row_major_views(lw, node, (x,), y) \
        if dtype in ("int8", "int16") and axis == len(shape) - 1 else None
    if rows is None and len(shape) > 4:
        raise unsupported(node, f"it normalizes axis {axis} of a rank-{len(shape)} value; "
                                f"ranks up to 4 lower")
    if dtype not in ("int8", "int16"):
        raise unsupported(node, "its input is not int8")
    table = np.asarray(lw.g.values[node.inputs[1]].const, np.int32).reshape(-1)
    layer = functools.partial(
        SoftmaxLayer, node.name, table=table,
        log=table.size == numerics.EXP_ENTRIES + numerics.LOG_ENTRIES,
        shift=int(a.get("shift", 0)), out_zero_point=int(a["out_zero_point"]),
        y_plane=y_plane, fine_bits=int(a.get("fine_bits", 0)))
    if rows is not None:
        (tx, view), (ty, y_view) = rows
    elif block_axis(len(shape), axis) != 3:
        if dtype == "int16" or y_plane:
            raise unsupported(node, f"it normalizes axis {axis} of {list(shape)}, whose "
                                    f"elements are not contiguous: the copies around it move "
                                    f"8-bit codes only, and its input or output is int16")
        return _softmax_across(lw, node, axis, layer)
    else:
        view = lw.need_view(node, x)  # first: it may copy x into order, a new buffer
        tx = lw.source(node, x)
        ty, y_view = lw.output(y, Layout.channels_last(shape))
    x_plane = _wide_rows(lw, node, tx, (ty, y_view))
    lw.layers.append(layer(tx, ty, views=(view, y_view or View.dense(block_shape(shape))),
                           x_plane=x_plane))


def _wide_rows(lw: Walk, node: Node, tx: str, y_side) -> int:
    """A row op's (SOFTMAX, LAYERNORM) int16 planes: the bytes from the input's high plane to
    its low one in tensor `tx` that holds it (0 for int8 codes), read through the input's
    View (a Reshape of a Gemm's output) shifted by them; an int16 output (`y_side`: its
    tensor and View) a tensor of its own."""
    x, y = node.inputs[0], node.outputs[0]
    ty, y_view = y_side
    if lw.g.type_of(y).dtype == "int16" and (ty != y or (y_view is not None and y_view.offset)):
        raise unsupported(node, f"its int16 output {y!r} is a view of another tensor")
    if lw.g.type_of(x).dtype != "int16":
        return 0
    if tx not in lw.planes:
        raise unsupported(node, f"its int16 input {x!r} would need a copy into order (8-bit "
                                f"copies only)")
    return lw.planes[tx]


def lower_layer_norm(lw: Walk, node: Node) -> None:
    """LayerNormalization over the contiguous axis (the quantizer takes only the last): the
    rows of a row-major value or the channels of each pixel, by the vector unit's LAYERNORM,
    its int32 parameters the node's fourth input."""
    x, y = node.inputs[0], node.outputs[0]
    shape = lw.shape(x)
    # An int16 output (a residual Add's operand, `quantizer.wide.norm_copies`) is two planes
    # of a tensor of its own; an int16 input's: `_wide_rows`.
    y_plane = math.prod(shape) if lw.g.type_of(y).dtype == "int16" else 0
    rows = _row_major_views(lw, node, (x,), y)
    table = np.asarray(lw.g.values[node.inputs[3]].const, np.int32).reshape(-1)
    layer = functools.partial(SoftmaxLayer, node.name, table=table, log=False, shift=0,
                              out_zero_point=int(int8_attrs(node)["out_zero_point"]),
                              norm=True, y_plane=y_plane)
    if rows is not None:
        (tx, view), (ty, y_view) = rows
    elif block_axis(len(shape), len(shape) - 1) == 3:
        view = lw.need_view(node, x)  # first: it may copy x into order, a new buffer
        tx = lw.source(node, x)
        ty, y_view = lw.output(y, Layout.channels_last(shape))
    else:
        raise unsupported(node, f"it normalizes the last axis of {list(shape)}, whose elements "
                                "are not contiguous in memory")
    x_plane = _wide_rows(lw, node, tx, (ty, y_view))
    lw.layers.append(layer(tx, ty, views=(view, y_view or View.dense(block_shape(shape))),
                           x_plane=x_plane))


def _softmax_across(lw: Walk, node: Node, axis: int, layer) -> None:
    """Softmax along an axis that is not contiguous (a column of scores): x is copied element
    by element into a row-major tensor whose last axis is `axis`, normalized there, and copied
    back into y's own layout (two passes of one byte a row: correct, not fast)."""
    x, y = node.inputs[0], node.outputs[0]
    shape = lw.shape(x)
    lw.source(node, x)
    found = axis_strides(lw, x)
    if found is None:
        raise unsupported(node, f"input {x!r} is a view whose bytes are in no strided order")
    offset, strides = found
    order = [i for i in range(len(shape)) if i != axis] + [axis]
    turned = tuple(shape[i] for i in order)
    dense = Layout.row_major(turned).strides(turned)
    names = f"{node.name}/{x}/turned", f"{node.name}/turned"
    for name in names:
        lw.tensors[name] = Tensor(name, int(np.prod(turned, dtype=np.int64)))
        lw.layouts[name] = Layout.row_major(turned)
    lw.copy_elements(node, lw.source(node, x), offset, tuple(strides[i] for i in order),
                     turned, names[0], dense)
    block = View.dense((1,) * (4 - len(turned)) + turned)
    lw.layers.append(layer(*names, views=(block, block)))
    layout = Layout.channels_last(shape)
    ty = lw.new_tensor(y, layout)
    lw.copy_elements(node, names[1], 0, tuple(dense[order.index(i)] for i in range(len(shape))),
                     shape, ty, layout.strides(shape))


def _constant_product(lw: Walk, node: Node, x: tuple[str, int], z: tuple[str, int],
                      z_tensor: str | None) -> None:
    """MUL of an activation operand of the output's shape (or `z_tensor`, Div's reciprocals of
    z, when x is the constant numerator) by a constant one as b, read over a View that
    broadcasts it (`Walk.constant`): per lane, or with b_splat where it has one channel. An
    int16 operand, constant (an int16 product's: `quantize.mul`) or product is two planes of
    its tensor (MUL a_wide, b_wide, wide), as `_product`'s."""
    y = node.outputs[0]
    (k, k_zp), (active, a_zp) = (x, z) if lw.g.values[x[0]].is_const else (z, x)
    if z_tensor is not None and "int16" in (lw.g.type_of(active).dtype, lw.g.type_of(y).dtype):
        raise unsupported(node, "its input or output is int16; a Div's MUL by its reciprocals "
                                "reads and writes int8 codes")
    tensor = z_tensor or lw.source(node, active)
    if lw.shape(active) != lw.shape(y):
        raise unsupported(node, f"broadcasting its input {active!r} {lw.shape(active)} to "
                                f"{lw.shape(y)}")
    if z_tensor is not None:  # dense, in the order of z's own tensor
        if not lw.layouts[tensor].same_bytes(Layout.channels_last(lw.shape(active))):
            raise unsupported(node, f"input {active!r} is in no strided order")
        a_view = View.dense(block_shape(lw.shape(active)))
    else:
        a_view = lw.need_view(node, active)
    tb, b_view = lw.constant(node, k, lw.shape(y), over_channels=False)
    mult, shift, out_zp, qclamp = requant_params(node, 1, wide=True)
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)), planes_in_place=True)
    y_view = y_view or View.dense(block_shape(lw.shape(y)))
    lw.layers.append(MulLayer(node.name, tensor, tb, ty, y_view.size, a_zp, k_zp,
                              int(mult[0]), int(shift[0]), out_zp, qclamp,
                              (a_view, b_view, y_view), _planes(lw, tensor, tb, ty)))
