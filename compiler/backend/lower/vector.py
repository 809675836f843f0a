"""Lowering rules for the vector unit: MaxPool, AveragePool with one window size,
GlobalAveragePool, ReduceMean over H and W, GlobalMaxPool, Add and Sub, Mul of two activations
(one may be broadcast: a gate per channel, per pixel or per image), Div by an activation (a
reciprocal table and MUL); every single-input elementwise integer map (Relu,
Clip, Rescale, Sigmoid, Tanh, ..., and Add/Sub/Mul with a scalar constant operand) is a
256-entry LUT built by running the node's own int8 kernel on all 256 codes, so it is bit-exact
by construction."""

from __future__ import annotations


import numpy as np

from compiler.backend.layers import (AddLayer, Layout, LutLayer, MulLayer,
                                     PoolLayer, Tensor, View, block_axis, block_shape)
from compiler.graph.ir import Node
from compiler.graph.ops import OPS, int8_attrs
from compiler.graph.int8 import reduce_axes
from compiler.graph.reference import resolve_pads
from compiler.backend.lower.walk import Walk, requant_params, unsupported
from simulator import isa


INT8_MIN = -128


def _pool(lw: Walk, node: Node, average: bool, kernel, strides, pads, pad_value,
          out_hw: tuple[int, int] | None = None, **params):
    """A pooling layer; `out_hw` when the output's own shape does not say it (a mean without
    keepdims)."""
    x, y = node.inputs[0], node.outputs[0]
    lw.need_channels_last(node, x)
    n, c, h, w = lw.shape(x)
    oh, ow = out_hw or lw.shape(y)[2:]
    y_tensor, y_view = lw.output(y, Layout.channels_last((n, c, oh, ow)))
    lw.layers.append(PoolLayer(
        node.name, lw.source(node, x), y_tensor,
        n, (h, w), (oh, ow), c, tuple(kernel), tuple(strides), tuple(pads), pad_value,
        average, **params, x_view=lw.views.get(x), y_view=y_view))


def _window(lw: Walk, node: Node, a: dict, ceil_mode: int):
    x = node.inputs[0]
    h, w = lw.shape(x)[2:]
    if a.get("dilations") and any(d != 1 for d in a["dilations"]):
        raise unsupported(node, "dilated pooling windows are not supported")
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
    Negative pads crop: the pool reads a View of the kept part."""
    x, y = node.inputs[0], node.outputs[0]
    mode = int8_attrs(node)["mode"]
    if mode != "constant":
        raise unsupported(node, f"its mode {mode!r} (only constant padding lowers)")
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
    kernel, strides, pads = _window(lw, node, a, a["ceil_mode"])
    _pool(lw, node, False, kernel, strides, pads, INT8_MIN)


def lower_average_pool(lw: Walk, node: Node) -> None:
    a = int8_attrs(node)
    if len(a["counts"]) != 1:
        raise unsupported(node, f"its windows have {len(a['counts'])} different sizes "
                                f"{list(a['counts'])} (one multiplier per layer lowers)")
    kernel, strides, pads = _window(lw, node, a, a["ceil_mode"])
    mult, shift, out_zp, qclamp = requant_params(node, 1)
    _pool(lw, node, True, kernel, strides, pads, int(a.get("x_zero_point", 0)),
               multiplier=int(mult[0]), shift=int(shift[0]), out_zero_point=out_zp,
               qclamp=qclamp)


def lower_global_average_pool(lw: Walk, node: Node) -> None:
    a = int8_attrs(node)
    h, w = lw.shape(node.inputs[0])[2:]
    mult, shift, out_zp, qclamp = requant_params(node, 1)
    _pool(lw, node, True, (h, w), (1, 1), (0, 0, 0, 0), int(a.get("x_zero_point", 0)),
               multiplier=int(mult[0]), shift=int(shift[0]), out_zero_point=out_zp,
               qclamp=qclamp)


def lower_reduce_mean(lw: Walk, node: Node) -> None:
    """A mean over H, W or both of an N x C x H x W map is the average pool of that window (the
    global one over both); without keepdims only over both, whose N x C result has the bytes
    of the pool's N x C x 1 x 1."""
    a = int8_attrs(node)
    shape = lw.shape(node.inputs[0])
    given = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    axes = set(reduce_axes(len(shape), lw.g.values[given].const if given else None,
                           a["noop_with_empty_axes"]))
    if len(shape) != 4 or not axes or not axes <= {2, 3} or (
            not a["keepdims"] and axes != {2, 3}):
        raise unsupported(node, f"it averages axes {sorted(axes)} of a rank-{len(shape)} value; "
                                f"only H and W of an N x C x H x W map lower (both, without "
                                f"keepdims)")
    h, w = shape[2:]
    kernel = (h if 2 in axes else 1, w if 3 in axes else 1)
    mult, shift, out_zp, qclamp = requant_params(node, 1)
    _pool(lw, node, True, kernel, (1, 1), (0, 0, 0, 0), int(a.get("x_zero_point", 0)),
          out_hw=(h // kernel[0], w // kernel[1]), multiplier=int(mult[0]),
          shift=int(shift[0]), out_zero_point=out_zp, qclamp=qclamp)


def lower_global_max_pool(lw: Walk, node: Node) -> None:
    h, w = lw.shape(node.inputs[0])[2:]
    _pool(lw, node, False, (h, w), (1, 1), (0, 0, 0, 0), INT8_MIN)


def lower_add(lw: Walk, node: Node) -> None:
    if _scalar_operand(lw, node):
        return lower_lut(lw, node)
    _add(lw, node, negate_b=False)


def lower_sub(lw: Walk, node: Node) -> None:
    if _scalar_operand(lw, node):
        return lower_lut(lw, node)
    _add(lw, node, negate_b=True)


def _add(lw: Walk, node: Node, negate_b: bool) -> None:
    a = int8_attrs(node)
    x, z, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if lw.shape(x) != lw.shape(y) or lw.shape(z) != lw.shape(y):
        raise unsupported(node, f"broadcasting {lw.shape(x)} with {lw.shape(z)}")
    ta, tb = lw.source(node, x), lw.source(node, z)
    parts = x in lw.views or z in lw.views
    if not parts and not lw.layouts[ta].same_bytes(lw.layouts[tb]):
        raise unsupported(node, "its inputs are stored in different orders")
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)) if parts
                             else lw.layouts[ta])
    views = None
    if parts or y_view is not None:  # some operand is a part of a buffer: run over Views
        views = (lw.need_view(node, x), lw.need_view(node, z),
                 y_view or View.dense(block_shape(lw.shape(y))))
    mult = list(a["multiplier"])
    if negate_b:  # sub_int8: an ADD whose b rescale is negated
        mult[1] = -mult[1]
    qclamp = tuple(int(q) for q in (a.get("qclamp") or (-128, 127)))
    lw.layers.append(AddLayer(
        node.name, ta, tb, ty, lw.tensors[ty].size_bytes if views is None else
        views[2].size, int(a["a_zero_point"]), int(a["b_zero_point"]),
        tuple(int(m) for m in mult), tuple(int(s) for s in a["shift"]),
        int(a["out_zero_point"]), qclamp, views))


