"""Code generation for a MatMul of two activations (`MatMulLayer`) on the array.

One GEMM per (batch, head) index: per tile of a's rows, its K slices load once (rows of k
lanes; one LOAD for all of them, side by side, when a's rows are contiguous); per block of n
output channels, b's K rows load in one LOAD, and each K slice is one PRELOAD of its k x n
weight tile (w_offset: b's zero point) and one COMPUTE of the tile's rows (x_offset: a's zero
point), accumulating over the slices; one REQUANT and one STORE finish the block. An operand
whose lanes are not contiguous in DRAM (Kᵀ read from K stored [S, Dh], a transposed a) loads
with LOAD transpose=1, a corner turn: the Transpose before the MatMul costs no copy.
"""

from __future__ import annotations

from compiler.backend.codegen.emit import Context, instruction, load_acc_rows
from compiler.backend.layers import MatMulLayer, Operand
from compiler.backend.memory import ImageBuilder
from compiler.backend.steps import Step
from compiler.backend.tiling import PARAM_ROWS, MatMulTiles
from simulator import isa


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


def matmul_steps(layer: MatMulLayer, tiles: MatMulTiles, ctx: Context,
                 image: ImageBuilder) -> list[Step]:
    arch, node, a, b = ctx.arch, layer.node, layer.a, layer.b
    kb, nb, tile_rows = tiles.k_block, tiles.n_block, tiles.rows
    slices = [(k0, min(kb, layer.k - k0)) for k0 in range(0, layer.k, kb)]
    interleaved = _interleaved(layer, kb, len(slices))
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
            if interleaved:
                pending.append(instruction(
                    node, isa.LOAD, ctx.access(a.tensor, False), mem="scratchpad", sram=in_row,
                    dram=first, y_size=rows, x_size=len(slices), elem_bytes=kb, x_stride=kb,
                    y_stride=a.rows))
                stream = [dict(sp=in_row + j, m_inner=rows, inner_stride=len(slices))
                          for j in range(len(slices))]
            else:
                pending += [_load_rows(node, ctx, a, first + k0 * a.cols, in_row + j * tile_rows,
                                       rows, kk) for j, (k0, kk) in enumerate(slices)]
                stream = [dict(sp=in_row + j * tile_rows, m_inner=rows)
                          for j in range(len(slices))]
            for n0 in range(0, layer.n, nb):
                n = min(nb, layer.n - n0)
                w_row, acc_row = ctx.buffer(tiles.weights, block_count), \
                    ctx.buffer(tiles.acc, block_count)
                out_row = ctx.buffer(tiles.outputs, block_count)
                block_count += 1
                # All K slices of b at once: slice j's k rows are rows [k0, k0 + kk).
                loads = pending + [_load_rows(node, ctx, b, b.offsets[g] + n0 * b.cols, w_row,
                                              layer.k, n)]
                pending = []
                body = []
                for j, (k0, kk) in enumerate(slices):
                    body += [instruction(node, isa.PRELOAD, sp=w_row + k0, k=kk,
                                         w_offset=layer.b_zero_point),
                             instruction(node, isa.COMPUTE, **stream[j], acc=acc_row, k=kk,
                                         n=n, accumulate=int(j > 0),
                                         x_offset=layer.a_zero_point)]
                body += [instruction(node, isa.REQUANT, acc=acc_row, sp=out_row, rows=rows,
                                     param=tiles.params.base, out_offset=layer.out_zero_point,
                                     qmin=qmin, qmax=qmax),
                         instruction(node, isa.STORE, ctx.access(layer.y, True),
                                     mem="scratchpad", sram=out_row,
                                     dram=y_offset + m0 * layer.y_row + n0, y_size=rows,
                                     x_size=1, elem_bytes=n, x_stride=n, y_stride=layer.y_row)]
                steps.append(Step(tuple(loads), tuple(body)))
    return steps
