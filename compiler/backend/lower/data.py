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

**int16 values** (`quantizer.wide`) are two planes of their buffer, the high one first
(`Walk.planes`): a View places the high plane's elements and the low plane's lie the buffer's
plane size on, so slices, splits and reshapes of them are Views as of int8 codes, and every
copy (a Concat's input, a Transpose, a layout copy) moves each plane by its own identity LUT
(`Walk.copy_view`): twice the vector and DMA work of an int8 copy.
"""

from __future__ import annotations


import numpy as np

from dataclasses import replace

from compiler.backend.layers import (Binding, GatherLayer, Layout, Tensor, View, block_axis,
                                     block_shape, transpose_input_strides)
from compiler.graph.ir import Node
from compiler.graph.ops import OPS, Lower, int8_attrs
from compiler.graph.reference import slice_
from simulator.numerics import gather_index
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
    # An int16 input (`quantizer.wide`) is two planes of the tensor, the high one first.
    dtype = "int16" if lw.g.type_of(y).dtype == "int16" else "int8"
    plane = lw.tensors[y].size_bytes // 2 if dtype == "int16" else 0
    lw.inputs.append(Binding(x, y, shape, float(params.scale[0]),
                               int(params.zero_point[0]), layout.strides(shape),
                               dtype=dtype, plane=plane))


def lower_gather(lw: Walk, node: Node) -> None:
    """Gather of a constant table's rows by a model input's integer indices: an embedding
    lookup, the indexed DMA (a GatherLayer), the input bound as int32. Gather of an
    activation's entries by constant indices (one, or evenly spaced): a strided view of its
    buffer, copied when the channels are not contiguous (the CLS token's row)."""
    data, indices = node.inputs[:2]
    if lw.g.values[data].is_const:
        return _embedding(lw, node)
    positions = lw.g.values[indices].const
    if positions is None:
        raise unsupported(node, f"its indices {indices!r} are computed at run time; only a "
                                f"constant table's rows are gathered by run-time indices")
    x, y = data, node.outputs[0]
    shape, out = lw.shape(x), lw.shape(y)
    axis = int(int8_attrs(node)["axis"]) % len(shape)
    picked = gather_index(positions, shape[axis]).reshape(-1)
    step = int(picked[1] - picked[0]) if picked.size > 1 else 1
    if np.ndim(positions) > 1 or step < 1 or \
            not np.array_equal(picked, picked[0] + step * np.arange(picked.size)):
        raise unsupported(node, f"its indices {indices!r} are not one index or evenly "
                                f"increasing ones (no strided view picks them)")
    if not 1 <= len(out) <= 4:
        raise unsupported(node, f"its output has rank {len(out)} (ranks 1 to 4 lower)")
    found = axis_strides(lw, x)
    if found is None:
        raise unsupported(node, f"input {x!r} is a view whose bytes are in no strided order")
    offset, strides = found
    offset += int(picked[0]) * strides[axis]
    along = (step * strides[axis],) if np.ndim(positions) == 1 else ()
    _strided_value(lw, node, lw.source(node, x), offset,
                   strides[:axis] + along + strides[axis + 1:], out)


def _embedding(lw: Walk, node: Node) -> None:
    table, indices = node.inputs[:2]
    y = node.outputs[0]
    codes = lw.g.values[table].const
    if int(int8_attrs(node)["axis"]) % codes.ndim != 0 or codes.dtype != np.int8:
        raise unsupported(node, f"it gathers along an axis other than the first of its "
                                f"table {table!r}, or the table is no int8 codes")
    if indices not in lw.g.inputs:
        raise unsupported(node, f"its indices {indices!r} are computed (the indexed DMA reads "
                                f"a model input's, bound as int32)")
    if indices not in lw.buffer:  # the first reader binds the input
        shape = lw.shape(indices)
        lw.tensors[indices] = Tensor(indices, 4 * int(np.prod(shape, dtype=np.int64)))
        lw.layouts[indices] = Layout.row_major(shape)
        lw.buffer[indices] = indices
        lw.inputs.append(Binding(indices, indices, shape, 1.0, 0,
                                 Layout.row_major(shape).strides(shape, 4), dtype="int32"))
    lw.output(y, Layout.row_major(lw.shape(y)), in_place=False)
    lw.layers.append(GatherLayer(node.name, indices, y, codes.reshape(codes.shape[0], -1),
                                 int(np.prod(lw.shape(indices), dtype=np.int64))))


def _strided_value(lw: Walk, node: Node, tensor: str, offset: int, strides: tuple[int, ...],
                   shape: tuple[int, ...]) -> None:
    """Value y of `shape`, whose element (i, j, ...) is the byte at offset + i * strides[0] +
    ... of `tensor`: a View of it when the channels are contiguous, else a copy element by
    element into a tensor of its own."""
    y = node.outputs[0]
    block = block_shape(shape)
    blocked = _block_strides(shape, strides)
    if blocked[3] == 1:
        lw.alias(y, tensor, View(block, offset, blocked[:3]))
        return
    buffer = lw.new_tensor(y, Layout.channels_last(shape))
    lw.copy_elements(node, tensor, offset, strides, shape, buffer,
                     _block_strides(shape, (None,) * len(shape), View.dense(block)))


def lower_transpose(lw: Walk, node: Node) -> None:
    """A Transpose of a model input that alone reads it folds into the input's binding. Any
    other is its input's bytes read at permuted strides: a view, free, when they are already
    in the output's own order (channels-last, or row-major below rank 4: a flattened
    channels-last map's [1, C, HW] -> [1, HW, C] is); else an identity-table copy into a tensor
    of its own, whole channel blocks per local row when the channel (contiguous) axis stays
    in place, one element per row (the DMA gathers bytes at the channel stride) when it moves."""
    x, y = node.inputs[0], node.outputs[0]
    if y in lw.tensors:  # its producer, a MatMul of two activations, wrote it in place
        return
    shape = lw.shape(y)
    perm = tuple(node.attrs.get("perm") or reversed(range(len(shape))))
    tensor = lw.buffer.get(x)
    index = next((i for i, b in enumerate(lw.inputs) if b.tensor == tensor and tensor == x),
                 None)
    if index is not None and len(lw.g.users().get(x, ())) == 1 and x not in lw.g.outputs:
        layout = Layout.channels_last(shape)
        del lw.tensors[x], lw.layouts[x], lw.buffer[x]
        lw.new_tensor(y, layout)
        lw.inputs[index] = replace(lw.inputs[index], tensor=y, perm=perm,
                                   strides=transpose_input_strides(perm, layout.strides(shape)))
        return
    if not 1 <= len(shape) <= 4:
        raise unsupported(node, f"its output has rank {len(shape)} (ranks 1 to 4 lower)")
    lw.source(node, x)
    found = axis_strides(lw, x)
    if found is None:
        raise unsupported(node, f"input {x!r} is a view whose bytes are in no strided order")
    offset, x_strides = found
    strides = tuple(x_strides[axis] for axis in perm)  # of y's axes, in x's buffer
    if _only_activation_matmuls(lw, y):  # they read any strides: no copy
        lw.buffer[y] = lw.source(node, x)
        lw.strided[y] = (offset, strides)
        return
    block = block_shape(shape)
    dense = View.dense(block)
    blocked = _block_strides(shape, strides)
    if blocked[3] == 1 and all(s == d or n == 1 for s, d, n in
                               zip(blocked[:3], dense.strides, block[:3])):
        lw.buffer[y] = lw.source(node, x)
        lw.views[y] = View(block, offset, dense.strides)  # the whole buffer or a part of it
        return
    buffer = lw.new_tensor(y, Layout.channels_last(shape))
    if blocked[3] == 1 or block[3] == 1:
        lw.copy_view(node, lw.source(node, x), View(block, offset, blocked[:3]), buffer,
                     dense)
        return
    # The channel axis moves: copy element by element.
    lw.copy_elements(node, lw.source(node, x), offset, strides, shape, buffer,
                     _block_strides(shape, (None,) * len(shape), dense))


def axis_strides(lw: Walk, x: str) -> tuple[int, tuple[int, ...]] | None:
    """Where value x's logical element (i, j, ...) sits in its buffer: the byte offset and a
    stride per logical axis; None when no strides describe its order (a rank above 4)."""
    shape = lw.shape(x)
    if x in lw.strided:
        return lw.strided[x]
    if x in lw.views:
        view = lw.views[x]
        block = (*view.strides, 1)
        return view.offset, tuple(block[block_axis(len(shape), i)] for i in range(len(shape)))
    layout = lw.layouts[lw.buffer[x]]
    size = int(np.prod(shape, dtype=np.int64))
    position = np.empty(size, np.int64)  # logical flat index -> byte
    position[layout.order()] = np.arange(size, dtype=np.int64)
    position = position.reshape(shape)
    strides = tuple(int(position[tuple(1 if a == axis else 0 for a in range(len(shape)))])
                    if shape[axis] > 1 else 0 for axis in range(len(shape)))
    grid = sum(np.arange(n).reshape([-1 if a == axis else 1 for a in range(len(shape))]) * s
               for axis, (n, s) in enumerate(zip(shape, strides)))
    return (0, strides) if np.array_equal(position, np.broadcast_to(grid, shape)) else None


def _only_activation_matmuls(lw: Walk, y: str) -> bool:
    """Whether value y is read only by MatMuls of two activations, which load any strides (a
    corner-turning LOAD where the lanes are not contiguous; a host segment, its port's)."""
    users = lw.g.users().get(y, ())
    return (bool(users) and y not in lw.g.outputs and
            all(OPS[u.op].lower is Lower.MATMUL and
                not any(lw.g.values[i].is_const for i in u.inputs[:2]) for u in users))


def _block_strides(shape: tuple[int, ...], strides: tuple, dense: View | None = None) -> tuple:
    """Per-logical-axis strides arranged as a View's block (N, H, W, C); with `dense`, the
    other way: the dense View's strides of each logical axis."""
    rank = len(shape)
    if dense is not None:
        block = (*dense.strides, 1)
        return tuple(block[block_axis(rank, a)] for a in range(rank))
    block = [0, 0, 0, 1]
    for axis, stride in enumerate(strides):
        block[block_axis(rank, axis)] = stride if shape[axis] > 1 else \
            (1 if block_axis(rank, axis) == 3 else 0)
    return tuple(block)



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
    plane = 0
    if lw.g.type_of(x).dtype == "int16":  # two planes, the high one first (`quantizer.wide`)
        plane = lw.planes[tensor]
    lw.outputs.append(Binding(y, tensor, shape, float(params.scale[0]),
                                int(params.zero_point[0]), strides, offset=offset,
                                dtype="int16" if plane else "int8", plane=plane))


def lower_view(lw: Walk, node: Node) -> None:
    # Same bytes, another logical shape: the layout (dims, perm) describes the flat logical
    # order, which a view keeps, so it carries over unchanged. A part of a buffer (a slice)
    # is first copied to a tensor of its own.
    x = node.inputs[0]
    lw.buffer[node.outputs[0]] = lw.own_copy(node, x) if x in lw.views else \
        lw.source(node, x)
