"""Code generation for the vector unit's layers:

- **Pooling**: the padded window block is loaded (padding -128 for max, the zero point for
  average) and one MAXPOOL/AVGPOOL produces the tile.
- **Add/Sub, Mul and LUT**: over the tensor's bytes in rows of `arch.lanes`, the full rows in
  one transfer and a last partial row in another; over Views pixel by pixel (one channel block
  per row) when an operand is strided or broadcast: a gate of one value per channel is one
  row for the whole tile (MUL b_step=0, ADD b_once=1), one value per pixel or image lane 0
  of its row (b_splat=1). An int16 operand, sum, product or table output is two planes of
  the tensor, the low one `size` bytes after the high one (an Add's, a Mul's or a table's
  input: its tensor's plane, through the same View), each moved by its own transfers into
  rows after the high plane's; an int16 table loads as its high bytes' rows, then its low
  bytes'.
- **Softmax**: a tile of pixels, each pixel's channel blocks loaded into one region per block
  (the SOFTMAX stride), one SOFTMAX over all of them, one STORE per block; the int32 table loads
  into the accumulator once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from compiler.backend.codegen.emit import (Context, input_window, instruction, load_acc_rows,
                                           load_window, pixel_tile_grid)
from compiler.backend.layers import (AddLayer, LutLayer, MulLayer, PoolLayer, SoftmaxLayer,
                                     View, pixelwise)
from compiler.backend.memory import ImageBuilder
from compiler.backend.steps import Op, Step
from compiler.backend.tiling import (ElementwiseTiles, PoolTiles, SoftmaxTiles, ceil_div,
                                     conv_input_extent)
from simulator import isa, numerics

# --- pooling --------------------------------------------------------------------------------


def pool_steps(layer: PoolLayer, tiles: PoolTiles, ctx: Context,
               image: ImageBuilder) -> list[Step]:
    arch, node = ctx.arch, layer.node
    (kh, kw), (sh, sw) = layer.kernel, layer.strides
    (h, w), c = layer.in_hw, layer.channels
    cb = tiles.channel_block
    pending = []
    param_row = None
    if layer.average:
        addr = image.add(isa.ParamBlock([layer.multiplier] * arch.lanes,
                                    [layer.shift] * arch.lanes).pack(arch.lanes))
        param_row = tiles.params.base
        pending.append(load_acc_rows(node, arch, param_row, addr, isa.ParamBlock.rows()))
    steps, count = [], 0
    for image_index, y0, th, x0, tw in pixel_tile_grid(layer.batch, layer.out_hw, tiles.tile_hw):
        ih, iw = conv_input_extent(th, sh, kh, 1), conv_input_extent(tw, sw, kw, 1)
        win = input_window((h, w), (y0 * sh, x0 * sw), (ih, iw), layer.pads[:2])
        for c0 in range(0, c, cb):
            n = min(cb, c - c0)
            in_row, out_row = ctx.buffer(tiles.inputs, count), ctx.buffer(tiles.outputs, count)
            count += 1
            kept = ctx.on_chip.get(layer.x)
            if kept is not None:  # its producer left the whole input in these rows
                in_row = kept.row(-kept.top, -kept.left, c0, image_index)
            loads = pending + ([] if kept is not None else
                               [load_window(node, ctx, layer.x, view, image_index, win, c0, n,
                                            in_row + plane * ih * iw, pad)
                                for plane, (view, pad) in enumerate(_planes(
                                    layer.in_view, layer.x_plane, layer.pad_value))])
            pending = []
            window = dict(src=in_row, dst=out_row, in_h=ih, in_w=iw, kh=kh, kw=kw, sh=sh, sw=sw)
            if layer.average:
                qmin, qmax = layer.qclamp
                pool = instruction(node, isa.AVGPOOL, **window, param=param_row,
                           in_offset=0 if layer.x_plane else layer.pad_value,
                           out_offset=layer.out_zero_point, qmin=qmin, qmax=qmax,
                           in_wide=int(bool(layer.x_plane)), wide=int(bool(layer.y_plane)))
            else:
                pool = instruction(node, isa.MAXPOOL, **window, wide=int(bool(layer.x_plane)))
            stores = tuple(
                instruction(node, isa.STORE, ctx.access(layer.y, True, view if layer.y_view
                                                        else None),
                            mem="scratchpad", sram=out_row + plane * th * tw,
                            dram=view.at(image_index, y0, x0, c0), y_size=th, x_size=tw,
                            elem_bytes=n, x_stride=view.pixel, y_stride=view.row)
                for plane, (view, _) in enumerate(_planes(layer.out_view, layer.y_plane, 0)))
            body = (pool, *stores)
            if tiles.inputs.count == 1:  # one buffer: the window loads after the last pool
                body = (*(op for op in loads if op.args["mem"] == "scratchpad"), *body)
                loads = [op for op in loads if op.args["mem"] != "scratchpad"]
            steps.append(Step(tuple(loads), body))
    return steps


def _planes(view: View, plane: int, pad: int) -> list[tuple[View, int]]:
    """The View of each plane of a pool's operand and the code each pads with: the int8 codes'
    own, or an int16 value's high plane and its low plane `plane` bytes on, each padded with
    its byte of the int16 code `pad` (`numerics.split_wide`)."""
    if not plane:
        return [(view, pad)]
    high, low = (int(p) for p in numerics.split_wide(pad))
    return [(view, high), (dataclasses.replace(view, offset=view.offset + plane), low)]


# --- elementwise ----------------------------------------------------------------------------


def _flat_rows(node: str, ctx: Context, row: isa.InsnDef, tensor: str, sram: int, r0: int,
               rows: int, total_bytes: int, write: bool, view: View | None = None,
               plane: int = 0) -> list[Op]:
    """Rows [r0, r0 + rows) of a tensor's bytes in lanes-wide rows: the full rows in one
    transfer, a last partial row in another. `view`: a contiguous part of the tensor; `plane`:
    the bytes before the part (an int16 value's low plane)."""
    lanes = ctx.arch.lanes
    base = r0 * lanes + (view.offset if view is not None else 0) + plane
    full = min(rows, total_bytes // lanes - r0)
    rest = total_bytes - (r0 + full) * lanes if r0 + rows > total_bytes // lanes else 0
    access = ctx.access(tensor, write, view)
    ops = []
    if full > 0:
        ops.append(instruction(node, row, access, mem="scratchpad", sram=sram, dram=base, y_size=full,
                       x_size=1, elem_bytes=lanes, x_stride=lanes, y_stride=lanes))
    if rest > 0:
        ops.append(instruction(node, row, access, mem="scratchpad", sram=sram + max(full, 0),
                       dram=base + max(full, 0) * lanes, y_size=1, x_size=1, elem_bytes=rest,
                       x_stride=rest, y_stride=rest))
    return ops


def _work(layer: AddLayer | MulLayer | LutLayer, tiles: ElementwiseTiles, src: int,
          b: int | None, dst: int, rows: int, table: int | None = None) -> Op:
    """The vector instruction of one tile: ADD, MUL or LUT from rows src (and b) to dst;
    `table`: the rows of a per-channel LUT's table (else the layer's one table)."""
    if isinstance(layer, LutLayer):
        return instruction(layer.node, isa.LUT, src=src, dst=dst, rows=rows,
                           table=tiles.table.base if table is None else table,
                           per_lane=int(layer.per_channel), wide=int(layer.wide),
                           in_wide=int(layer.in_wide), zoom=layer.knots[0],
                           origin=layer.knots[1])
    qmin, qmax = layer.qclamp
    common = dict(a=src, b=b, dst=dst, rows=rows, param=tiles.params.base,
                  a_offset=layer.a_zero_point, b_offset=layer.b_zero_point,
                  out_offset=layer.out_zero_point, qmin=qmin, qmax=qmax)
    if isinstance(layer, AddLayer):
        return instruction(layer.node, isa.ADD, **common, op=layer.op,
                           b_once=int(not layer.b_pixels), b_splat=int(not layer.b_channels),
                           wide=int(layer.wide), a_wide=int(layer.a_wide),
                           b_wide=int(layer.b_wide))
    return instruction(layer.node, isa.MUL, **common, b_step=int(layer.b_pixels),
                       b_splat=int(not layer.b_channels), wide=int(layer.wide),
                       a_wide=int(layer.a_wide), b_wide=int(layer.b_wide))


def _plane_bytes(layer: AddLayer | MulLayer | LutLayer) -> tuple[int, int, int]:
    """The bytes from the high plane to the low one of the first operand, the second and the
    result in their tensors, 0 for int8 codes: a LutLayer's int16 y is whole (`size` codes a
    plane) and its x whole or a View (`LutLayer.x_plane`), an AddLayer's and a MulLayer's
    operands and results may be Views (`AddLayer.planes`)."""
    if isinstance(layer, LutLayer):
        return ((layer.x_plane or layer.size) if layer.in_wide else 0, 0,
                layer.size if layer.wide else 0)
    return layer.planes


def _param_block(layer: AddLayer | MulLayer) -> isa.ParamBlock:
    if isinstance(layer, AddLayer):
        return isa.ParamBlock(layer.multipliers, layer.shifts)
    return isa.ParamBlock([layer.multiplier], [layer.shift])


def elementwise_steps(layer: AddLayer | MulLayer | LutLayer, tiles: ElementwiseTiles,
                      ctx: Context, image: ImageBuilder) -> list[Step]:
    arch, node = ctx.arch, layer.node
    lanes = arch.lanes
    total_rows = ceil_div(layer.size, lanes)
    binary = not isinstance(layer, LutLayer)
    pending = []
    if binary:
        addr = image.add(_param_block(layer).pack(arch.lanes))
        pending.append(load_acc_rows(node, arch, tiles.params.base, addr,
                                     isa.ParamBlock.rows()))
    elif not layer.per_channel:  # a table per channel block loads in _pixel_steps
        table_rows = tiles.table.rows
        addr = image.add(_table_bytes(layer, lanes))
        pending.append(instruction(node, isa.LOAD, mem="scratchpad", sram=tiles.table.base, dram=addr,
                           y_size=table_rows, x_size=1, elem_bytes=lanes, x_stride=lanes,
                           y_stride=lanes))
    if pixelwise(layer):
        return _pixel_steps(layer, tiles, ctx, image, pending)
    views = layer.views or (None, None, None)
    steps = []
    for count, r0 in enumerate(range(0, total_rows, tiles.tile_rows)):
        rows = min(tiles.tile_rows, total_rows - r0)
        a_row, out_row = ctx.buffer(tiles.a, count), ctx.buffer(tiles.outputs, count)
        x = layer.x if isinstance(layer, LutLayer) else layer.a
        a_plane, b_plane, y_plane = _plane_bytes(layer)
        loads = pending + _flat_rows(node, ctx, isa.LOAD, x, a_row, r0, rows, layer.size, False,
                                     views[0])
        if a_plane:  # an int16 operand's low plane, after its high one
            loads += _flat_rows(node, ctx, isa.LOAD, x, a_row + rows, r0, rows, layer.size,
                                False, views[0], plane=a_plane)
        pending = []
        b_row = None
        if binary:
            b_row = ctx.buffer(tiles.b, count)
            loads += _flat_rows(node, ctx, isa.LOAD, layer.b, b_row, r0, rows, layer.size, False,
                                views[1])
            if b_plane:
                loads += _flat_rows(node, ctx, isa.LOAD, layer.b, b_row + rows, r0, rows,
                                    layer.size, False, views[1], plane=b_plane)
        work = _work(layer, tiles, a_row, b_row, out_row, rows)
        stores = _flat_rows(node, ctx, isa.STORE, layer.y, out_row, r0, rows, layer.size, True,
                            views[-1])
        if y_plane:  # the int16 result's low plane: after the high one
            stores += _flat_rows(node, ctx, isa.STORE, layer.y, out_row + rows, r0, rows,
                                 layer.size, True, views[-1], plane=y_plane)
        steps.append(Step(tuple(loads), (work, *stores)))
    return steps


def _table_bytes(layer: LutLayer, lanes: int) -> bytes:
    """A LUT's one table as its scratchpad rows: the int8 entries, or an int16 table's two
    blocks, the entries' high bytes and then their low bytes - 128 (`isa.lut_table_rows`)."""
    wide = layer.wide or layer.in_wide
    entries = isa.lut_entries(int(layer.in_wide), layer.knots[0])
    block = ceil_div(entries, lanes) * lanes
    planes = numerics.split_wide(layer.table) if wide else (layer.table,)
    table = np.zeros((len(planes), block), np.int8)
    for row, plane in zip(table, planes):
        row[:entries] = plane
    return table.tobytes()


def _channel_tables(layer: LutLayer, ctx: Context, image: ImageBuilder) -> list[int]:
    """The DRAM address of each channel block's per-lane table (LUT per_lane=1): a row per
    entry, lane j of row i holding entry i of channel c0 + j's table; 16-bit entries as two
    such blocks, their high bytes and then their low bytes - 128 (`isa.lut_table_rows`)."""
    lanes, (channels, entries) = ctx.arch.lanes, layer.table.shape
    wide = layer.wide or layer.in_wide
    addresses = []
    for c0 in range(0, channels, lanes):
        block = np.zeros((entries, lanes), np.int16 if wide else np.int8)
        block[:, :min(lanes, channels - c0)] = layer.table[c0:c0 + lanes].T
        planes = numerics.split_wide(block) if wide else (block,)
        addresses.append(image.add(b"".join(np.asarray(p, np.int8).tobytes() for p in planes)))
    return addresses


def _pixel_steps(layer: AddLayer | MulLayer | LutLayer, tiles: ElementwiseTiles, ctx: Context,
                 image: ImageBuilder, pending: list[Op]) -> list[Step]:
    """Add, Mul or LUT over Views: one pixel's channel block per local row, so that each
    operand is read (and the result written) at its own strides, as the pooling layers do. A
    broadcast operand b is read once per tile: one row (a value per channel), or one byte
    per row (a value per pixel or image, in lane 0)."""
    node, lanes = layer.node, ctx.arch.lanes
    binary = not isinstance(layer, LutLayer)
    operands = ((layer.a, tiles.a), (layer.b, tiles.b)) if binary else ((layer.x, tiles.a),)
    n, h, w, c = layer.views[-1].shape
    tables = _channel_tables(layer, ctx, image) if not binary and layer.per_channel else None
    cap = tiles.tile_rows
    tile_hw = (max(1, min(h, cap // w)), w) if w <= cap else (1, ceil_div(w, ceil_div(w, cap)))
    steps, count = [], 0
    for image_index, y0, th, x0, tw in pixel_tile_grid(n, (h, w), tile_hw):
        for c0 in range(0, c, lanes):
            block = min(lanes, c - c0)
            rows = ctx.buffer(tiles.outputs, count), [ctx.buffer(r, count) for _, r in operands]
            count += 1

            def dma(row, tensor, view, sram, write):
                vn, vh, vw, vc = view.shape
                pixels = vh == h and vw == w  # else one value for the tile's pixels
                return instruction(node, row, ctx.access(tensor, write, view), mem="scratchpad",
                                   sram=sram, dram=view.at(image_index if vn > 1 else 0,
                                                           y0 if pixels else 0,
                                                           x0 if pixels else 0,
                                                           c0 if vc == c else 0),
                                   y_size=th if pixels else 1, x_size=tw if pixels else 1,
                                   elem_bytes=block if vc == c else 1, x_stride=view.pixel,
                                   y_stride=view.row)
            out_row, in_rows = rows
            loads = pending + [dma(isa.LOAD, t, v, r, False) for (t, _), v, r in
                               zip(operands, layer.views, in_rows)]
            planes = _plane_bytes(layer)
            for (t, _), v, r, plane in zip(operands, layer.views, in_rows, planes):
                if plane:  # an int16 operand's low plane, after its high plane's rows: one
                    # per pixel, or the one row of a gate broadcast over them (MUL b_step=0)
                    high_rows = th * tw if v.shape[1:3] == (h, w) else 1
                    loads.append(dma(isa.LOAD, t, _low(v, plane), r + high_rows, False))
            pending = []
            table = None
            if tables is not None:  # this channel block's tables, kept while it stays the one
                table = tiles.table.base if len(tables) == 1 else ctx.buffer(tiles.table,
                                                                             count - 1)
                if len(tables) > 1 or count == 1:
                    loads.append(instruction(node, isa.LOAD, mem="scratchpad", sram=table,
                                             dram=tables[c0 // lanes], y_size=tiles.table.rows,
                                             x_size=1, elem_bytes=lanes, x_stride=lanes,
                                             y_stride=lanes))
            work = _work(layer, tiles, in_rows[0], in_rows[1] if binary else None, out_row,
                         th * tw, table)
            stores = [dma(isa.STORE, layer.y, layer.views[-1], out_row, True)]
            if planes[2]:  # an int16 result's low plane, after the high plane's rows
                stores.append(dma(isa.STORE, layer.y, _low(layer.views[-1], planes[2]),
                                  out_row + th * tw, True))
            steps.append(Step(tuple(loads), (work, *stores)))
    return steps


def _low(view: View, plane: int) -> View:
    """The View of an int16 value's low plane, `plane` bytes after its high one's."""
    return dataclasses.replace(view, offset=view.offset + plane)


# --- softmax --------------------------------------------------------------------------------


def softmax_steps(layer: SoftmaxLayer, tiles: SoftmaxTiles, ctx: Context,
                  image: ImageBuilder) -> list[Step]:
    arch, node, lanes = ctx.arch, layer.node, ctx.arch.lanes
    table = np.zeros(tiles.table.rows * lanes, "<i4")
    table[:layer.table.size] = layer.table
    pending = [load_acc_rows(node, arch, tiles.table.base, image.add(table.tobytes()),
                             tiles.table.rows)] if layer.table.size else []
    n, h, w, c = layer.views[1].shape
    c_out, c = c, layer.channels or c  # a reduction reads x's channels, writes y's one
    cap = tiles.tile_rows
    tile_hw = (max(1, min(h, cap // w)), w) if w <= cap else (1, ceil_div(w, ceil_div(w, cap)))
    steps = []
    for count, (image_index, y0, th, x0, tw) in enumerate(pixel_tile_grid(n, (h, w), tile_hw)):
        src, dst = ctx.buffer(tiles.inputs, count), ctx.buffer(tiles.outputs, count)

        def dma(row, tensor, view, sram, block, write):
            c0 = block * lanes
            width = (c_out if write else c) - c0
            return instruction(node, row, ctx.access(tensor, write, view), mem="scratchpad",
                               sram=sram + block * cap, dram=view.at(image_index, y0, x0, c0),
                               y_size=th, x_size=tw, elem_bytes=min(lanes, width),
                               x_stride=view.pixel, y_stride=view.row)
        loads = pending + [dma(isa.LOAD, layer.x, layer.views[0], src, b, False)
                           for b in range(tiles.blocks)]
        if layer.x_plane:  # an int16 input's low plane, its blocks after the high plane's
            low = dataclasses.replace(layer.views[0], offset=layer.views[0].offset + layer.x_plane)
            loads += [dma(isa.LOAD, layer.x, low, src + tiles.blocks * cap, b, False)
                      for b in range(tiles.blocks)]
        pending = []
        rows = dict(src=src, dst=dst, rows=th * tw, n=c - (tiles.blocks - 1) * lanes,
                    blocks=tiles.blocks, stride=cap, table=tiles.table.base)
        if layer.reduce:
            work = instruction(node, isa.REDUCE, **rows, op=layer.reduce,
                               in_offset=layer.in_zero_point, out_offset=layer.out_zero_point)
        elif layer.norm:
            work = instruction(node, isa.LAYERNORM, **rows, out_offset=layer.out_zero_point,
                               wide=int(bool(layer.x_plane)), out_wide=int(bool(layer.y_plane)))
        else:
            work = instruction(node, isa.SOFTMAX, **rows, log=int(layer.log),
                               shift=layer.shift, out_offset=layer.out_zero_point,
                               wide=int(bool(layer.x_plane)), out_wide=int(bool(layer.y_plane)),
                               fine_bits=layer.fine_bits)
        stores = [dma(isa.STORE, layer.y, layer.views[1], dst, b, True)
                  for b in range(1 if layer.reduce else tiles.blocks)]
        if layer.y_plane:  # an int16 output's low plane, its blocks after the high plane's
            low = dataclasses.replace(layer.views[1], offset=layer.views[1].offset + layer.y_plane)
            stores += [dma(isa.STORE, layer.y, low, dst + tiles.blocks * cap, b, True)
                       for b in range(tiles.blocks)]
        steps.append(Step(tuple(loads), (work, *stores)))
    return steps
