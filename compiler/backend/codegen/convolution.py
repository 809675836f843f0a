"""Convolution codegen (Conv, Gemm, MatMul) on the array, with implicit im2col.

A tile's input window is DMA'd once per K slice (input-channel block), channels-last, with the
convolution's padding filled by the input zero point (`pad_value`); each kernel tap is one
PRELOAD of a k x n weight tile plus one COMPUTE whose outer and inner strides walk the window at
the convolution's stride and dilation. No im2col copy exists anywhere. The first COMPUTE of a
tile overwrites its accumulator rows, the others accumulate, and one REQUANT per tile adds the
int32 bias (the third row of the parameter block, REQUANT bias=1: no DMA into every
accumulator row) and applies the node's own per-channel multipliers and shifts, output zero
point and fused clamp before the STORE.

Two loop orders (`ConvTiles.whole_layer` picks): output-channel blocks outermost, each block's
weights loaded once (weight-stationary), then pixel tiles, K slices and taps; or, when the whole
layer's weights fit, pixel tiles outermost, so the input is read once. A first layer with few
input channels (RGB) packs several kernel columns into one K slice: its input is kept in DRAM
with a zero-point border (the model input is written inside it), so overlapping DMA elements of
kw x C bytes put neighbouring pixels side by side in the lanes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.backend.codegen.emit import (
    Context,
    input_window,
    instruction,
    load_acc_rows,
    load_window,
    pixel_tile_grid,
)
from compiler.backend.layers import ConvLayer
from compiler.backend.memory import ImageBuilder
from compiler.backend.steps import Op, Step
from compiler.backend.tiling import CONV_PARAM_ROWS, ConvTiles, active_blocks, conv_input_extent
from simulator import isa


@dataclass(frozen=True)
class PaddedInput:
    """A model input stored with its zero-point border already in DRAM: an image blob of
    `batch` x height x width pixels, the real image at (top, left). Overlapping DMA elements can
    then read several neighbouring pixels at once (tap packing) without leaving the row."""

    address: int
    height: int
    width: int
    top: int
    left: int


def padded_input(layer: ConvLayer, tiles: ConvTiles, image: ImageBuilder) -> PaddedInput:
    """Reserve the zero-point-filled buffer a tap-packed convolution reads its input from."""
    (h, w), (oh, ow) = layer.in_hw, layer.out_hw
    (kh, kw), (sh, sw), (dh, _) = layer.kernel, layer.strides, layer.dilations
    top, left = layer.pads[:2]
    height = max(h + top, (oh - 1) * sh + (kh - 1) * dh + 1)
    width = max(w + left, (ow - 1) * sw + kw)
    size = layer.batch * height * width * layer.in_channels
    address = image.add(np.full(size, layer.x_zero_point, np.int8).tobytes())
    return PaddedInput(address, height, width, top, left)


@dataclass(frozen=True)
class _Chunk:
    """One K slice of a convolution: k lanes of input rows, and its weight tiles with the
    (row, column) offset of the input window each tile's COMPUTE starts at."""

    key: int
    first_channel: int
    k: int
    tiles: tuple[tuple[np.ndarray, int, int], ...]  # (k x n weights, dy, dx)
    first_tap: int = 0  # packed: the kernel column of lane block 0


def _chunks(layer: ConvLayer, tiles: ConvTiles, blocks: list[int], c0o: int,
            n: int) -> list[_Chunk]:
    (kh, kw), (dh, dw) = layer.kernel, layer.dilations
    w = layer.weights[c0o:c0o + n]
    cin = layer.in_channels
    if tiles.packed_taps > 1:
        # Lanes j * cin + c hold channel c of the pixel j columns to the right: one weight
        # tile per kernel row covers packed_taps kernel columns.
        g = tiles.packed_taps
        out = []
        for key, kx0 in enumerate(range(0, kw, g)):
            gk = min(g, kw - kx0)
            tiles_ = tuple((np.ascontiguousarray(w[:, :, ty, kx0:kx0 + gk].transpose(2, 1, 0)
                                                 .reshape(gk * cin, n)), ty * dh, 0)
                           for ty in range(kh))
            out.append(_Chunk(key, 0, gk * cin, tiles_, kx0))
        return out
    kb = tiles.in_block
    out = []
    for ib in blocks:
        c0i = ib * kb
        k = min(kb, cin - c0i)
        tiles_ = tuple((np.ascontiguousarray(w[:, c0i:c0i + k, ty, tx].T), ty * dh, tx * dw)
                       for ty in range(kh) for tx in range(kw))
        out.append(_Chunk(ib, c0i, k, tiles_))
    return out


