"""Lowering rules for the array: Conv, Gemm and MatMul with a constant weight run as
convolutions (Gemm is a 1x1 convolution over M pixels of K channels); MatMul and Gemm of two
activations are `MatMulLayer`s, the second operand loaded as the stationary tile. Grouped and
depthwise convolutions expand to block-diagonal weight tiles whose all-zero blocks are skipped.

ConvTranspose runs as stride_h x stride_w ordinary convolutions, one per output phase, without
zeros in DRAM: the outputs (y, x) with y = r_h, r_h + s_h, ... and x = r_w, r_w + s_w, ... see
only the kernel taps of their phase, so phase (r_h, r_w) is a stride-1 convolution of the whole
input by those taps (flipped), written to a strided View of the output (its rows r_h, r_h + s_h,
... and columns likewise), as nearest upsampling writes its copies."""

from __future__ import annotations


import numpy as np

from compiler.backend.layers import (ConvLayer, Layout, MatMulLayer, Operand, View,
                                     block_shape)
from compiler.backend.lower.data import axis_strides
from compiler.graph.ir import Node
from compiler.graph.ops import OPS, Lower, int8_attrs, node_macs
from compiler.graph.reference import conv_transpose_pads, resolve_pads, transposed_weight
from compiler.backend.lower.walk import Walk, requant_params, unsupported
from simulator.numerics import wrap32


def lower_conv(lw: Walk, node: Node) -> None:
    a = int8_attrs(node)
    x, y = node.inputs[0], node.outputs[0]
    w = lw.g.values[node.inputs[1]].const
    if w is None or w.ndim != 4:
        raise unsupported(node, "only 2-D convolutions with constant weights lower")
    lw.need_channels_last(node, x)
    x_plane = lw.wide_input(node, x)
    n, cin, h, wd = lw.shape(x)
    _, cout, oh, ow = lw.shape(y)
    pads, out, strides, dilations = resolve_pads((h, wd), tuple(w.shape[2:]), a["strides"],
                                                 a["dilations"], a["pads"], a["auto_pad"])
    assert tuple(out) == (oh, ow)
    group = int(a["group"])
    dense = _expand_groups(_weight_codes(w), group, cin)
    bias = _bias(lw, node, 2, cout)
    wide = lw.g.type_of(y).dtype == "int16"  # REQUANT wide, each plane STOREd by its View
    y_tensor, y_view = lw.output(y, Layout.channels_last((n, cout, oh, ow)),
                                 planes_in_place=True)
    lw.layers.append(ConvLayer(
        node.name, lw.source(node, x), y_tensor,
        n, (h, wd), (oh, ow), cin, cout, tuple(w.shape[2:]), tuple(strides), tuple(dilations),
        (pads[0], pads[1], pads[2], pads[3]), int(a.get("x_zero_point", 0)), dense, bias,
        *requant_params(node, cout, wide), macs=node_macs(lw.g, node), group=group,
        x_view=lw.views.get(x), y_view=y_view, y_plane=lw.planes.get(y_tensor, 0),
        x_plane=x_plane))


