"""Code generation for a MatMul of two activations (`MatMulLayer`) on the array.

One GEMM per (batch, head) index: per tile of a's rows, its K slices load once (rows of k
lanes; one LOAD for all of them, side by side, when a's rows are contiguous); per block of n
output channels, b's K rows load in one LOAD, and each K slice is one PRELOAD of its k x n
weight tile (w_offset: b's zero point) and one COMPUTE of the tile's rows (x_offset: a's zero
point), accumulating over the slices; one REQUANT and one STORE finish the block. An int16
operand is two planes: each is loaded, and each pair of planes is a pass of the array with
its shift (`numerics.activation_passes`); an int16 product is REQUANT wide=1 and a STORE per
plane. An operand whose lanes are not contiguous in DRAM (Kᵀ read from K stored [S, Dh], a
transposed a) loads with LOAD transpose=1, a corner turn: the Transpose before the MatMul
costs no copy.
"""

from __future__ import annotations

from compiler.backend.codegen.emit import Context, instruction, load_acc_rows
from compiler.backend.layers import MatMulLayer, Operand
from compiler.backend.memory import ImageBuilder
from compiler.backend.steps import Step
from compiler.backend.tiling import PARAM_ROWS, MatMulTiles
from simulator import isa, numerics


def _load_rows(node: str, ctx: Context, operand: Operand, offset: int, sram: int, count: int,
               lanes: int):
    """Rows [0, count) x lanes [0, lanes) of the matrix at `offset` into rows from `sram`:
    one element a row when the lanes are contiguous, else a corner turn (lane l of row e is
    element (e, l), line l read at the lanes' stride)."""
    access = ctx.access(operand.tensor, False)
    if operand.cols == 1 or lanes == 1:
        return instruction(node, isa.LOAD, access, mem="scratchpad", sram=sram, dram=offset,
                           y_size=count, x_size=1, elem_bytes=lanes, x_stride=lanes,
                           y_stride=operand.rows)
    return instruction(node, isa.LOAD, access, mem="scratchpad", sram=sram, dram=offset,
                       y_size=lanes, x_size=count, elem_bytes=1, x_stride=operand.rows,
                       y_stride=operand.cols, transpose=1)


def _interleaved(layer: MatMulLayer, kb: int, slices: int) -> bool:
    """Whether a tile of a's rows loads in one LOAD, its K slices side by side (row m * slices
    + j holds slice j of row m; COMPUTE walks slice j at inner_stride = slices): a's rows are
    contiguous and its K splits into whole slices."""
    return (layer.a.cols == 1 or layer.k == 1) and layer.k % kb == 0 and \
        slices <= isa.COMPUTE.field("inner_stride").range[1]


def _planes(plane: int, zero_point: int) -> tuple[tuple[int, int], ...]:
    """(bytes from the operand's high plane, the offset the array subtracts) of each plane:
    an int8 operand's one, less its zero point; an int16 operand's high plane (zero point 0:
    int16 codes are symmetric) and its low one, which holds the low byte - 128
    (`numerics.split_wide`)."""
    if not plane:
        return ((0, zero_point),)
    return ((0, 0), (plane, -numerics.WIDE_LOW_OFFSET))


def matmul_steps(layer: MatMulLayer, tiles: MatMulTiles, ctx: Context,
                 image: ImageBuilder) -> list[Step]:
    arch, node, a, b = ctx.arch, layer.node, layer.a, layer.b
    kb, nb, tile_rows = tiles.k_block, tiles.n_block, tiles.rows
    slices = [(k0, min(kb, layer.k - k0)) for k0 in range(0, layer.k, kb)]
    interleaved = _interleaved(layer, kb, len(slices))
    a_planes, b_planes = _planes(layer.a_plane, layer.a_zero_point), \
        _planes(layer.b_plane, layer.b_zero_point)
    passes = numerics.activation_passes(bool(layer.a_plane), bool(layer.b_plane))
    y_planes = (0, layer.y_plane) if layer.y_plane else (0,)
    params = image.add(isa.ParamBlock([layer.multiplier] * arch.lanes,
                                      [layer.shift] * arch.lanes).pack(arch.lanes))
    pending = [load_acc_rows(node, arch, tiles.params.base, params, PARAM_ROWS)]
    qmin, qmax = layer.qclamp
    steps, tile_count, block_count = [], 0, 0
    for g, y_offset in enumerate(layer.y_offsets):
        for m0 in range(0, layer.m, tile_rows):
            rows = min(tile_rows, layer.m - m0)
            in_row = ctx.buffer(tiles.inputs, tile_count)
            tile_count += 1
            first = a.offsets[g] + m0 * a.rows
            stream = []  # per plane of a, per K slice: the COMPUTE's rows
            for p, (gap, _) in enumerate(a_planes):
                base = in_row + p * len(slices) * tile_rows
                if interleaved:
                    pending.append(instruction(
                        node, isa.LOAD, ctx.access(a.tensor, False), mem="scratchpad",
                        sram=base, dram=first + gap, y_size=rows, x_size=len(slices),
                        elem_bytes=kb, x_stride=kb, y_stride=a.rows))
                    stream.append([dict(sp=base + j, m_inner=rows, inner_stride=len(slices))
                                   for j in range(len(slices))])
                else:
                    pending += [_load_rows(node, ctx, a, first + gap + k0 * a.cols,
                                           base + j * tile_rows, rows, kk)
                                for j, (k0, kk) in enumerate(slices)]
                    stream.append([dict(sp=base + j * tile_rows, m_inner=rows)
                                   for j in range(len(slices))])
            for n0 in range(0, layer.n, nb):
                n = min(nb, layer.n - n0)
                w_row, acc_row = ctx.buffer(tiles.weights, block_count), \
                    ctx.buffer(tiles.acc, block_count)
                out_row = ctx.buffer(tiles.outputs, block_count)
                block_count += 1
                # All K slices of b at once, a plane at a time: slice j's k rows are rows
                # [k0, k0 + kk) of its plane's block.
                loads = pending + [_load_rows(node, ctx, b, b.offsets[g] + n0 * b.cols + gap,
                                              w_row + q * layer.k, layer.k, n)
                                   for q, (gap, _) in enumerate(b_planes)]
                pending = []
                body, computed = [], 0
                for j, (k0, kk) in enumerate(slices):
                    preloaded = None
                    for p, q, shift in passes:
                        if q != preloaded:
                            body.append(instruction(node, isa.PRELOAD,
                                                    sp=w_row + q * layer.k + k0, k=kk,
                                                    w_offset=b_planes[q][1]))
                            preloaded = q
                        body.append(instruction(node, isa.COMPUTE, **stream[p][j], acc=acc_row,
                                                k=kk, n=n, accumulate=int(computed > 0),
                                                x_offset=a_planes[p][1],
                                                **({"shift": shift} if shift else {})))
                        computed += 1
                body.append(instruction(node, isa.REQUANT, acc=acc_row, sp=out_row, rows=rows,
                                        param=tiles.params.base,
                                        out_offset=layer.out_zero_point, qmin=qmin, qmax=qmax,
                                        **({"wide": 1} if layer.y_plane else {})))
                body += [instruction(node, isa.STORE, ctx.access(layer.y, True),
                                     mem="scratchpad", sram=out_row + i * rows,
                                     dram=y_offset + m0 * layer.y_row + n0 + gap, y_size=rows,
                                     x_size=1, elem_bytes=n, x_stride=n, y_stride=layer.y_row)
                         for i, gap in enumerate(y_planes)]
                steps.append(Step(tuple(loads), tuple(body)))
    return steps