def _slice_input(node: str, ctx: Context, layer: ConvLayer, chunk: _Chunk, x_row: int,
                 image_index: int, y0: int, x0: int, ih: int, iw: int,
                 padded: PaddedInput | None) -> Op:
    """The input window of one K slice: from the padded copy (tap packing) or the tensor."""
    (h, w), (sh, sw), cin = layer.in_hw, layer.strides, layer.in_channels
    if padded is not None:
        first_pixel = ((image_index * padded.height + y0 * sh) * padded.width + x0 * sw
                       + chunk.first_tap)
        return instruction(node, isa.LOAD, mem="scratchpad", sram=x_row,
                   dram=padded.address + first_pixel * cin, y_size=ih, x_size=iw,
                   elem_bytes=chunk.k, x_stride=cin, y_stride=padded.width * cin)
    win = input_window((h, w), (y0 * sh, x0 * sw), (ih, iw), layer.pads[:2])
    return load_window(node, ctx, layer.x, layer.in_view, image_index, win, chunk.first_channel,
                       chunk.k, x_row, layer.x_zero_point)


def conv_steps_whole(layer: ConvLayer, tiles: ConvTiles, ctx: Context, image: ImageBuilder,
                     padded: PaddedInput | None = None) -> list[Step]:
    """Pixel tiles outermost: per pixel tile the input (all K slices) is loaded once and every
    output-channel block computed from it. Every parameter block is loaded once, and so is
    every weight block when they all fit (`resident_weights`); otherwise each block's weights
    stream in per tile, alternating between two buffers (small images with many channels)."""
    arch, node = ctx.arch, layer.node
    kb, nb = tiles.in_block, tiles.out_block
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel, layer.strides, layer.dilations
    (h, w), (oh, ow) = layer.in_hw, layer.out_hw
    cout = layer.out_channels
    active = active_blocks(layer, kb, nb)
    bias = layer.bias if layer.bias is not None else np.zeros(cout, np.int32)
    zeros_addr = _zeros(image, active, nb)
    params_addr = image.add(b"".join(
        isa.ParamBlock(layer.multiplier[ob * nb:(ob + 1) * nb],
                       layer.shift[ob * nb:(ob + 1) * nb], bias[ob * nb:(ob + 1) * nb]
                       ).pack(arch.lanes)
        for ob in range(len(active))))
    pending = [load_acc_rows(node, arch, tiles.params.base, params_addr,
                             CONV_PARAM_ROWS * len(active))]
    per_block, blob, row, byte = [], [], 0, 0
    weight_loads = []
    for ob, blocks in enumerate(active):
        c0o = ob * nb
        n = min(nb, cout - c0o)
        chunks = _chunks(layer, tiles, blocks, c0o, n) if blocks else []
        first_row, offsets = row, {}
        for chunk in chunks:
            offsets[chunk.key] = row
            for weights, _, _ in chunk.tiles:
                blob.append(weights.astype(np.int8).tobytes())
                row += chunk.k
        per_block.append((c0o, n, chunks, {key: r - first_row for key, r in offsets.items()}))
        if row > first_row:
            weight_loads.append((ob, first_row, byte, row - first_row, n))
            byte += (row - first_row) * n
    weights_addr = image.add(b"".join(blob))
    # Resident weights: each block's load in the first tile's step of that block, so the first
    # COMPUTE waits for its own weights only and the rest stream in behind it. Streamed
    # weights: each block's, in every tile's step of that block, into alternating buffers.
    block_rows = {ob: (first_row, offset, rows, n)
                  for ob, first_row, offset, rows, n in weight_loads}
    weight_count = 0
    keys = sorted({c.key for _, _, chunks, _ in per_block for c in chunks})
    slot = {key: i for i, key in enumerate(keys)}
    any_chunk = {c.key: c for _, _, chunks, _ in per_block for c in chunks}
    qmin, qmax = layer.qclamp
    steps: list[Step] = []
    count = 0
    for tile_index, (image_index, y0, th, x0, tw) in enumerate(
            pixel_tile_grid(layer.batch, layer.out_hw, tiles.tile_hw)):
        pixels = th * tw
        ih, iw = conv_input_extent(th, sh, kh, dh), conv_input_extent(tw, sw, kw, dw)
        in_row = ctx.buffer(tiles.inputs, tile_index)
        if tiles.blocked_input:
            inputs = _blocked_input(node, ctx, layer, kb, in_row, image_index * h * w + y0 * w,
                                    pixels)
            slot_rows = pixels
        else:
            slot_rows = ih * iw
            inputs = [_slice_input(node, ctx, layer, any_chunk[key], in_row + slot[key] * slot_rows,
                                   image_index, y0, x0, ih, iw, padded) for key in keys]
        if layer.x in ctx.on_chip:  # its producer left the whole input in these rows
            inputs = []
        for ob, (c0o, n, chunks, offsets) in enumerate(per_block):
            acc_row = ctx.buffer(tiles.acc, count)
            out_row = ctx.buffer(tiles.outputs, count)
            count += 1
            loads = pending
            pending = []
            w_base = tiles.weights.base
            if ob in block_rows and (tile_index == 0 or not tiles.resident_weights):
                first_row, offset, rows, _ = block_rows[ob]
                if tiles.resident_weights:
                    w_base += first_row
                else:
                    w_base = ctx.buffer(tiles.weights, weight_count)
                    weight_count += 1
                loads.append(instruction(node, isa.LOAD, mem="scratchpad", sram=w_base,
                                         dram=weights_addr + offset, y_size=rows, x_size=1,
                                         elem_bytes=n, x_stride=n, y_stride=n))
            elif ob in block_rows:
                w_base += block_rows[ob][0]
            loads += inputs if ob == 0 else []
            if not chunks:
                loads.append(_zero_acc(node, zeros_addr, acc_row, pixels, n))
            body: list[Op] = []
            first = True
            for chunk in chunks:
                k = chunk.k
                x_row = in_row + (chunk.key if tiles.blocked_input else slot[chunk.key]) * slot_rows
                stream = (dict(m_outer=1, m_inner=pixels) if tiles.blocked_input else
                          dict(m_outer=th, m_inner=tw, outer_stride=sh * iw, inner_stride=sw))
                for t, (_, dy, dx) in enumerate(chunk.tiles):
                    body.append(instruction(node, isa.PRELOAD,
                                    sp=w_base + offsets[chunk.key] + t * k, k=k))
                    tap_row = x_row if tiles.blocked_input else x_row + dy * iw + dx
                    body.append(instruction(node, isa.COMPUTE, sp=tap_row, acc=acc_row, k=k, n=n,
                                    accumulate=0 if first else 1, **stream))
                    first = False
            body += _output(node, ctx, layer, acc_row, out_row,
                            tiles.params.base + CONV_PARAM_ROWS * ob, image_index, y0, x0, c0o,
                            th, tw, n)
            steps.append(Step(tuple(loads), tuple(body)))
    return _fill_kept(ctx, layer, steps)