def lower_lut(lw: Walk, node: Node) -> None:
    """A LUT of the node's own int8 kernel run on all 256 codes of its one activation
    input (other inputs are constants: Clip's bounds, a scalar Add/Mul operand)."""
    activations = [i for i, n in enumerate(node.inputs)
                   if n and not lw.g.values[n].is_const]
    if len(activations) != 1:
        raise unsupported(node, "it has no single activation input")
    index = activations[0]
    x, y = node.inputs[index], node.outputs[0]
    if lw.g.type_of(x).dtype != "int8":
        raise unsupported(node, "its input is not int8")
    codes = np.arange(-128, 128, dtype=np.int8)
    args = [codes if i == index else (lw.g.values[n].const if n else None)
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
    lw.layers.append(LutLayer(node.name, tensor, ty, lw.tensors[tensor].size_bytes
                                if views is None else views[0].size, table.reshape(256),
                                views))


def lower_channel_lut(lw: Walk, node: Node) -> None:
    """PRelu: one table (a scalar slope) is a LUT; a table per channel is a LUT with a table
    per lane (per_lane=1), pixel by pixel over channel blocks."""
    tables = np.asarray(lw.g.values[node.inputs[2]].const, np.int8)
    if tables.shape[0] == 1:
        return lower_lut(lw, node)
    x, y = node.inputs[0], node.outputs[0]
    rank = len(lw.shape(x))
    if lw.g.type_of(x).dtype != "int8":
        raise unsupported(node, "its input is not int8")
    if block_axis(rank, 1) != 3:
        raise unsupported(node, f"a table per channel of a rank-{rank} input (its channels "
                                f"are not the lanes)")
    views = (lw.need_view(node, x),)
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)))
    views += (y_view or View.dense(block_shape(lw.shape(y))),)
    lw.layers.append(LutLayer(node.name, lw.source(node, x), ty, views[1].size, tables, views))


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

    mult, shift, out_zp, qclamp = requant_params(node, 1)
    common = (int(mult[0]), int(shift[0]), out_zp, qclamp)
    if lw.shape(z) == lw.shape(y):
        parts = x in lw.views or (z in lw.views and tb == lw.buffer.get(z))
        if parts or lw.layouts[ta].same_bytes(lw.layouts[tb]):
            ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)) if parts
                                   else lw.layouts[ta])
            views = None
            if parts or y_view is not None:
                views = (view(x, ta), view(z, tb), y_view or View.dense(block_shape(lw.shape(y))))
            lw.layers.append(MulLayer(node.name, ta, tb, ty, lw.tensors[ty].size_bytes
                                      if views is None else views[2].size, x_zp, z_zp,
                                      *common, views))
            return
    y_block, z_block = block_shape(lw.shape(y)), block_shape(lw.shape(z))
    if len(lw.shape(z)) != len(lw.shape(y)) or z_block[1:3] not in ((1, 1), y_block[1:3]):
        raise unsupported(node, f"broadcasting {lw.shape(z)} against {lw.shape(y)}: only a "
                                f"value per channel, per pixel or per image broadcasts")
    views = view(x, ta), view(z, tb)
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)))
    lw.layers.append(MulLayer(node.name, ta, tb, ty, int(np.prod(y_block)), x_zp, z_zp,
                              *common, (*views, y_view or View.dense(y_block))))
