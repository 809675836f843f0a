"""Lowering rules for data movement: views, slices, Split, Concat, and the model's bindings.

**Slices and Concat without copies** (`compiler.backend.layers.View`). Slice (constant starts, ends,
axes; forward steps, 1 on channels) and Split outputs are views: an offset and strides over
their producer's buffer, which convolutions, pools, Add/LUT (pixel by pixel) and output
bindings read in place. Concat's inputs are planned before the walk (`walk.plan_concats`): one
computed by a layer and read by the Concat alone is written by its producer straight into its
part of the Concat's one buffer (copy elimination, as in Glow; nested Concats share the
outermost's buffer); any other input (a model input, a view, a value read twice) is copied there
by an identity LUT. A Reshape-like view of a slice is copied to a tensor of its own first.
QuantizeLinear at a model input and DequantizeLinear at a model output stay on the host: the
program's I/O bindings carry their scale and zero point. A Transpose of a model input (an NHWC
model's first node) is its binding's strides, permuted: the input DMA writes the user's array
straight into the channels-last order the first layer reads.
"""

from __future__ import annotations


import numpy as np

from dataclasses import replace

from compiler.backend.layers import Binding, Layout, block_axis, transpose_input_strides
from compiler.graph.ir import Node
from compiler.graph.ops import int8_attrs
from compiler.graph.reference import slice_
from compiler.backend.lower.walk import Walk, unsupported


def lower_slice(lw: Walk, node: Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    params = [lw.g.values[n].const if n else None for n in node.inputs[1:]]
    if any(n and p is None for n, p in zip(node.inputs[1:], params)):
        raise unsupported(node, "its starts, ends, axes and steps must be constants")
    while params and params[-1] is None:
        params.pop()
    view, shape = lw.need_view(node, x), lw.shape(x)
    for axis in range(len(shape)):
        # The reference's own index arithmetic, run on this axis's coordinates.
        grid = np.broadcast_to(np.arange(shape[axis]).reshape(
            [-1 if a == axis else 1 for a in range(len(shape))]), shape)
        picked = slice_(grid, *params)
        if picked.size == 0:
            raise unsupported(node, f"it selects nothing from {x!r}")
        coords = picked[tuple(slice(None) if a == axis else 0 for a in range(len(shape)))]
        start, count = int(coords[0]), len(coords)
        step = int(coords[1] - coords[0]) if count > 1 else 1
        if step < 1 or not np.array_equal(coords, start + step * np.arange(count)):
            raise unsupported(node, f"its step {step} on axis {axis} is not forward")
        if (start, count, step) == (0, shape[axis], 1):
            continue
        try:
            view = view.sub(block_axis(len(shape), axis), start, count, step)
        except ValueError:
            raise unsupported(node, f"a channel step of {step} (channels are contiguous "
                                    f"in memory; a view cannot skip them)") from None
    lw.alias(y, lw.source(node, x), view)


def lower_split(lw: Walk, node: Node) -> None:
    x = node.inputs[0]
    view, shape = lw.need_view(node, x), lw.shape(x)
    axis = int(int8_attrs(node)["axis"]) % len(shape)
    start = 0
    for y in node.outputs:
        count = lw.shape(y)[axis]
        lw.alias(y, lw.source(node, x),
                   view.sub(block_axis(len(shape), axis), start, count))
        start += count


def lower_concat(lw: Walk, node: Node) -> None:
    """Inputs planned in place were written into their parts by their producers; the
    others (model inputs, views, values read twice or by other nodes) are copied."""
    y = node.outputs[0]
    shape = lw.shape(y)
    if not 1 <= len(shape) <= 4:
        raise unsupported(node, f"its output has rank {len(shape)} (ranks 1 to 4 lower)")
    axis = int(node.attrs["axis"]) % len(shape)
    buffer, view = lw.place(y)
    lw.alias(y, buffer, view)
    start = 0
    for x in node.inputs:
        count = lw.shape(x)[axis]
        part = view.sub(block_axis(len(shape), axis), start, count)
        start += count
        if lw.buffer.get(x) == buffer and lw.view_of(x) == part:
            continue
        lw.copy(node, x, buffer, part)


def lower_quantize(lw: Walk, node: Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    params = lw.quant(y)
    shape = lw.shape(y)
    layout = Layout.channels_last(shape)
    lw.new_tensor(y, layout)
    lw.inputs.append(Binding(x, y, shape, float(params.scale[0]),
                               int(params.zero_point[0]), layout.strides(shape)))


def lower_transpose(lw: Walk, node: Node) -> None:
    """Fold a Transpose of a model input into the input's binding; no other Transpose lowers
    (a permuting copy is not implemented)."""
    x, y = node.inputs[0], node.outputs[0]
    tensor = lw.buffer.get(x)
    index = next((i for i, b in enumerate(lw.inputs) if b.tensor == tensor and tensor == x),
                 None)
    if index is None or len(lw.g.users().get(x, ())) != 1 or x in lw.g.outputs:
        raise unsupported(node, "only a Transpose that alone reads a model input lowers (into "
                                "the input's DMA); a permuting copy is not implemented")
    shape = lw.shape(y)
    perm = node.attrs.get("perm") or tuple(reversed(range(len(shape))))
    layout = Layout.channels_last(shape)
    del lw.tensors[x], lw.layouts[x], lw.buffer[x]
    lw.new_tensor(y, layout)
    lw.inputs[index] = replace(lw.inputs[index], tensor=y, perm=tuple(perm),
                               strides=transpose_input_strides(perm, layout.strides(shape)))


def lower_dequantize(lw: Walk, node: Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    params = lw.quant(x)
    tensor = lw.source(node, x)
    shape = lw.shape(x)
    strides, offset = lw.layouts[tensor].strides(shape), 0
    if x in lw.views:  # a part of a buffer: its View's strides, in logical axis order
        view = lw.views[x]
        block = (*view.strides, 1)
        strides = tuple(block[block_axis(len(shape), i)] for i in range(len(shape)))
        offset = view.offset
    if strides is None:  # with allow_host, the host dequantizes it (and reorders it)
        raise unsupported(node, f"output {y!r} is a view of {tensor!r} whose byte order "
                                f"no strided binding describes (a layout copy is not "
                                f"implemented)")
    lw.outputs.append(Binding(y, tensor, shape, float(params.scale[0]),
                                int(params.zero_point[0]), strides, offset=offset))


def lower_view(lw: Walk, node: Node) -> None:
    # Same bytes, another logical shape: the layout (dims, perm) describes the flat logical
    # order, which a view keeps, so it carries over unchanged. A part of a buffer (a slice)
    # is first copied to a tensor of its own.
    x = node.inputs[0]
    lw.buffer[node.outputs[0]] = lw.own_copy(node, x) if x in lw.views else \
        lw.source(node, x)