def conv_steps(layer: ConvLayer, tiles: ConvTiles, ctx: Context, image: ImageBuilder,
               padded: PaddedInput | None = None) -> list[Step]:
    """Output-channel blocks outermost: each block's weights (and parameters) are loaded once
    and alternate between two buffers; its pixel tiles then stream the input K slice by K
    slice. Used when the whole layer's weights do not fit, or cost more to keep."""
    if tiles.whole_layer:
        return conv_steps_whole(layer, tiles, ctx, image, padded)
    arch, node = ctx.arch, layer.node
    kb, nb = tiles.in_block, tiles.out_block
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel, layer.strides, layer.dilations
    (h, w), (oh, ow) = layer.in_hw, layer.out_hw
    cin, cout = layer.in_channels, layer.out_channels
    active = active_blocks(layer, kb, nb)
    bias = layer.bias if layer.bias is not None else np.zeros(cout, np.int32)
    zeros_addr = _zeros(image, active, nb)
    qmin, qmax = layer.qclamp
    steps: list[Step] = []
    weight_loads = input_loads = pixel_tiles = 0
    for ob, blocks in enumerate(active):
        c0o = ob * nb
        n = min(nb, cout - c0o)
        params_addr = image.add(isa.ParamBlock(layer.multiplier[c0o:c0o + n],
                                               layer.shift[c0o:c0o + n], bias[c0o:c0o + n]
                                               ).pack(arch.lanes))
        # The weight tiles of this block, chunk (K slice) major; row r of a tile is the r-th
        # lane of the input rows, for the n output channels (PRELOAD's layout): n bytes a row.
        chunks = _chunks(layer, tiles, blocks, c0o, n) if blocks else []
        tile_rows, blob = {}, []
        offset = 0
        for chunk in chunks:
            tile_rows[chunk.key] = offset
            for weights, _, _ in chunk.tiles:
                blob.append(weights.astype(np.int8).tobytes())
                offset += chunk.k
        weights_addr = image.add(b"".join(blob))
        param_row = ctx.buffer(tiles.params, ob)
        pending = [load_acc_rows(node, arch, param_row, params_addr, CONV_PARAM_ROWS)]
        if tiles.resident_weights and chunks:
            resident_row = ctx.buffer(tiles.weights, weight_loads)
            weight_loads += 1
            pending.append(instruction(node, isa.LOAD, mem="scratchpad", sram=resident_row,
                               dram=weights_addr, y_size=offset, x_size=1, elem_bytes=n,
                               x_stride=n, y_stride=n))
        for image_index, y0, th, x0, tw in pixel_tile_grid(layer.batch, layer.out_hw,
                                                        tiles.tile_hw):
            pixels = th * tw
            acc_row = ctx.buffer(tiles.acc, pixel_tiles)
            out_row = ctx.buffer(tiles.outputs, pixel_tiles)
            pixel_tiles += 1
            ih, iw = conv_input_extent(th, sh, kh, dh), conv_input_extent(tw, sw, kw, dw)
            first = True
            in_row = None
            for j, chunk in enumerate(chunks or [None]):
                loads = pending
                pending = []
                if not chunks:
                    loads.append(_zero_acc(node, zeros_addr, acc_row, pixels, n))
                body: list[Op] = []
                if chunk is not None:
                    k = chunk.k
                    if tiles.resident_weights:
                        w_row = resident_row + tile_rows[chunk.key]
                    else:
                        w_row = ctx.buffer(tiles.weights, weight_loads)
                        weight_loads += 1
                        loads.append(instruction(node, isa.LOAD, mem="scratchpad", sram=w_row,
                                         dram=weights_addr + tile_rows[chunk.key] * n,
                                         y_size=len(chunk.tiles) * k, x_size=1, elem_bytes=n,
                                         x_stride=n, y_stride=n))
                    stream = dict(m_outer=th, m_inner=tw, outer_stride=sh * iw, inner_stride=sw)
                    if tiles.blocked_input:
                        if j == 0:
                            in_row = ctx.buffer(tiles.inputs, input_loads)
                            input_loads += 1
                            loads += _blocked_input(node, ctx, layer, kb, in_row,
                                                    (image_index * h + y0) * w, pixels)
                        x_row = in_row + chunk.key * pixels
                        stream = dict(m_outer=1, m_inner=pixels)
                    else:
                        x_row = ctx.buffer(tiles.inputs, input_loads)
                        input_loads += 1
                        loads.append(_slice_input(node, ctx, layer, chunk, x_row, image_index,
                                                  y0, x0, ih, iw, padded))
                    for t, (_, dy, dx) in enumerate(chunk.tiles):
                        body.append(instruction(node, isa.PRELOAD, sp=w_row + t * k, k=k))
                        tap_row = x_row if tiles.blocked_input else x_row + dy * iw + dx
                        body.append(instruction(node, isa.COMPUTE, sp=tap_row, acc=acc_row, k=k, n=n,
                                        accumulate=0 if first else 1, **stream))
                        first = False
                if j == max(len(chunks), 1) - 1:
                    body += _output(node, ctx, layer, acc_row, out_row, param_row,
                                    image_index, y0, x0, c0o, th, tw, n)
                steps.append(Step(tuple(loads), tuple(body)))
    return _fill_kept(ctx, layer, steps)


