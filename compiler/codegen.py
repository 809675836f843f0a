"""Codegen: each tiled layer → its constants in the DRAM image and its steps of instructions.

Instructions are built only through the rows of `simulator.isa`. Per layer:

- **Convolution** (Conv, Gemm, MatMul) on the array, with implicit im2col: a tile's input
  window is DMA'd once per input-channel block, channels-last, with the convolution's padding
  filled by the input zero point (`pad_value`), and each kernel tap is one PRELOAD of a k x n
  weight tile plus one COMPUTE whose outer and inner strides walk the window at the
  convolution's stride and dilation. No im2col copy exists anywhere. The int32 bias is DMA'd into
  the tile's accumulator rows first (broadcast with a zero line stride), every COMPUTE
  accumulates, and one REQUANT per tile applies the node's own per-channel multipliers and
  shifts, output zero point and fused clamp before the STORE.
- **Pooling** on the vector unit: the padded window block is loaded (padding -128 for max, the
  zero point for average) and one MAXPOOL/AVGPOOL produces the tile.
- **Add/Sub and LUT** on the vector unit, over the tensor's bytes in rows of `arch.lanes`.

Loop order for a convolution: output-channel block (its weights and parameter block loaded once
when they fit: weight-stationary), then pixel tiles, then input-channel blocks, then taps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.errors import CompileError
from compiler.lower import AddLayer, ConvLayer, LutLayer, PoolLayer
from compiler.memory import ImageBuilder
from compiler.schedule import Op, Step
from compiler.tiling import (LUT_ENTRIES, ConvTiles, ElementwiseTiles, PoolTiles, active_blocks,
                             ceil_div, conv_input_extent)
from simulator import isa
from simulator.arch import Arch
from simulator.errors import SimulatorError

_PAD_MAX = 255  # LOAD pad fields are 8 bits


@dataclass(frozen=True)
class Context:
    """What every layer's codegen reads: the target and whether buffers alternate.

    The DRAM address of an activation is not known yet (the image grows as layers are
    generated, and activations live above it): an instruction touching one carries the
    address relative to the tensor and names the tensor; `relocate` adds the bases."""

    arch: Arch
    double_buffer: bool

    def buffer(self, region, i: int) -> int:
        return region.base + (i % (region.count if self.double_buffer else 1)) * region.rows

    @staticmethod
    def access(tensor: str, write: bool) -> tuple[str, bool]:
        return (tensor, write)


def _op(node: str, row: isa.InsnDef, access=None, **args) -> Op:
    """An instruction of layer `node`; `access` names the activation tensor it touches."""
    op = Op(row, args, node, access)
    try:
        op.insn  # check every field now, where the layer is known
    except SimulatorError as err:
        raise CompileError(f"layer {node!r}: {err}") from None
    return op


def param_block(arch: Arch, multipliers, shifts) -> bytes:
    """Two accumulator rows: per-lane Q31 multipliers, then shifts; unused lanes zero."""
    block = np.zeros((2, arch.lanes), "<i4")
    block[0, :len(multipliers)] = multipliers
    block[1, :len(shifts)] = shifts
    return block.tobytes()


def _load_acc_rows(node: str, arch: Arch, sram: int, dram: int, rows: int) -> Op:
    row_bytes = arch.accumulator.row_bytes
    return _op(node, isa.LOAD, mem="accumulator", sram=sram, dram=dram, y_size=rows, x_size=1,
               elem_bytes=row_bytes, x_stride=row_bytes, y_stride=row_bytes)


@dataclass(frozen=True)
class _Window:
    """The input block one output tile reads: DRAM start, sizes and the padding around it."""

    dram_offset: int  # pixels from the start of the image
    y_size: int
    x_size: int
    pads: tuple[int, int, int, int]  # top, bottom, left, right
    height: int
    width: int


def _window(in_hw, origin, extent, pads_tl) -> _Window:
    (h, w), (iy0, ix0), (ih, iw) = in_hw, origin, extent
    iy0 -= pads_tl[0]
    ix0 -= pads_tl[1]
    y_lo, y_hi = max(iy0, 0), min(iy0 + ih, h)
    x_lo, x_hi = max(ix0, 0), min(ix0 + iw, w)
    if y_hi <= y_lo or x_hi <= x_lo:  # the whole block is padding
        return _Window(0, 0, 0, (ih, 0, iw, 0), ih, iw)
    pads = (y_lo - iy0, iy0 + ih - y_hi, x_lo - ix0, ix0 + iw - x_hi)
    return _Window(y_lo * w + x_lo, y_hi - y_lo, x_hi - x_lo, pads, ih, iw)


def _load_window(node: str, ctx: Context, tensor: str, image_offset: int, win: _Window,
                 channels: int, c0: int, block: int, sram: int, pad_value: int, width: int) -> Op:
    if max(win.pads) > _PAD_MAX:
        raise CompileError(f"layer {node!r}: padding of {max(win.pads)} pixels exceeds the "
                           f"LOAD pad field ({_PAD_MAX})")
    dram = (image_offset + win.dram_offset) * channels + c0
    return _op(node, isa.LOAD, ctx.access(tensor, False), mem="scratchpad", sram=sram, dram=dram,
               y_size=win.y_size, x_size=win.x_size, elem_bytes=block, x_stride=channels,
               y_stride=width * channels, pad_top=win.pads[0], pad_bottom=win.pads[1],
               pad_left=win.pads[2], pad_right=win.pads[3], pad_value=pad_value)


def _pixel_tiles(batch: int, out_hw, tile_hw):
    (oh, ow), (th, tw) = out_hw, tile_hw
    for image in range(batch):
        for y0 in range(0, oh, th):
            for x0 in range(0, ow, tw):
                yield image, y0, min(th, oh - y0), x0, min(tw, ow - x0)


# --- convolution ----------------------------------------------------------------------------


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


def conv_steps(layer: ConvLayer, tiles: ConvTiles, ctx: Context, image: ImageBuilder,
               padded: PaddedInput | None = None) -> list[Step]:
    arch, node = ctx.arch, layer.node
    kb, nb = tiles.in_block, tiles.out_block
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel, layer.strides, layer.dilations
    (h, w), (oh, ow) = layer.in_hw, layer.out_hw
    cin, cout = layer.in_channels, layer.out_channels
    active = active_blocks(layer, kb, nb)
    bias = layer.bias if layer.bias is not None else np.zeros(cout, np.int32)
    bias_addr = image.add(np.asarray(bias, "<i4").tobytes())
    qmin, qmax = layer.qclamp
    steps: list[Step] = []
    weight_loads = input_loads = pixel_tiles = 0
    for ob, blocks in enumerate(active):
        c0o = ob * nb
        n = min(nb, cout - c0o)
        params_addr = image.add(param_block(arch, layer.multiplier[c0o:c0o + n],
                                            layer.shift[c0o:c0o + n]))
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
        pending = [_load_acc_rows(node, arch, param_row, params_addr, 2)]
        if tiles.resident_weights and chunks:
            resident_row = ctx.buffer(tiles.weights, weight_loads)
            weight_loads += 1
            pending.append(_op(node, isa.LOAD, mem="scratchpad", sram=resident_row,
                               dram=weights_addr, y_size=offset, x_size=1, elem_bytes=n,
                               x_stride=n, y_stride=n))
        for image_index, y0, th, x0, tw in _pixel_tiles(layer.batch, layer.out_hw,
                                                        tiles.tile_hw):
            pixels = th * tw
            acc_row = ctx.buffer(tiles.acc, pixel_tiles)
            out_row = ctx.buffer(tiles.outputs, pixel_tiles)
            pixel_tiles += 1
            ih, iw = conv_input_extent(th, sh, kh, dh), conv_input_extent(tw, sw, kw, dw)
            win = _window((h, w), (y0 * sh, x0 * sw), (ih, iw), layer.pads[:2])
            first = True
            bias_load = _op(node, isa.LOAD, mem="accumulator", sram=acc_row,
                            dram=bias_addr + 4 * c0o, y_size=pixels, x_size=1, elem_bytes=4 * n,
                            x_stride=4 * n, y_stride=0)
            in_row = None
            for j, chunk in enumerate(chunks or [None]):
                loads = pending
                pending = []
                if j == 0 and (layer.bias is not None or not chunks):
                    loads.append(bias_load)
                body: list[Op] = []
                if chunk is not None:
                    k = chunk.k
                    if tiles.resident_weights:
                        w_row = resident_row + tile_rows[chunk.key]
                    else:
                        w_row = ctx.buffer(tiles.weights, weight_loads)
                        weight_loads += 1
                        loads.append(_op(node, isa.LOAD, mem="scratchpad", sram=w_row,
                                         dram=weights_addr + tile_rows[chunk.key] * n,
                                         y_size=len(chunk.tiles) * k, x_size=1, elem_bytes=n,
                                         x_stride=n, y_stride=n))
                    image_offset = image_index * h * w
                    stream = dict(m_outer=th, m_inner=tw, outer_stride=sh * iw, inner_stride=sw)
                    if tiles.blocked_input:
                        if j == 0:
                            in_row = ctx.buffer(tiles.inputs, input_loads)
                            input_loads += 1
                            loads += _blocked_input(node, ctx, layer, kb, in_row,
                                                    image_offset + y0 * w, pixels)
                        x_row = in_row + chunk.key * pixels
                        stream = dict(m_outer=1, m_inner=pixels)
                    elif padded is not None:
                        x_row = ctx.buffer(tiles.inputs, input_loads)
                        input_loads += 1
                        first_pixel = ((image_index * padded.height + y0 * sh) * padded.width
                                       + x0 * sw + chunk.first_tap)
                        loads.append(_op(node, isa.LOAD, mem="scratchpad", sram=x_row,
                                         dram=padded.address + first_pixel * cin, y_size=ih,
                                         x_size=iw, elem_bytes=k, x_stride=cin,
                                         y_stride=padded.width * cin))
                    else:
                        x_row = ctx.buffer(tiles.inputs, input_loads)
                        input_loads += 1
                        loads.append(_load_window(node, ctx, layer.x, image_offset, win, cin,
                                                  chunk.first_channel, k, x_row,
                                                  layer.x_zero_point, w))
                    for t, (_, dy, dx) in enumerate(chunk.tiles):
                        body.append(_op(node, isa.PRELOAD, sp=w_row + t * k, k=k))
                        tap_row = x_row if tiles.blocked_input else x_row + dy * iw + dx
                        body.append(_op(node, isa.COMPUTE, sp=tap_row, acc=acc_row, k=k, n=n,
                                        accumulate=0 if first and layer.bias is None else 1,
                                        **stream))
                        first = False
                if j == max(len(chunks), 1) - 1:
                    body.append(_op(node, isa.REQUANT, acc=acc_row, sp=out_row, rows=pixels,
                                    param=param_row, out_offset=layer.out_zero_point, qmin=qmin,
                                    qmax=qmax))
                    dram = ((image_index * oh + y0) * ow + x0) * cout + c0o
                    body.append(_op(node, isa.STORE, ctx.access(layer.y, True),
                                    mem="scratchpad", sram=out_row, dram=dram, y_size=th,
                                    x_size=tw, elem_bytes=n, x_stride=cout, y_stride=ow * cout))
                steps.append(Step(tuple(loads), tuple(body)))
    return steps


def _blocked_input(node: str, ctx: Context, layer: ConvLayer, kb: int, in_row: int,
                   first_pixel: int, pixels: int) -> list[Op]:
    """A 1x1 convolution's contiguous pixels, all channel blocks: block b of pixel p goes to
    row in_row + b * pixels + p, in one LOAD for the full blocks and one for the remainder."""
    cin = layer.in_channels
    full, rest = divmod(cin, kb)
    base = first_pixel * cin
    access = ctx.access(layer.x, False)
    # One pixel's channels are contiguous: say so, so the DMA sees one run.
    x_stride = cin if pixels > 1 else kb
    ops = []
    if full:
        ops.append(_op(node, isa.LOAD, access, mem="scratchpad", sram=in_row, dram=base,
                       y_size=full, x_size=pixels, elem_bytes=kb, x_stride=x_stride,
                       y_stride=kb))
    if rest:
        ops.append(_op(node, isa.LOAD, access, mem="scratchpad", sram=in_row + full * pixels,
                       dram=base + full * kb, y_size=1, x_size=pixels, elem_bytes=rest,
                       x_stride=cin if pixels > 1 else rest, y_stride=cin))
    return ops


# --- pooling --------------------------------------------------------------------------------


def pool_steps(layer: PoolLayer, tiles: PoolTiles, ctx: Context,
               image: ImageBuilder) -> list[Step]:
    arch, node = ctx.arch, layer.node
    (kh, kw), (sh, sw) = layer.kernel, layer.strides
    (h, w), (oh, ow), c = layer.in_hw, layer.out_hw, layer.channels
    cb = tiles.channel_block
    pending = []
    param_row = None
    if layer.average:
        addr = image.add(param_block(arch, [layer.multiplier] * arch.lanes,
                                     [layer.shift] * arch.lanes))
        param_row = tiles.params.base
        pending.append(_load_acc_rows(node, arch, param_row, addr, 2))
    steps, count = [], 0
    for image_index, y0, th, x0, tw in _pixel_tiles(layer.batch, layer.out_hw, tiles.tile_hw):
        ih, iw = conv_input_extent(th, sh, kh, 1), conv_input_extent(tw, sw, kw, 1)
        win = _window((h, w), (y0 * sh, x0 * sw), (ih, iw), layer.pads[:2])
        for c0 in range(0, c, cb):
            n = min(cb, c - c0)
            in_row, out_row = ctx.buffer(tiles.inputs, count), ctx.buffer(tiles.outputs, count)
            count += 1
            loads = pending + [_load_window(node, ctx, layer.x, image_index * h * w, win, c, c0,
                                            n, in_row, layer.pad_value, w)]
            pending = []
            window = dict(src=in_row, dst=out_row, in_h=ih, in_w=iw, kh=kh, kw=kw, sh=sh, sw=sw)
            if layer.average:
                qmin, qmax = layer.qclamp
                pool = _op(node, isa.AVGPOOL, **window, param=param_row,
                           in_offset=layer.pad_value, out_offset=layer.out_zero_point,
                           qmin=qmin, qmax=qmax)
            else:
                pool = _op(node, isa.MAXPOOL, **window)
            dram = ((image_index * oh + y0) * ow + x0) * c + c0
            store = _op(node, isa.STORE, ctx.access(layer.y, True), mem="scratchpad",
                        sram=out_row, dram=dram, y_size=th, x_size=tw, elem_bytes=n,
                        x_stride=c, y_stride=ow * c)
            steps.append(Step(tuple(loads), (pool, store)))
    return steps


# --- elementwise ----------------------------------------------------------------------------


def _flat_rows(node: str, ctx: Context, row: isa.InsnDef, tensor: str, sram: int, r0: int,
               rows: int, total_bytes: int, write: bool) -> list[Op]:
    """Rows [r0, r0 + rows) of a tensor's bytes in lanes-wide rows: the full rows in one
    transfer, a last partial row in another."""
    lanes = ctx.arch.lanes
    base = r0 * lanes
    full = min(rows, total_bytes // lanes - r0)
    rest = total_bytes - (r0 + full) * lanes if r0 + rows > total_bytes // lanes else 0
    access = ctx.access(tensor, write)
    ops = []
    if full > 0:
        ops.append(_op(node, row, access, mem="scratchpad", sram=sram, dram=base, y_size=full,
                       x_size=1, elem_bytes=lanes, x_stride=lanes, y_stride=lanes))
    if rest > 0:
        ops.append(_op(node, row, access, mem="scratchpad", sram=sram + max(full, 0),
                       dram=base + max(full, 0) * lanes, y_size=1, x_size=1, elem_bytes=rest,
                       x_stride=rest, y_stride=rest))
    return ops


def elementwise_steps(layer: AddLayer | LutLayer, tiles: ElementwiseTiles, ctx: Context,
                      image: ImageBuilder) -> list[Step]:
    arch, node = ctx.arch, layer.node
    lanes = arch.lanes
    total_rows = ceil_div(layer.size, lanes)
    is_add = isinstance(layer, AddLayer)
    pending = []
    if is_add:
        addr = image.add(param_block(arch, layer.multipliers, layer.shifts))
        pending.append(_load_acc_rows(node, arch, tiles.params.base, addr, 2))
    else:
        table_rows = ceil_div(LUT_ENTRIES, lanes)
        table = np.zeros(table_rows * lanes, np.int8)
        table[:LUT_ENTRIES] = layer.table
        addr = image.add(table.tobytes())
        pending.append(_op(node, isa.LOAD, mem="scratchpad", sram=tiles.table.base, dram=addr,
                           y_size=table_rows, x_size=1, elem_bytes=lanes, x_stride=lanes,
                           y_stride=lanes))
    steps = []
    for count, r0 in enumerate(range(0, total_rows, tiles.tile_rows)):
        rows = min(tiles.tile_rows, total_rows - r0)
        a_row, out_row = ctx.buffer(tiles.a, count), ctx.buffer(tiles.outputs, count)
        x = layer.a if is_add else layer.x
        loads = pending + _flat_rows(node, ctx, isa.LOAD, x, a_row, r0, rows, layer.size, False)
        pending = []
        if is_add:
            b_row = ctx.buffer(tiles.b, count)
            loads += _flat_rows(node, ctx, isa.LOAD, layer.b, b_row, r0, rows, layer.size, False)
            qmin, qmax = layer.qclamp
            work = _op(node, isa.ADD, a=a_row, b=b_row, dst=out_row, rows=rows,
                       param=tiles.params.base, a_offset=layer.a_zero_point,
                       b_offset=layer.b_zero_point, out_offset=layer.out_zero_point,
                       qmin=qmin, qmax=qmax)
        else:
            work = _op(node, isa.LUT, src=a_row, dst=out_row, rows=rows, table=tiles.table.base)
        stores = _flat_rows(node, ctx, isa.STORE, layer.y, out_row, r0, rows, layer.size, True)
        steps.append(Step(tuple(loads), (work, *stores)))
    return steps


def layer_steps(layer, tiles, ctx: Context, image: ImageBuilder,
                padded: PaddedInput | None = None) -> list[Step]:
    """One layer's constants (appended to `image`) and steps."""
    if isinstance(layer, ConvLayer):
        return conv_steps(layer, tiles, ctx, image, padded)
    if isinstance(layer, PoolLayer):
        return pool_steps(layer, tiles, ctx, image)
    return elementwise_steps(layer, tiles, ctx, image)


def relocate(steps: list[Step], addresses: dict[str, int], sizes: dict[str, int]) -> list[Step]:
    """Add each activation's DRAM base to the instructions that name it; their DRAM access
    becomes the tensor's byte interval, which the scheduler's hazard check compares."""
    def fix(op: Op) -> Op:
        if op.dram is None:
            return op
        tensor, write = op.dram
        base = addresses[tensor]
        return Op(op.row, {**op.args, "dram": op.args["dram"] + base}, op.source,
                  (base, base + max(sizes[tensor], 1), write))
    return [Step(tuple(map(fix, s.loads)), tuple(map(fix, s.body))) for s in steps]
