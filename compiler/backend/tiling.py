"""Tiling: per layer, the tile sizes and the local-memory regions that hold them.

Every size comes from the `Arch` (array rows and columns, scratchpad and accumulator rows); none
is hard-coded. A convolution is tiled on every dimension: output channels in blocks of at most
`arch.lanes` (array columns), input channels in blocks of at most `arch.array.rows` (the K of one
weight tile), output pixels in rectangles of rows x columns chosen as large as the memories allow
(whole rows first, then narrower), and the batch image by image. Sizes that are not multiples of
the array leave a smaller last block, which the instructions' k and n fields describe.

A convolution has up to four plans: pixel tiles outermost (the input is read once) with all
weights loaded once, or with each output-channel block's weights streamed per tile (an image of
few pixels and many channels); output-channel blocks outermost with one block's weights loaded
at a time, or one K slice's at a time; among those that fit, `_conv_cost` (DMA bytes and
latencies against the array's COMPUTE time) picks one.

Every streamed region has two buffers (ping and pong) so that the DMA of the next tile can overlap
the work on this one; with double buffering off, codegen uses only the first, and the tiles stay the
same so the two schedules compare like for like. The smallest tile is one output pixel of one
channel block; only when even that does not fit is there a CompileError naming the layer, the memory
and the sizes.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass

import numpy as np

from compiler.backend.layers import (AddLayer, ConvLayer, GatherLayer, Layer, LutLayer,
                                     MatMulLayer, MulLayer, PoolLayer, SoftmaxLayer, pixelwise)
from compiler.errors import CompileError
from simulator import isa
from simulator.arch import Arch

BUFFERS = 2  # ping-pong
PARAM_ROWS = isa.ParamBlock.rows()
CONV_PARAM_ROWS = isa.ParamBlock.rows(bias=True)  # with a convolution's bias (REQUANT bias=1)
# The most rows one instruction moves: a tile's pixels are a LOAD's y_size * x_size, a COMPUTE's
# m_inner and a vector instruction's rows.
_MAX_FIELD = min(row.field(name).range[1] for row, name in (
    (isa.LOAD, "y_size"), (isa.LOAD, "x_size"), (isa.COMPUTE, "m_outer"), (isa.COMPUTE, "m_inner"),
    (isa.REQUANT, "rows"), (isa.ADD, "rows"), (isa.LUT, "rows")))
_ELEMENTWISE_TILE_ROWS = 4096  # enough rows per tile to amortise DMA latency, few enough to overlap


@dataclass(frozen=True)
class Region:
    """`count` buffers of `rows` local rows each, from row `base` of memory `mem`."""

    mem: str
    base: int
    rows: int
    count: int = BUFFERS
    fixed: bool = False  # rows shared with a neighbouring layer (`compiler.backend.reuse`): never moved

    def buffer(self, i: int) -> int:
        return self.base + (i % self.count) * self.rows

    @property
    def end(self) -> int:
        return self.base + self.rows * self.count


@dataclass(frozen=True)
class ConvTiles:
    tile_hw: tuple[int, int]  # output rows x columns per tile
    in_block: int  # input channels per weight tile (K), <= array rows
    out_block: int  # output channels per tile (N), <= lanes
    resident_weights: bool  # a block of output channels keeps all its weights loaded (with
    #                         whole_layer: every block's, for the whole layer)
    whole_layer: bool  # pixel tiles outermost, so the input is read once (not once per
    #                    output-channel block); all parameters stay loaded
    blocked_input: bool  # 1x1, stride 1, unpadded, whole rows: one LOAD of all channel blocks
    packed_taps: int  # kernel columns packed into K (1: none); reads a zero-point-padded input
    weights: Region
    inputs: Region
    outputs: Region
    acc: Region
    params: Region


@dataclass(frozen=True)
class PoolTiles:
    tile_hw: tuple[int, int]
    channel_block: int
    inputs: Region
    outputs: Region
    params: Region | None


@dataclass(frozen=True)
class ElementwiseTiles:
    """Add, Mul and LUT: the flat tensor in rows of `arch.lanes` bytes, `tile_rows` per tile."""

    tile_rows: int
    a: Region
    b: Region | None
    outputs: Region
    table: Region | None  # LUT: the table rows
    params: Region | None  # Add, Mul: the rescale block


@dataclass(frozen=True)
class SoftmaxTiles:
    """Softmax: `tile_rows` pixels per tile, each pixel's channel blocks in `blocks` regions of
    `tile_rows` rows (the SOFTMAX stride) in every input and output buffer."""

    tile_rows: int
    blocks: int
    inputs: Region
    outputs: Region
    table: Region  # the accumulator rows of the int32 table


@dataclass(frozen=True)
class MatMulTiles:
    """A MatMul of two activations: `rows` rows of a per tile, all its K slices of `k_block`
    lanes (one region of `rows` rows each in an inputs buffer), and b's tiles of k_block rows
    of `n_block` lanes, all K slices of one output-channel block in a weights buffer."""

    rows: int
    k_block: int
    n_block: int
    inputs: Region
    weights: Region
    outputs: Region
    acc: Region
    params: Region


@dataclass(frozen=True)
class GatherTiles:
    """An embedding lookup moves DRAM to DRAM (the indexed DMA): it has no regions to tile."""


Tiles = ConvTiles | PoolTiles | ElementwiseTiles | SoftmaxTiles | MatMulTiles | GatherTiles


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def conv_input_extent(out: int, stride: int, kernel: int, dilation: int) -> int:
    """Input rows (or columns) that `out` output rows read, padding included."""
    return (out - 1) * stride + (kernel - 1) * dilation + 1


_NONZERO: "weakref.WeakKeyDictionary[ConvLayer, np.ndarray]" = weakref.WeakKeyDictionary()


def _nonzero(layer: ConvLayer) -> np.ndarray:
    """(out, in): whether any tap of the weight is nonzero, once per layer (tiling asks often)."""
    found = _NONZERO.get(layer)
    if found is None:
        found = _NONZERO[layer] = (layer.weights != 0).any(axis=(2, 3))
    return found


def active_blocks(layer: ConvLayer, in_block: int, out_block: int) -> list[list[int]]:
    """Per output-channel block, the input-channel blocks whose weights are not all zero
    (grouped and depthwise convolutions skip the rest)."""
    n_in = ceil_div(layer.in_channels, in_block)
    n_out = ceil_div(layer.out_channels, out_block)
    nonzero = np.zeros((n_out * out_block, n_in * in_block), bool)
    nonzero[:layer.out_channels, :layer.in_channels] = _nonzero(layer)
    blocks = nonzero.reshape(n_out, out_block, n_in, in_block).any(axis=(1, 3))
    return [np.flatnonzero(row).tolist() for row in blocks]


def _too_small(layer_name: str, memory: str, need: int, have: int, what: str) -> CompileError:
    return CompileError(f"layer {layer_name!r}: even the smallest tile ({what}) needs {need} "
                        f"{memory} rows, but the target has {have}")


def _best_tile(out_hw: tuple[int, int], fits) -> tuple[int, int] | None:
    """The largest output tile that fits: whole rows if possible (balanced over the height),
    else one row of as many columns as fit (balanced over the width)."""
    oh, ow = out_hw
    for rows in range(oh, 0, -1):
        if fits(rows, ow):
            rows = ceil_div(oh, ceil_div(oh, rows))
            return rows, ow
    for cols in range(ow - 1, 0, -1):
        if fits(1, cols):
            return 1, ceil_div(ow, ceil_div(ow, cols))
    return None


def packed_taps(layer: ConvLayer, arch: Arch) -> int:
    """How many kernel columns fit into K beside each other: with few input channels (an RGB
    first layer), lanes j * C + c take channel c of the pixel j columns right, so one weight
    tile covers several taps and the array's rows are not left mostly idle. An int16 input
    packs alike: each plane's copy is read the same way (`codegen.convolution.padded_input`)."""
    if layer.dilations[1] != 1 or layer.kernel[1] < 2:
        return 1
    g = min(layer.kernel[1], arch.array.rows // layer.in_channels)
    return g if g >= 2 else 1


def tile_conv(layer: ConvLayer, arch: Arch, packable: bool = False,
              reserve: int = 0) -> ConvTiles:
    """`packable`: the input is a model input that this layer alone reads, so it may be stored
    pre-padded for tap packing. `reserve`: scratchpad rows at the top kept for an activation
    that stays on chip (`compiler.backend.reuse`)."""
    sp_rows, acc_rows = arch.scratchpad.rows - reserve, arch.accumulator.rows
    in_block = min(arch.array.rows, layer.in_channels)
    out_block = min(arch.lanes, layer.out_channels)
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel, layer.strides, layer.dilations
    # weight tiles a tap: int16 weights are two (their int8 parts), twice the weight rows
    taps = kh * kw * layer.weight_passes
    active = active_blocks(layer, in_block, out_block)
    n_in = ceil_div(layer.in_channels, in_block)
    dense = all(len(a) == n_in for a in active)
    resident_rows = taps * max((sum(min(in_block, layer.in_channels - ib * in_block)
                                    for ib in a) for a in active), default=0)
    one_by_one = (kh, kw, sh, sw) == (1, 1, 1, 1) and not any(layer.pads)
    out_planes = 2 if layer.y_plane else 1  # an int16 output's two planes
    in_planes = 2 if layer.x_plane else 1  # likewise an int16 input's, each slice's both

    def input_rows(rows: int, cols: int, blocked: bool) -> int:
        if blocked:
            return in_planes * n_in * rows * cols
        return in_planes * conv_input_extent(rows, sh, kh, dh) * \
            conv_input_extent(cols, sw, kw, dw)

    packed = packed_taps(layer, arch) if packable and dense else 1
    chunks = ceil_div(kw, packed) if packed > 1 else n_in  # K slices: input loads per tile
    whole_rows = taps * sum(sum(min(in_block, layer.in_channels - ib * in_block) for ib in a)
                            for a in active)
    plans = []
    for whole, resident in ((True, True), (True, False), (False, True), (False, False)):
        if whole:
            weight_rows = whole_rows if resident else BUFFERS * max(resident_rows, 1)
            if weight_rows > sp_rows // 2 or CONV_PARAM_ROWS * len(active) > acc_rows // 4:
                continue
            param_rows = CONV_PARAM_ROWS * len(active)
        else:
            weight_rows = BUFFERS * (max(resident_rows, 1) if resident else taps * in_block)
            if resident and weight_rows > sp_rows // 2:
                continue
            param_rows = BUFFERS * CONV_PARAM_ROWS
        for blocked in ((True, False) if one_by_one and dense else (False,)):
            slices = n_in if blocked else (chunks if whole else 1)

            def in_rows(rows: int, cols: int) -> int:
                return (input_rows(rows, cols, True) if blocked else
                        slices * input_rows(rows, cols, False))

            def fits(rows, cols):
                if blocked and cols != layer.out_hw[1]:
                    return False
                pixels = rows * cols
                if pixels > _MAX_FIELD:
                    return False
                sp = weight_rows + BUFFERS * (in_rows(rows, cols) + out_planes * pixels)
                return sp <= sp_rows and param_rows + BUFFERS * pixels <= acc_rows
            tile = _best_tile(layer.out_hw, fits)
            if tile is None:
                continue
            rows, cols = tile
            pixels = rows * cols
            weights = Region("scratchpad", 0, weight_rows, 1)
            inputs = Region("scratchpad", weights.end, in_rows(rows, cols))
            outputs = Region("scratchpad", inputs.end, out_planes * pixels)
            params = Region("accumulator", 0, param_rows, 1)
            acc = Region("accumulator", params.end, pixels)
            if not whole or not resident:  # per-block weights alternate between two buffers
                weights = Region("scratchpad", 0, weight_rows // BUFFERS)
            if not whole:  # and so do the parameters
                params = Region("accumulator", 0, CONV_PARAM_ROWS)
            plans.append(ConvTiles(
                tile_hw=tile, in_block=in_block, out_block=out_block,
                resident_weights=resident, whole_layer=whole, blocked_input=blocked,
                packed_taps=packed if not blocked else 1, weights=weights, inputs=inputs,
                outputs=outputs, acc=acc, params=params))
            break
    if plans:
        work = len(active) * chunks if packed > 1 else sum(len(a) for a in active)
        return min(plans, key=lambda t: _conv_cost(layer, t, arch, work,
                                                   2 if t.blocked_input else chunks))
    smallest_in = input_rows(1, 1, False)
    need_sp = BUFFERS * (taps * in_block + smallest_in + 1)
    need_acc = BUFFERS * (1 + CONV_PARAM_ROWS)
    if need_acc > acc_rows:
        raise _too_small(layer.node, "accumulator", need_acc, acc_rows, "one output pixel")
    raise _too_small(layer.node, "scratchpad", need_sp, sp_rows,
                     f"one output pixel of a {kh}x{kw} kernel over {in_block} input channels")


def conv_cost(layer: ConvLayer, t: ConvTiles, arch: Arch) -> float:
    """`_conv_cost` of plan `t` (its K slices counted as `tile_conv` does)."""
    active = active_blocks(layer, t.in_block, t.out_block)
    n_in = ceil_div(layer.in_channels, t.in_block)
    packed = t.packed_taps
    chunks = ceil_div(layer.kernel[1], packed) if packed > 1 else n_in
    work = len(active) * chunks if packed > 1 else sum(len(a) for a in active)
    return _conv_cost(layer, t, arch, work, 2 if t.blocked_input else chunks)


def _conv_cost(layer: ConvLayer, t: ConvTiles, arch: Arch, work: int, slices: int) -> float:
    """A plan's cycles if DMA and the array overlap perfectly: the larger of the load queue's
    time (`isa.LOAD.min_cycles` of its LOADs and their bytes: inputs and weights) and the array's
    (`simulator.units.array`'s COMPUTE time, whose skew or weight shift-in small tiles feel).
    `work` counts the K slices computed per pixel tile, `slices` those loaded per tile by a
    whole-layer plan. An int16 input is twice the bytes and two COMPUTEs a tap (its planes);
    int16 weights are twice the weight bytes and two COMPUTEs a tap (their int8 parts); both
    are four COMPUTEs a tap (`numerics.wide_passes`), each operand's bytes twice."""
    (oh, ow), (th, tw) = layer.out_hw, t.tile_hw
    tiles = layer.batch * ceil_div(oh, th) * ceil_div(ow, tw)
    blocks = ceil_div(layer.out_channels, t.out_block)
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel, layer.strides, layer.dilations
    window = conv_input_extent(th, sh, kh, dh) * conv_input_extent(tw, sw, kw, dw)
    input_bytes = (2 if layer.x_plane else 1) * tiles * window * layer.in_channels * (1 if t.whole_layer else blocks)
    weight_bytes = layer.weights.nbytes * (1 if t.resident_weights else tiles)
    loads = tiles * (slices if t.whole_layer else work)
    if t.whole_layer and not t.resident_weights:
        loads += tiles * blocks  # a weight block per tile and block
    dma = isa.LOAD.min_cycles(arch, loads, input_bytes + weight_bytes)
    return max(dma, _array_cycles(layer, t, arch, work))


def conv_array_cycles(layer: ConvLayer, t: ConvTiles, arch: Arch) -> int:
    """The array's COMPUTE cycles of plan `t` in the cost model (`_conv_cost`): every tile as
    large as the first, every pass of an int16 input's two planes, or of int16 weights' two
    parts, counted."""
    active = active_blocks(layer, t.in_block, t.out_block)
    chunks = ceil_div(layer.kernel[1], t.packed_taps)
    work = len(active) * chunks if t.packed_taps > 1 else sum(len(a) for a in active)
    return _array_cycles(layer, t, arch, work)


def _array_cycles(layer: ConvLayer, t: ConvTiles, arch: Arch, work: int) -> int:
    (oh, ow), (th, tw), (kh, kw) = layer.out_hw, t.tile_hw, layer.kernel
    tiles = layer.batch * ceil_div(oh, th) * ceil_div(ow, tw)
    planes = (2 if layer.x_plane else 1) * layer.weight_passes
    computes = planes * tiles * work * (kh * kw if t.packed_taps == 1 else kh)
    one = isa.COMPUTE(sp=0, acc=0, m_inner=min(th * tw, _MAX_FIELD), k=t.in_block, n=t.out_block,
                      accumulate=1)
    return computes * isa.COMPUTE.cycles(arch, one)


def tile_pool(layer: PoolLayer, arch: Arch) -> PoolTiles:
    sp_rows = arch.scratchpad.rows
    (kh, kw), (sh, sw) = layer.kernel, layer.strides

    in_planes, out_planes = (2 if layer.x_plane else 1), (2 if layer.y_plane else 1)

    def in_rows(rows, cols):  # an int16 input's low plane's window after its high plane's
        return in_planes * conv_input_extent(rows, sh, kh, 1) * conv_input_extent(cols, sw, kw, 1)

    def fits(rows, cols, buffers=BUFFERS):
        return (rows * cols <= _MAX_FIELD
                and buffers * (in_rows(rows, cols) + out_planes * rows * cols) <= sp_rows)

    buffers = BUFFERS
    tile = _best_tile(layer.out_hw, fits)
    if tile is None:  # one window twice does not fit (an int16 map's global pool): one buffer,
        buffers = 1   # each tile's loads after the previous tile's pool (`pool_steps`)
        tile = _best_tile(layer.out_hw, lambda rows, cols: fits(rows, cols, 1))
    if tile is None:
        raise _too_small(layer.node, "scratchpad", in_rows(1, 1) + out_planes, sp_rows,
                         f"one {kh}x{kw} window")
    params = None
    if layer.average:
        params = Region("accumulator", 0, PARAM_ROWS)
        if params.end > arch.accumulator.rows:
            raise _too_small(layer.node, "accumulator", params.end, arch.accumulator.rows,
                             "the parameter blocks")
    inputs = Region("scratchpad", 0, in_rows(*tile), buffers)
    outputs = Region("scratchpad", inputs.end, out_planes * tile[0] * tile[1], buffers)
    return PoolTiles(tile, min(arch.lanes, layer.channels), inputs, outputs, params)


def tile_elementwise(layer: AddLayer | MulLayer | LutLayer, arch: Arch) -> ElementwiseTiles:
    sp_rows = arch.scratchpad.rows
    total_rows = ceil_div(layer.size, arch.lanes)
    if pixelwise(layer):  # one pixel's channel block per row
        n, h, w, c = layer.views[-1].shape
        total_rows = n * h * w * ceil_div(c, arch.lanes)
    binary = isinstance(layer, (AddLayer, MulLayer))  # two operands and a rescale block
    per_channel = isinstance(layer, LutLayer) and layer.per_channel
    table_rows = 0 if binary else isa.lut_table_rows(arch.lanes, per_channel, int(layer.wide),
                                                     int(layer.in_wide), layer.knots[0])
    tables = BUFFERS if per_channel else 1  # a channel block's table loads while one runs
    # An int16 operand or result: two rows (planes) for each row of its bytes.
    a_planes, b_planes, planes = (2 if getattr(layer, f, False) else 1 for f in (
        "a_wide" if binary else "in_wide", "b_wide", "wide"))
    operands = a_planes + (b_planes if binary else 0) + planes
    fit = (sp_rows - tables * table_rows) // (BUFFERS * operands)
    if fit < 1:
        raise _too_small(layer.node, "scratchpad", tables * table_rows + BUFFERS * operands,
                         sp_rows, "one row")
    rows = min(fit, _MAX_FIELD, _ELEMENTWISE_TILE_ROWS, max(total_rows, 1))
    rows = ceil_div(total_rows, ceil_div(total_rows, rows)) if total_rows else 1
    table = Region("scratchpad", 0, table_rows, tables) if not binary else None
    a = Region("scratchpad", table.end if table else 0, rows * a_planes)
    b = Region("scratchpad", a.end, rows * b_planes) if binary else None
    outputs = Region("scratchpad", (b or a).end, rows * planes)
    params = Region("accumulator", 0, PARAM_ROWS) if binary else None
    return ElementwiseTiles(rows, a, b, outputs, table, params)


def tile_softmax(layer: SoftmaxLayer, arch: Arch) -> SoftmaxTiles:
    n, h, w, c = layer.views[1].shape
    c = layer.channels or c  # a reduction's rows: x's channels (y has one)
    blocks = ceil_div(c, arch.lanes)
    planes = 2 if layer.x_plane else 1  # an int16 input's low plane follows its high one
    y_planes = 2 if layer.y_plane else 1  # likewise an int16 output's
    out_blocks = 1 if layer.reduce else blocks
    fit = arch.scratchpad.rows // (BUFFERS * (planes * blocks + y_planes * out_blocks))
    table_rows = 1 if layer.reduce else \
        isa.layernorm_table_rows(arch.lanes, c) if layer.norm else \
        isa.softmax_table_rows(arch.lanes, int(layer.log), int(bool(layer.x_plane)))
    if fit < 1:
        raise _too_small(layer.node, "scratchpad",
                         BUFFERS * (planes * blocks + y_planes * out_blocks),
                         arch.scratchpad.rows, f"one pixel of {c} channels")
    if table_rows > arch.accumulator.rows:
        raise _too_small(layer.node, "accumulator", table_rows, arch.accumulator.rows,
                         "the table")
    pixels = max(n * h * w, 1)
    rows = min(fit, _MAX_FIELD, _ELEMENTWISE_TILE_ROWS, pixels)
    rows = ceil_div(pixels, ceil_div(pixels, rows))
    inputs = Region("scratchpad", 0, planes * blocks * rows)
    outputs = Region("scratchpad", inputs.end, y_planes * out_blocks * rows)
    return SoftmaxTiles(rows, blocks, inputs, outputs, Region("accumulator", 0, table_rows, 1))


def tile_matmul(layer: MatMulLayer, arch: Arch) -> MatMulTiles:
    """K slices of at most the array's rows (and the lanes, which a transposing LOAD fills),
    output-channel blocks of the lanes, and as many rows of a per tile as the memories hold.
    An int16 operand or product takes each of its buffers twice over, a plane in each half."""
    k_block = min(arch.array.rows, arch.lanes)
    n_block = min(arch.array.cols, arch.lanes)
    slices = ceil_div(layer.k, k_block)
    a_planes, b_planes, y_planes = (2 if plane else 1 for plane in
                                    (layer.a_plane, layer.b_plane, layer.y_plane))
    weight_rows = b_planes * layer.k  # all K rows of a block of b, in one LOAD a plane
    per_row = a_planes * slices + y_planes
    fit_sp = (arch.scratchpad.rows - BUFFERS * weight_rows) // (BUFFERS * per_row)
    fit_acc = (arch.accumulator.rows - PARAM_ROWS) // BUFFERS
    fit = min(fit_sp, fit_acc, _MAX_FIELD, _ELEMENTWISE_TILE_ROWS)
    if fit < 1:
        raise _too_small(layer.node, "scratchpad", BUFFERS * (weight_rows + per_row),
                         arch.scratchpad.rows, "one row of the product")
    rows = ceil_div(layer.m, ceil_div(layer.m, min(fit, layer.m)))
    weights = Region("scratchpad", 0, weight_rows)
    inputs = Region("scratchpad", weights.end, a_planes * slices * rows)
    outputs = Region("scratchpad", inputs.end, y_planes * rows)
    params = Region("accumulator", 0, PARAM_ROWS, 1)
    acc = Region("accumulator", params.end, rows)
    return MatMulTiles(rows, k_block, n_block, inputs, weights, outputs, acc, params)


def tile(layer: Layer, arch: Arch, packable: bool = False) -> Tiles:
    """The tiles and local regions of one layer on `arch`."""
    if isinstance(layer, MatMulLayer):
        return tile_matmul(layer, arch)
    if isinstance(layer, SoftmaxLayer):
        return tile_softmax(layer, arch)
    if isinstance(layer, ConvLayer):
        return tile_conv(layer, arch, packable)
    if isinstance(layer, PoolLayer):
        return tile_pool(layer, arch)
    if isinstance(layer, GatherLayer):
        return GatherTiles()
    return tile_elementwise(layer, arch)


def _shifted(tiles: Tiles, shift: dict[str, int]) -> Tiles:
    changes = {f.name: dataclasses.replace(value, base=value.base + shift[value.mem])
               for f in dataclasses.fields(tiles)
               if isinstance(value := getattr(tiles, f.name), Region) and not value.fixed}
    return dataclasses.replace(tiles, **changes)


def alternate(tiles: list[Tiles], arch: Arch, reserved: list[int] | None = None) -> list[Tiles]:
    """Place every other layer's regions at the top of the local memories instead of the
    bottom, so the next layer's parameters and weights can load while this layer still works
    (they would otherwise overwrite its buffers, and wait for it). `reserved[i]`: the scratchpad
    rows at the top that layer i shares with a neighbour (`compiler.backend.reuse`); they stay put
    (`Region.fixed`), and the layer's own regions go below them (and below those of layer i - 1
    when they fit)."""
    out = []
    for i, t in enumerate(tiles):
        if i % 2 == 0:
            out.append(t)
            continue
        regions = [getattr(t, f.name) for f in dataclasses.fields(t)
                   if isinstance(getattr(t, f.name), Region)]
        top = {name: memory.rows for name, memory in zip(isa.MEMORIES, arch.memories)}
        regions = [r for r in regions if not r.fixed]
        own = reserved[i] if reserved else 0
        before = reserved[i - 1] if reserved else 0
        end = max((r.end for r in regions if r.mem == "scratchpad"), default=0)
        # Below the previous layer's shared rows too when there is room, so that this layer's
        # weights still load while that layer works.
        top["scratchpad"] -= before if before > own and end <= top["scratchpad"] - before else own
        if i >= 2:  # below layer i - 2's regions too, when that leaves layers i ± 1 clear
            for mem in top:
                low = min((r.base for r in _own(out[i - 2]) if r.mem == mem), default=top[mem])
                floor = max(_end(tiles[j], mem) for j in (i - 1, i + 1) if j < len(tiles))
                if low < top[mem] and _end(t, mem) <= low - floor:
                    top[mem] = low
        shift = {mem: top[mem] - _end(t, mem) for mem in top}
        out.append(_shifted(t, shift))
    return out


def _own(tiles: Tiles) -> list[Region]:
    """A layer's regions but the rows it shares with a neighbour."""
    return [r for f in dataclasses.fields(tiles)
            if isinstance(r := getattr(tiles, f.name), Region) and not r.fixed]


def _end(tiles: Tiles, mem: str) -> int:
    return max((r.end for r in _own(tiles) if r.mem == mem), default=0)