def _zeros(image: ImageBuilder, active: list[list[int]], nb: int) -> int | None:
    """A zero row for the output-channel blocks whose weights are all zero (their accumulator
    rows are cleared by a broadcast LOAD instead of a COMPUTE), or None when there are none."""
    return image.add(bytes(4 * nb)) if not all(active) else None


def _zero_acc(node: str, zeros_addr: int, acc_row: int, pixels: int, n: int) -> Op:
    return instruction(node, isa.LOAD, mem="accumulator", sram=acc_row, dram=zeros_addr,
                       y_size=pixels, x_size=1, elem_bytes=4 * n, x_stride=4 * n, y_stride=0)


def _output(node: str, ctx: Context, layer: ConvLayer, acc_row: int, out_row: int, param: int,
            image_index: int, y0: int, x0: int, c0: int, th: int, tw: int, n: int) -> list[Op]:
    """The th x tw output tile's REQUANT and STORE; or, when the output stays on chip
    (`compiler.backend.reuse`), REQUANTs straight into the consumer's input rows: one for the tile when
    its rows are whole rows there, else one per tile row (pixels outside the consumer's window
    are dropped)."""
    qmin, qmax = layer.qclamp

    def requant(acc: int, sp: int, rows: int) -> Op:
        return instruction(node, isa.REQUANT, acc=acc, sp=sp, rows=rows, param=param,
                           out_offset=layer.out_zero_point, qmin=qmin, qmax=qmax, bias=1)
    kept = ctx.on_chip.get(layer.y)
    if kept is None:
        return [requant(acc_row, out_row, th * tw),
                _store(node, ctx, layer, out_row, image_index, y0, x0, c0, th, tw, n)]
    rows = min(th, kept.height - kept.top - y0)
    cols = min(tw, kept.width - kept.left - x0)
    if rows <= 0 or cols <= 0:
        return []
    if cols == tw == kept.width:
        return [requant(acc_row, kept.row(y0, x0, c0), rows * tw)]
    return [requant(acc_row + r * tw, kept.row(y0 + r, x0, c0), cols) for r in range(rows)]