def lower_conv_transpose(lw: Walk, node: Node) -> None:
    a = int8_attrs(node)
    x, y = node.inputs[0], node.outputs[0]
    w = lw.g.values[node.inputs[1]].const
    if w is None:
        raise unsupported(node, "only constant weights lower")
    if w.ndim != 4:
        raise unsupported(node, f"kernel_shape {list(w.shape[2:])} has {w.ndim - 2} spatial "
                                f"axes; only 2-D ConvTranspose lowers")
    lw.need_channels_last(node, x)
    x_plane = lw.wide_input(node, x)  # an int16 input: each phase streams both planes
    n, cin, h, wd = lw.shape(x)
    _, cout, oh, ow = lw.shape(y)
    pads, out, strides, dilations = conv_transpose_pads(
        (h, wd), w.shape[2:], a["strides"], a["dilations"], a["pads"], a["output_padding"],
        a["output_shape"], a["auto_pad"])
    assert tuple(out) == (oh, ow)
    group = int(a["group"])
    weight = transposed_weight(np.asarray(w, np.int8), group)  # (C_out, C_in / group, kh, kw)
    zero = int(a.get("x_zero_point", 0))
    full_sum = weight.astype(np.int64).sum(axis=(1, 2, 3))
    # The model's MACs are those of the channel pairs with weights: a ConvTranspose whose groups
    # `ungroup_conv_transpose` made block-diagonal counts its groups' only.
    pairs = int(np.count_nonzero(weight.any(axis=(2, 3))))
    bias = _bias(lw, node, 2, cout)
    wide = lw.g.type_of(y).dtype == "int16"  # each phase's REQUANT wide, STOREs by Views
    multiplier, shift, out_zero, qclamp = requant_params(node, cout, wide)
    y_tensor, y_view = lw.output(y, Layout.channels_last((n, cout, oh, ow)),
                                 planes_in_place=True)
    x_whole = lw.views.get(x) or View.dense(block_shape((n, cin, h, wd)))
    y_whole = y_view or View.dense(block_shape((n, cout, oh, ow)))
    rows = [_phase(r, h, oh, w.shape[2], strides[0], dilations[0], pads[0])
            for r in range(min(strides[0], oh))]
    cols = [_phase(r, wd, ow, w.shape[3], strides[1], dilations[1], pads[1])
            for r in range(min(strides[1], ow))]
    for (r_h, taps_h, dil_h, crop_h, pad_h, count_h) in rows:
        for (r_w, taps_w, dil_w, crop_w, pad_w, count_w) in cols:
            # A phase without taps on an axis sees none at all: its outputs are the bias,
            # requantized (a 1x1 convolution by zero weights).
            sub = weight[:, :, taps_h][:, :, :, taps_w] if taps_h and taps_w else \
                np.zeros((cout, cin // group, 1, 1), np.int8)
            phase_sum = sub.astype(np.int64).sum(axis=(1, 2, 3))
            # Taps outside the phase meet x's zero point (the inserted zeros), which the bias
            # already subtracts for every tap: give back the other phases' share.
            correction = zero * (full_sum - phase_sum)
            phase_bias = bias if not correction.any() else wrap32(
                (0 if bias is None else bias.astype(np.int64)) + correction).astype(np.int32)
            in_h, in_w = h - crop_h[0] - crop_h[1], wd - crop_w[0] - crop_w[1]
            x_view = None if (x not in lw.views and crop_h == crop_w == (0, 0)) else \
                x_whole.sub(1, crop_h[0], in_h).sub(2, crop_w[0], in_w)
            phase_view = y_view if strides == (1, 1) else \
                y_whole.sub(1, r_h, count_h, strides[0]).sub(2, r_w, count_w, strides[1])
            macs = n * count_h * count_w * pairs * int(np.prod(sub.shape[2:]))
            lw.layers.append(ConvLayer(
                node.name, lw.source(node, x), y_tensor, n, (in_h, in_w), (count_h, count_w),
                cin, cout, sub.shape[2:], (1, 1), (dil_h, dil_w),
                (pad_h[0], pad_w[0], pad_h[1], pad_w[1]), zero,
                _expand_groups(sub, group, cin), phase_bias, multiplier, shift, out_zero,
                qclamp, macs=macs, group=group, x_view=x_view, y_view=phase_view,
                y_plane=lw.planes.get(y_tensor, 0), x_plane=x_plane))


def _phase(r: int, size: int, out: int, kernel: int, stride: int, dilation: int,
           pad: int) -> tuple:
    """Output phase r of one spatial axis of a ConvTranspose as a stride-1 convolution:
    (r, its taps as indices of the flipped kernel, their dilation, the input's (begin, end)
    crop, the convolution's (begin, end) pads, its output count).

    Output o = r + stride * q takes input i at tap k when i * stride + k * dilation = o + pad,
    so each tap k of the phase reads input q + (r + pad - k * dilation) / stride: the taps in
    descending k (ascending in the flipped kernel) read ascending offsets, evenly spaced.
    Negative pads crop the input."""
    count = (out - r + stride - 1) // stride
    taps = [k for k in reversed(range(kernel)) if (r + pad - k * dilation) % stride == 0]
    offsets = [(r + pad - k * dilation) // stride for k in taps] or [0]
    taps = [kernel - 1 - k for k in taps]
    spacing = offsets[1] - offsets[0] if len(offsets) > 1 else 1
    span = offsets[-1] - offsets[0] + 1
    begin = -offsets[0]
    end = count - 1 + span - size - begin
    crop = (max(0, -begin), max(0, -end))
    return r, taps, spacing, crop, (max(0, begin), max(0, end)), count


def _weight_codes(w: np.ndarray) -> np.ndarray:
    """A constant weight's codes as the layer holds them: int8, or int16
    (`QuantOptions.int16_weights`), which the array reads as two int8 parts (four passes
    against an int16 input: `numerics.wide_passes`)."""
    return np.asarray(w, np.int16 if np.asarray(w).dtype == np.int16 else np.int8)


def _expand_groups(w: np.ndarray, group: int, cin: int) -> np.ndarray:
    """Grouped weights (M, C/g, kh, kw) → dense (M, C, kh, kw), zero outside each group."""
    if group == 1:
        return w
    m, cg = w.shape[:2]
    mg = m // group
    dense = np.zeros((m, cin) + w.shape[2:], w.dtype)
    for g in range(group):
        dense[g * mg:(g + 1) * mg, g * cg:(g + 1) * cg] = w[g * mg:(g + 1) * mg]
    return dense


def lower_gemm(lw: Walk, node: Node) -> None:
    a = int8_attrs(node)
    b = lw.g.values[node.inputs[1]].const
    if b is None and not lw.g.values[node.inputs[0]].is_const:
        return _activation_matmul(lw, node, (bool(a["transA"]), bool(a["transB"])))
    if a["transA"]:
        raise unsupported(node, "transA=1 is not supported")
    if b is None:
        raise unsupported(node, "a constant A times an activation B")
    weights = b if a["transB"] else b.T  # (N, K)
    _matmul(lw, node, weights, bias_index=2)


def lower_matmul(lw: Walk, node: Node) -> None:
    b = lw.g.values[node.inputs[1]].const
    if b is None and not lw.g.values[node.inputs[0]].is_const:
        return _activation_matmul(lw, node)
    if b is None or b.ndim != 2:
        raise unsupported(node, "only MatMul by a constant 2-D weight lowers")
    if a_zero := int(node.attrs.get("a_zero_point", 0)):
        raise unsupported(node, f"activation zero point {a_zero} is not folded")
    _matmul(lw, node, b.T, bias_index=2)


def _activation_matmul(lw: Walk, node: Node, transposed: tuple[bool, bool] = (False, False)
                       ) -> None:
    """A MatMul (or Gemm) of two activations (attention's Q·Kᵀ and P·V): one GEMM per index
    of the leading axes (numpy's broadcasting), each operand read in place at its own strides
    (a Gemm's transA/transB swap the last two), so a Transpose before it is free
    (`MatMulLayer`). Either operand, and the product, may be int16 (`quantizer.wide`): two
    planes each, at the same offsets in their buffers' two halves."""
    x, z, y = node.inputs[0], node.inputs[1], node.outputs[0]
    y_shape = lw.shape(y)
    if len(lw.shape(x)) < 2 or len(lw.shape(z)) < 2:
        raise unsupported(node, "a MatMul of two activations of rank 1 (rank >= 2 lowers)")
    if len(node.inputs) > 2 and node.inputs[2]:
        raise unsupported(node, f"a product of two activations with a bias input "
                                f"{node.inputs[2]!r}")
    a = int8_attrs(node)
    for name, zero in ((x, "a_zero_point"), (z, "b_zero_point")):
        if lw.g.type_of(name).dtype == "int16" and int(a.get(zero, 0)):
            raise unsupported(node, f"its int16 input {name!r} has zero point "
                                    f"{int(a.get(zero, 0))}; int16 operands are symmetric")
    wide = lw.g.type_of(y).dtype == "int16"
    multiplier, shift, out_zero, qclamp = requant_params(node, 1, wide)
    operands, shapes = [], []
    for name, swap in zip((x, z), transposed):
        shape = lw.shape(name)
        lw.source(node, name)
        found = axis_strides(lw, name)
        if found is None:
            raise unsupported(node, f"input {name!r} is a view whose bytes are in no strided "
                                    f"order")
        offset, strides = found
        # A leading axis the operand lacks, or has once, broadcasts: stride 0.
        leading = (0,) * (len(y_shape) - len(shape)) + tuple(
            s if size > 1 else 0 for s, size in zip(strides[:-2], shape[:-2]))
        offsets = tuple(offset + sum(i * s for i, s in zip(index, leading))
                        for index in np.ndindex(*y_shape[:-2]))
        rows, cols = (strides[-1], strides[-2]) if swap else (strides[-2], strides[-1])
        operands.append(Operand(lw.source(node, name), offsets, rows, cols))
        shapes.append((shape[-1], shape[-2]) if swap else shape[-2:])
    (m, k), (_, n) = shapes
    ty, y_strides = _product_place(lw, y)
    y_offsets = tuple(sum(i * s for i, s in zip(index, y_strides[:-2]))
                      for index in np.ndindex(*y_shape[:-2]))
    lw.layers.append(MatMulLayer(
        node.name, *operands, ty, y_offsets, y_strides[-2], m, k, n,
        int(a.get("a_zero_point", 0)), int(a.get("b_zero_point", 0)), int(multiplier[0]),
        int(shift[0]), out_zero, qclamp, macs=node_macs(lw.g, node),
        a_plane=lw.wide_input(node, x), b_plane=lw.wide_input(node, z),
        y_plane=lw.planes[ty] if wide else 0))


def _product_place(lw: Walk, y: str) -> tuple[str, tuple[int, ...]]:
    """Where a MatMul of two activations writes y, and y's strides there: its own row-major
    tensor; or, when a Transpose that keeps the last axis alone reads it (attention's heads
    merged back, [B, H, S, Dh] -> [B, S, H, Dh]), straight into that Transpose's row-major
    output, which then costs no copy (`lower_transpose` finds it written)."""
    shape = lw.shape(y)
    users = lw.g.users().get(y, ())
    if len(users) == 1 and OPS[users[0].op].lower is Lower.TRANSPOSE and \
            y not in lw.g.outputs:
        perm = tuple(users[0].attrs.get("perm") or reversed(range(len(shape))))
        if perm[-1] == len(shape) - 1:
            out = users[0].outputs[0]
            tensor = lw.new_tensor(out, Layout.row_major(lw.shape(out)))
            dense = Layout.row_major(lw.shape(out)).strides(lw.shape(out))
            strides = [0] * len(shape)
            for axis, stride in zip(perm, dense):
                strides[axis] = stride
            lw.buffer[y] = tensor
            lw.strided[y] = (0, tuple(strides))
            return tensor, tuple(strides)
    tensor = lw.new_tensor(y, Layout.row_major(shape))
    return tensor, Layout.row_major(shape).strides(shape)


def _matmul(lw: Walk, node: Node, weights: np.ndarray, bias_index: int) -> None:
    """A (M, K) @ W^T as a 1x1 convolution over M pixels of K channels (rows of A)."""
    x = node.inputs[0]
    shape = lw.shape(x)
    k = shape[-1]
    m = int(np.prod(shape[:-1], dtype=np.int64))
    n_out = weights.shape[0]
    tensor = lw.source(node, x)
    x_plane = lw.wide_input(node, x)
    weights = _weight_codes(weights)
    if x in lw.views:
        return _matmul_view(lw, node, weights, bias_index)
    if not _rows_contiguous(lw.layouts[tensor].order().reshape(m, k)):
        # Its bytes in another order (a host segment's row-major output read through a
        # Transpose): one strided copy into its own order, which this and later readers use.
        lw.in_order(node, x)
        tensor = lw.source(node, x)
    order = lw.layouts[tensor].order().reshape(m, k)
    if not _rows_contiguous(order):
        raise unsupported(node, f"input {x!r} is a view whose rows are not contiguous "
                                f"(a layout copy is not implemented)")
    # Physical feature j of every row is logical feature perm[j] (a flattened channels-last
    # map): permute the weight's K axis to match instead of copying the activation.
    perm = order[0] % k
    dense = weights[:, perm].reshape(n_out, k, 1, 1)
    _gemm_layer(lw, node, tensor, None, m, k, dense, bias_index, x_plane)


def _rows_contiguous(order: np.ndarray) -> bool:
    """Whether the (m, k) byte positions `order` of a matrix keep each row's k features
    together, every row in the same feature order."""
    m, k = order.shape
    return bool(np.array_equal(order // k, np.broadcast_to(np.arange(m)[:, None], (m, k)))
                and np.all(order % k == (order[0] % k)[None, :]))


def _matmul_view(lw: Walk, node: Node, weights: np.ndarray, bias_index: int) -> None:
    """The rows of A are a slice or a Concat part: M pixels at the view's pixel stride."""
    x = node.inputs[0]
    view, k = lw.views[x], lw.shape(x)[-1]
    n, h, w, _ = view.shape
    m = n * h * w
    dense = weights.reshape(weights.shape[0], k, 1, 1)
    if (w > 1 and h > 1 and view.row != w * view.pixel) or \
            (n > 1 and h * w > 1 and view.strides[0] != h * view.row):
        # Rows not evenly spaced (a crop of a rank-3 value): copy them together first.
        return _gemm_layer(lw, node, lw.own_copy(node, x), None, m, k, dense, bias_index)
    pixel = view.pixel if w > 1 else view.row if h > 1 else view.strides[0]
    rows = View((1, 1, m, k), view.offset, (m * pixel, m * pixel, pixel))
    _gemm_layer(lw, node, lw.source(node, x), rows, m, k, dense, bias_index)


def _gemm_layer(lw: Walk, node: Node, tensor: str, x_view: View | None, m: int, k: int,
                dense: np.ndarray, bias_index: int, x_plane: int = 0) -> None:
    y = node.outputs[0]
    n_out = dense.shape[0]
    bias = _bias(lw, node, bias_index, n_out)
    wide = lw.g.type_of(y).dtype == "int16"  # a projection into a residual stream
    # A matrix product writes M rows of N: a part of a Concat only as a rank-2 value.
    y_tensor, y_view = lw.output(y, Layout.row_major(lw.shape(y)),
                                   len(lw.shape(y)) <= 2 and not wide)
    lw.layers.append(ConvLayer(
        node.name, tensor, y_tensor, 1, (1, m), (1, m), k, n_out, (1, 1), (1, 1), (1, 1),
        (0, 0, 0, 0), 0, dense, bias, *requant_params(node, n_out, wide),
        macs=node_macs(lw.g, node), x_view=x_view, y_view=y_view,
        y_plane=m * n_out if wide else 0, x_plane=x_plane))


def _bias(lw: Walk, node: Node, index: int, channels: int) -> np.ndarray | None:
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    bias = lw.g.values[node.inputs[index]].const
    if bias is None:
        raise unsupported(node, "its bias is not constant")
    bias = np.asarray(bias, np.int64)
    if bias.size == 1:
        return np.full(channels, int(bias.ravel()[0]), np.int32)
    flat = bias.reshape(-1, bias.shape[-1]) if bias.ndim > 1 else bias.reshape(1, -1)
    if flat.shape[1] != channels or np.any(flat != flat[0]):
        raise unsupported(node, f"its bias of shape {bias.shape} is not per output channel")
    return flat[0].astype(np.int32)
