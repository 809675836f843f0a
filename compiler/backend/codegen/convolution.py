"""Convolution codegen (Conv, Gemm, MatMul) on the array, with implicit im2col.

A tile's input window is DMA'd once per K slice (input-channel block), channels-last, with the
convolution's padding filled by the input zero point (`pad_value`); each kernel tap is one
PRELOAD of a k x n weight tile plus one COMPUTE whose outer and inner strides walk the window at
the convolution's stride and dilation (int16 weights: two such pairs, the weight's high int8 part
with COMPUTE shift=7, then its low part, `numerics.split_weight`; an int16 input: two COMPUTEs,
its planes; both: four, `numerics.wide_passes`). No im2col copy exists anywhere. The first COMPUTE of a
tile overwrites its accumulator rows, the others accumulate, and one REQUANT per tile adds the
int32 bias (the third row of the parameter block, REQUANT bias=1: no DMA into every
accumulator row) and applies the node's own per-channel multipliers and shifts, output zero
point and fused clamp before the STORE.

Two orders of one loop nest (`conv_steps`; `ConvTiles.whole_layer` picks): output-channel
blocks outermost, each block's weights loaded once (weight-stationary), then pixel tiles, K
slices and taps; or pixel tiles outermost, so the input is read once. A first layer with few
input channels (RGB) packs several kernel columns into one K slice: its input is kept in DRAM
with a zero-point border (the model input is written inside it), so overlapping DMA elements of
kw x C bytes put neighbouring pixels side by side in the lanes; an int16 input has one such copy
per plane, each slice's two windows then streamed as any int16 input's are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from compiler.backend.codegen.emit import (Context, input_window, instruction, load_acc_rows,
                                           load_window, pixel_tile_grid)
from compiler.backend.layers import ConvLayer
from compiler.backend.memory import ImageBuilder
from compiler.backend.steps import Op, Step
from compiler.backend.tiling import CONV_PARAM_ROWS, ConvTiles, active_blocks, conv_input_extent
from simulator import isa, numerics


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
    plane: int = 0  # an int16 input: bytes from the high plane's copy to the low one's; 0: int8


def padded_input(layer: ConvLayer, tiles: ConvTiles, image: ImageBuilder) -> PaddedInput:
    """Reserve the zero-point-filled buffer a tap-packed convolution reads its input from; an
    int16 input's two planes each get one, bordered by their own byte of the zero point
    (`numerics.split_wide`: the low plane's border is -128 for a zero point of 0)."""
    (h, w), (oh, ow) = layer.in_hw, layer.out_hw
    (kh, kw), (sh, sw), (dh, _) = layer.kernel, layer.strides, layer.dilations
    top, left = layer.pads[:2]
    height = max(h + top, (oh - 1) * sh + (kh - 1) * dh + 1)
    width = max(w + left, (ow - 1) * sw + kw)
    size = layer.batch * height * width * layer.in_channels
    borders = (numerics.split_wide(layer.x_zero_point) if layer.x_plane
               else (layer.x_zero_point,))
    address = image.add(b"".join(np.full(size, border, np.int8).tobytes()
                                 for border in borders))
    return PaddedInput(address, height, width, top, left, size if layer.x_plane else 0)


@dataclass(frozen=True)
class _Chunk:
    """One K slice of a convolution: k lanes of input rows, and its weight tiles with the
    (row, column) offset of the input window each tile's COMPUTE starts at and the COMPUTE's
    shift (int16 weights: each tap's high part, shift 7, then its low part, shift 0)."""

    key: int
    first_channel: int
    k: int
    tiles: tuple[tuple[np.ndarray, int, int, int], ...]  # (k x n int8 weights, dy, dx, shift)
    first_tap: int = 0  # packed: the kernel column of lane block 0


def _parts(weights: np.ndarray, dy: int, dx: int) -> tuple[tuple[np.ndarray, int, int, int], ...]:
    """A tap's weight tile as the array runs it: int8 as it is; int16 as its high part (COMPUTE
    shift=7) and its low part (`numerics.split_weight`)."""
    if weights.dtype != np.int16:
        return ((weights, dy, dx, 0),)
    high, low = numerics.split_weight(weights)
    return (high, dy, dx, numerics.WEIGHT_HIGH_SHIFT), (low, dy, dx, 0)


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
            tiles_ = tuple(part for ty in range(kh) for part in _parts(
                np.ascontiguousarray(w[:, :, ty, kx0:kx0 + gk].transpose(2, 1, 0)
                                     .reshape(gk * cin, n)), ty * dh, 0))
            out.append(_Chunk(key, 0, gk * cin, tiles_, kx0))
        return out
    kb = tiles.in_block
    out = []
    for ib in blocks:
        c0i = ib * kb
        k = min(kb, cin - c0i)
        tiles_ = tuple(part for ty in range(kh) for tx in range(kw) for part in _parts(
            np.ascontiguousarray(w[:, c0i:c0i + k, ty, tx].T), ty * dh, tx * dw))
        out.append(_Chunk(ib, c0i, k, tiles_))
    return out


def _slice_input(node: str, ctx: Context, layer: ConvLayer, chunk: _Chunk, x_row: int,
                 image_index: int, y0: int, x0: int, ih: int, iw: int,
                 padded: PaddedInput | None) -> list[Op]:
    """The input window of one K slice: from the padded copy (tap packing) or the tensor; an
    int16 input's low plane after the high one (its padding the low plane's code of 0)."""
    if layer.x_plane and padded is not None:  # each plane's copy, the low one's ih * iw rows on
        return [_slice_input8(node, ctx, layer, chunk, x_row + plane * ih * iw, image_index,
                              y0, x0, ih, iw, padded, plane * padded.plane)
                for plane in range(2)]
    if layer.x_plane:
        win = input_window(layer.in_hw, (y0 * layer.strides[0], x0 * layer.strides[1]),
                           (ih, iw), layer.pads[:2])
        high = layer.in_view
        low = dataclasses.replace(high, offset=high.offset + layer.x_plane)
        low_pad = int(numerics.split_wide(0)[1])
        return [load_window(node, ctx, layer.x, view, image_index, win, chunk.first_channel,
                            chunk.k, x_row + plane * ih * iw, pad)
                for plane, (view, pad) in enumerate(((high, 0), (low, low_pad)))]
    return [_slice_input8(node, ctx, layer, chunk, x_row, image_index, y0, x0, ih, iw, padded)]


def _slice_input8(node: str, ctx: Context, layer: ConvLayer, chunk: _Chunk, x_row: int,
                  image_index: int, y0: int, x0: int, ih: int, iw: int,
                  padded: PaddedInput | None, plane: int = 0) -> Op:
    """One plane's window (`plane`: bytes from the padded copy's start to the plane's)."""
    (h, w), (sh, sw), cin = layer.in_hw, layer.strides, layer.in_channels
    if padded is not None:
        first_pixel = ((image_index * padded.height + y0 * sh) * padded.width + x0 * sw
                       + chunk.first_tap)
        return instruction(node, isa.LOAD, mem="scratchpad", sram=x_row,
                   dram=padded.address + plane + first_pixel * cin, y_size=ih, x_size=iw,
                   elem_bytes=chunk.k, x_stride=cin, y_stride=padded.width * cin)
    win = input_window((h, w), (y0 * sh, x0 * sw), (ih, iw), layer.pads[:2])
    return load_window(node, ctx, layer.x, layer.in_view, image_index, win, chunk.first_channel,
                       chunk.k, x_row, layer.x_zero_point)


@dataclass(frozen=True)
class _Block:
    """One block of output channels [first_channel, first_channel + n): its K slices, and the
    first row of each slice's weight tiles among the block's weight rows (PRELOAD's layout:
    row r of a tile is the r-th lane of the input rows, for the n channels: n bytes a row)."""

    index: int
    first_channel: int
    n: int
    chunks: tuple[_Chunk, ...]
    chunk_rows: dict[int, int]  # chunk key → its first weight row in the block
    rows: int

    @property
    def channels(self) -> slice:
        return slice(self.first_channel, self.first_channel + self.n)

    def weights(self) -> bytes:
        return b"".join(weights.astype(np.int8).tobytes()
                        for chunk in self.chunks for weights, _, _, _ in chunk.tiles)


def _blocks(layer: ConvLayer, tiles: ConvTiles) -> list[_Block]:
    nb, cout = tiles.out_block, layer.out_channels
    out = []
    for ob, in_blocks in enumerate(active_blocks(layer, tiles.in_block, nb)):
        c0o = ob * nb
        n = min(nb, cout - c0o)
        chunks = _chunks(layer, tiles, in_blocks, c0o, n) if in_blocks else []
        chunk_rows, rows = {}, 0
        for chunk in chunks:
            chunk_rows[chunk.key] = rows
            rows += len(chunk.tiles) * chunk.k
        out.append(_Block(ob, c0o, n, tuple(chunks), chunk_rows, rows))
    return out


def conv_steps(layer: ConvLayer, tiles: ConvTiles, ctx: Context, image: ImageBuilder,
               padded: PaddedInput | None = None) -> list[Step]:
    """The convolution as one loop nest over visits (a pixel tile x an output-channel block),
    in the order `ConvTiles.whole_layer` picks:

    - pixel tiles outermost: a tile's input (all K slices) loads once, at its first visit, and
      each block is one step computed from it; all parameter blocks load at the start, the
      weights once (`resident_weights`) or per visit into alternating buffers;
    - output-channel blocks outermost (when the whole layer's weights do not fit, or cost more
      to keep): a block's parameters (and resident weights) load at its first visit; its pixel
      tiles then stream input and weights K slice by K slice, one step a slice (a blocked
      input: all slices at once, each visit).
    """
    arch, node, kb = ctx.arch, layer.node, tiles.in_block
    pixels_outer = tiles.whole_layer
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel, layer.strides, layer.dilations
    h, w = layer.in_hw
    blocks = _blocks(layer, tiles)
    bias = layer.bias if layer.bias is not None else np.zeros(layer.out_channels, np.int32)
    zeros_addr = _zeros(image, blocks, tiles.out_block)
    # Constants in groups that share one parameter LOAD and one weight blob: the whole layer's
    # (pixel tiles outermost) or one block's. A block's weights are at `weight_offset` rows
    # into its group's, in DRAM and in resident rows alike.
    groups = [blocks] if pixels_outer else [[block] for block in blocks]
    group_of, params_addr, weights_addr, weight_offset = {}, [], {}, {}
    for g, group in enumerate(groups):
        params_addr.append(image.add(b"".join(
            isa.ParamBlock(layer.multiplier[b.channels], layer.shift[b.channels],
                           bias[b.channels]).pack(arch.lanes) for b in group)))
        group_addr, row, byte = image.add(b"".join(b.weights() for b in group)), 0, 0
        for block in group:
            group_of[block.index] = g
            weights_addr[block.index], weight_offset[block.index] = group_addr + byte, row
            row, byte = row + block.rows, byte + block.rows * block.n
    grid = list(pixel_tile_grid(layer.batch, layer.out_hw, tiles.tile_hw))
    visits = ([(t, block) for t in range(len(grid)) for block in blocks] if pixels_outer else
              [(t, block) for block in blocks for t in range(len(grid))])
    all_keys = sorted({c.key for block in blocks for c in block.chunks})
    any_chunk = {c.key: c for block in blocks for c in block.chunks}
    steps: list[Step] = []
    weight_loads = input_loads = 0
    resident_row = in_row = slot = None
    planes, low_gap = (2 if layer.x_plane else 1), 0
    for visit, (tile_index, block) in enumerate(visits):
        image_index, y0, th, x0, tw = grid[tile_index]
        pixels, n, g = th * tw, block.n, group_of[block.index]
        ih, iw = conv_input_extent(th, sh, kh, dh), conv_input_extent(tw, sw, kw, dw)
        acc_row, out_row = ctx.buffer(tiles.acc, visit), ctx.buffer(tiles.outputs, visit)
        param_row = ctx.buffer(tiles.params, g) + CONV_PARAM_ROWS * groups[g].index(block)
        stream = (dict(m_outer=1, m_inner=pixels) if tiles.blocked_input else
                  dict(m_outer=th, m_inner=tw, outer_stride=sh * iw, inner_stride=sw))
        loads: list[Op] = []
        if tile_index == 0 and block is groups[g][0]:
            loads.append(load_acc_rows(node, arch, ctx.buffer(tiles.params, g), params_addr[g],
                                       CONV_PARAM_ROWS * len(groups[g])))
            if tiles.resident_weights and any(b.rows for b in groups[g]):
                resident_row = ctx.buffer(tiles.weights, weight_loads)
                weight_loads += 1
        block_row = (resident_row + weight_offset[block.index]
                     if tiles.resident_weights and block.rows else None)
        if block_row is not None and tile_index == 0:
            loads.append(_load_weights(node, block_row, weights_addr[block.index], block.rows, n))
        pieces = [block.chunks] if pixels_outer else [(chunk,) for chunk in block.chunks]
        piece_row, first = block_row, True  # piece_row + a chunk's row: its first weight row
        for j, piece in enumerate(pieces or [()]):
            body: list[Op] = []
            if piece and block_row is None:  # streamed weights: the piece's, in the next buffer
                first_row = block.chunk_rows[piece[0].key]
                rows = sum(len(chunk.tiles) * chunk.k for chunk in piece)
                piece_row = ctx.buffer(tiles.weights, weight_loads) - first_row
                weight_loads += 1
                loads.append(_load_weights(node, piece_row + first_row,
                                           weights_addr[block.index] + first_row * n, rows, n))
            # The input: all K slices at a tile's first visit (pixel tiles outermost), else
            # each piece's K slice (a blocked input: all slices, at each visit's first piece).
            if pixels_outer:
                load_input = block is blocks[0] and j == 0
            else:
                load_input = bool(piece) and (j == 0 or not tiles.blocked_input)
            if load_input:
                in_row = ctx.buffer(tiles.inputs, input_loads)
                input_loads += 1
                if (kept_input := ctx.on_chip.get(layer.x)) is not None:
                    in_row += image_index * kept_input.image_rows  # its image's block
                if tiles.blocked_input:
                    slot, slot_rows = None, pixels
                    # an int16 input's low plane: all its blocks after the high plane's
                    low_gap = len(all_keys) * pixels
                    inputs = _blocked_input(node, ctx, layer, kb, in_row,
                                            (image_index * h + y0) * w, pixels)
                    if layer.x_plane:
                        inputs += _blocked_input(node, ctx, layer, kb, in_row + low_gap,
                                                 (image_index * h + y0) * w, pixels,
                                                 layer.x_plane)
                else:
                    keys = all_keys if pixels_outer else [chunk.key for chunk in piece]
                    # a slot holds a K slice's window; an int16 one's two planes, low after high
                    slot, low_gap = {key: i for i, key in enumerate(keys)}, ih * iw
                    slot_rows = planes * low_gap
                    inputs = [op for key in keys
                              for op in _slice_input(node, ctx, layer, any_chunk[key],
                                                     in_row + slot[key] * slot_rows,
                                                     image_index, y0, x0, ih, iw, padded)]
                if layer.x not in ctx.on_chip:  # else its producer left it in these rows
                    loads += inputs
            if not block.chunks:  # part of the work, not a prefetch: the loads of a step
                # run before the work of the previous loading step, whose accumulator rows (of
                # the same parity) this LOAD would clear before they are read
                body.append(_zero_acc(node, zeros_addr, acc_row, pixels, n))
            for chunk in piece:
                k = chunk.k
                w_row = piece_row + block.chunk_rows[chunk.key]
                x_row = in_row + (chunk.key if slot is None else slot[chunk.key]) * slot_rows
                for t, (_, dy, dx, shift) in enumerate(chunk.tiles):
                    body.append(instruction(node, isa.PRELOAD, sp=w_row + t * k, k=k))
                    tap_row = x_row if tiles.blocked_input else x_row + dy * iw + dx
                    if layer.x_plane:  # the high plane weighs 2^8, the low one is byte - 128
                        # (times an int16 weight part's own 2^7 or 1: `numerics.wide_passes`)
                        body.append(instruction(node, isa.COMPUTE, sp=tap_row, acc=acc_row,
                                                k=k, n=n, accumulate=0 if first else 1,
                                                shift=numerics.WIDE_HIGH_SHIFT + shift,
                                                **stream))
                        body.append(instruction(node, isa.COMPUTE, sp=tap_row + low_gap,
                                                acc=acc_row, k=k, n=n, accumulate=1,
                                                x_offset=-numerics.WIDE_LOW_OFFSET,
                                                **({"shift": shift} if shift else {}),
                                                **stream))
                    else:  # an int16 weight's high part weighs 2^7 (`split_weight`)
                        body.append(instruction(node, isa.COMPUTE, sp=tap_row, acc=acc_row,
                                                k=k, n=n, accumulate=0 if first else 1,
                                                **({"shift": shift} if shift else {}),
                                                **stream))
                    first = False
            if j == max(len(pieces), 1) - 1:
                body += _output(node, ctx, layer, acc_row, out_row, param_row, image_index, y0,
                                x0, block.first_channel, th, tw, n)
            steps.append(Step(tuple(loads), tuple(body)))
            loads = []
    return _fill_kept(ctx, layer, steps)


def _load_weights(node: str, sram: int, dram: int, rows: int, n: int) -> Op:
    return instruction(node, isa.LOAD, mem="scratchpad", sram=sram, dram=dram, y_size=rows,
                       x_size=1, elem_bytes=n, x_stride=n, y_stride=n)


def _zeros(image: ImageBuilder, blocks: list[_Block], nb: int) -> int | None:
    """A zero row for the output-channel blocks whose weights are all zero (their accumulator
    rows are cleared by a broadcast LOAD instead of a COMPUTE), or None when there are none."""
    return image.add(bytes(4 * nb)) if not all(block.chunks for block in blocks) else None


def _zero_acc(node: str, zeros_addr: int, acc_row: int, pixels: int, n: int) -> Op:
    return instruction(node, isa.LOAD, mem="accumulator", sram=acc_row, dram=zeros_addr,
                       y_size=pixels, x_size=1, elem_bytes=4 * n, x_stride=4 * n, y_stride=0)


def _output(node: str, ctx: Context, layer: ConvLayer, acc_row: int, out_row: int, param: int,
            image_index: int, y0: int, x0: int, c0: int, th: int, tw: int, n: int) -> list[Op]:
    """The th x tw output tile's REQUANT and STORE; or, when the output stays on chip
    (`compiler.backend.reuse`), REQUANTs straight into the consumer's input rows: one for the tile
    when its rows are whole rows there, else one per tile row (pixels outside the consumer's window
    are dropped)."""
    qmin, qmax = layer.qclamp

    def requant(acc: int, sp: int, rows: int) -> Op:
        return instruction(node, isa.REQUANT, acc=acc, sp=sp, rows=rows, param=param,
                           out_offset=layer.out_zero_point, qmin=qmin, qmax=qmax, bias=1,
                           wide=int(bool(layer.y_plane)))
    kept = ctx.on_chip.get(layer.y)
    if kept is None:
        ops = [requant(acc_row, out_row, th * tw),
               _store(node, ctx, layer, out_row, image_index, y0, x0, c0, th, tw, n)]
        if layer.y_plane:  # an int16 output's low plane: rows after the high ones, bytes too
            ops.append(_store(node, ctx, layer, out_row + th * tw, image_index, y0, x0, c0,
                              th, tw, n, layer.y_plane))
        return ops
    rows = min(th, kept.height - kept.top - y0)
    cols = min(tw, kept.width - kept.left - x0)
    if rows <= 0 or cols <= 0:
        return []
    if cols == tw == kept.width:
        return [requant(acc_row, kept.row(y0, x0, c0, image_index), rows * tw)]
    return [requant(acc_row + r * tw, kept.row(y0 + r, x0, c0, image_index), cols)
            for r in range(rows)]


def _fill_kept(ctx: Context, layer: ConvLayer, steps: list[Step]) -> list[Step]:
    """With the output kept on chip, the padding of the consumer's block is filled (a LOAD of
    only padding) with the first step's loads, before any REQUANT writes into the block."""
    kept = ctx.on_chip.get(layer.y)
    fill = kept.fill(layer.node, ctx.arch.lanes) if kept is not None else []
    if not fill or not steps:
        return steps
    return [Step(steps[0].loads + tuple(fill), steps[0].body), *steps[1:]]


def _store(node: str, ctx: Context, layer: ConvLayer, out_row: int, image_index: int, y0: int,
           x0: int, c0: int, th: int, tw: int, n: int, plane: int = 0) -> Op:
    """The th x tw output tile's channels [c0, c0 + n) to the output (a view of its buffer when
    the layer writes into its part of a Concat); `plane` bytes further (an int16 output's low
    plane)."""
    view = layer.out_view
    # The access is of the plane's own bytes (a low plane's View is `plane` bytes on).
    shifted = dataclasses.replace(layer.y_view, offset=layer.y_view.offset + plane) \
        if layer.y_view is not None else None
    return instruction(node, isa.STORE, ctx.access(layer.y, True, shifted),
                       mem="scratchpad", sram=out_row,
                       dram=view.at(image_index, y0, x0, c0) + plane,
                       y_size=th, x_size=tw, elem_bytes=n, x_stride=view.pixel,
                       y_stride=view.row)


def _blocked_input(node: str, ctx: Context, layer: ConvLayer, kb: int, in_row: int,
                   first_pixel: int, pixels: int, plane: int = 0) -> list[Op]:
    """A 1x1 convolution's contiguous pixels, all channel blocks: block b of pixel p goes to
    row in_row + b * pixels + p, in one LOAD for the full blocks and one for the remainder;
    `plane` bytes further in the tensor (an int16 input's low plane)."""
    cin = layer.in_channels
    full, rest = divmod(cin, kb)
    if layer.x_view is not None:
        return _blocked_view(node, ctx, layer, kb, in_row, first_pixel, pixels, plane)
    base = first_pixel * cin + plane
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
                  first_pixel: int, pixels: int, plane: int = 0) -> list[Op]:
    """`_blocked_input` from a view (a slice, or a Concat input's part of its buffer): whole
    rows of one image, one LOAD per channel block, rows and pixels at the view's strides;
    `plane` bytes on (an int16 input's low plane)."""
    view, (h, w), cin = layer.in_view, layer.in_hw, layer.in_channels
    view = dataclasses.replace(view, offset=view.offset + plane)
    image_index, y0 = divmod(first_pixel // w, h)
    access = ctx.access(layer.x, False, view)
    ops = []
    for b, c0 in enumerate(range(0, cin, kb)):
        ops.append(instruction(node, isa.LOAD, access, mem="scratchpad", sram=in_row + b * pixels,
                               dram=view.at(image_index, y0, 0, c0), y_size=pixels // w,
                               x_size=w, elem_bytes=min(kb, cin - c0), x_stride=view.pixel,
                               y_stride=view.row))
    return ops