def _fill_kept(ctx: Context, layer: ConvLayer, steps: list[Step]) -> list[Step]:
    """With the output kept on chip, the padding of the consumer's block is filled (a LOAD of
    only padding) with the first step's loads, before any REQUANT writes into the block."""
    kept = ctx.on_chip.get(layer.y)
    fill = kept.fill(layer.node, ctx.arch.lanes) if kept is not None else []
    if not fill or not steps:
        return steps
    return [Step(steps[0].loads + tuple(fill), steps[0].body), *steps[1:]]


def _store(node: str, ctx: Context, layer: ConvLayer, out_row: int, image_index: int, y0: int,
           x0: int, c0: int, th: int, tw: int, n: int) -> Op:
    """The th x tw output tile's channels [c0, c0 + n) to the output (a view of its buffer when
    the layer writes into its part of a Concat)."""
    view = layer.out_view
    return instruction(node, isa.STORE, ctx.access(layer.y, True, layer.y_view),
                       mem="scratchpad", sram=out_row, dram=view.at(image_index, y0, x0, c0),
                       y_size=th, x_size=tw, elem_bytes=n, x_stride=view.pixel,
                       y_stride=view.row)


def _blocked_input(node: str, ctx: Context, layer: ConvLayer, kb: int, in_row: int,
                   first_pixel: int, pixels: int) -> list[Op]:
    """A 1x1 convolution's contiguous pixels, all channel blocks: block b of pixel p goes to
    row in_row + b * pixels + p, in one LOAD for the full blocks and one for the remainder."""
    cin = layer.in_channels
    full, rest = divmod(cin, kb)
    if layer.x_view is not None:
        return _blocked_view(node, ctx, layer, kb, in_row, first_pixel, pixels)
    base = first_pixel * cin
    access = ctx.access(layer.x, False)
    # One pixel's channels are contiguous: say so, so the DMA sees one run.
    x_stride = cin if pixels > 1 else kb
    ops = []
    if full:
        ops.append(instruction(node, isa.LOAD, access, mem="scratchpad", sram=in_row, dram=base,
                       y_size=full, x_size=pixels, elem_bytes=kb, x_stride=x_stride,
                       y_stride=kb))
    if rest:
        ops.append(instruction(node, isa.LOAD, access, mem="scratchpad", sram=in_row + full * pixels,
                       dram=base + full * kb, y_size=1, x_size=pixels, elem_bytes=rest,
                       x_stride=cin if pixels > 1 else rest, y_stride=cin))
    return ops


def _blocked_view(node: str, ctx: Context, layer: ConvLayer, kb: int, in_row: int,
                  first_pixel: int, pixels: int) -> list[Op]:
    """`_blocked_input` from a view (a slice, or a Concat input's part of its buffer): whole
    rows of one image, one LOAD per channel block, rows and pixels at the view's strides."""
    view, (h, w), cin = layer.in_view, layer.in_hw, layer.in_channels
    image_index, y0 = divmod(first_pixel // w, h)
    access = ctx.access(layer.x, False, view)
    ops = []
    for b, c0 in enumerate(range(0, cin, kb)):
        ops.append(instruction(node, isa.LOAD, access, mem="scratchpad", sram=in_row + b * pixels,
                               dram=view.at(image_index, y0, 0, c0), y_size=pixels // w,
                               x_size=w, elem_bytes=min(kb, cin - c0), x_stride=view.pixel,
                               y_stride=view.row))
    return ops
