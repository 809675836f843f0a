"""Building instructions for codegen: the shared context, one checked instruction, parameter
blocks, input windows with their padding, pixel tiles, and relocation of DRAM addresses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.errors import CompileError
from compiler.schedule import Op, Step
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


def instruction(node: str, row: isa.InsnDef, access=None, **args) -> Op:
    """An instruction of layer `node`; `access` names the activation tensor it touches
    (`Context.access`), or is a tuple of them for an instruction touching several."""
    accesses = () if access is None else (access,) if isinstance(access[0], str) else access
    op = Op(row, args, node, tuple(accesses))
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


def load_acc_rows(node: str, arch: Arch, sram: int, dram: int, rows: int) -> Op:
    row_bytes = arch.accumulator.row_bytes
    return instruction(node, isa.LOAD, mem="accumulator", sram=sram, dram=dram, y_size=rows, x_size=1,
               elem_bytes=row_bytes, x_stride=row_bytes, y_stride=row_bytes)


@dataclass(frozen=True)
class Window:
    """The input block one output tile reads: DRAM start, sizes and the padding around it."""

    dram_offset: int  # pixels from the start of the image
    y_size: int
    x_size: int
    pads: tuple[int, int, int, int]  # top, bottom, left, right
    height: int
    width: int


def input_window(in_hw, origin, extent, pads_tl) -> Window:
    (h, w), (iy0, ix0), (ih, iw) = in_hw, origin, extent
    iy0 -= pads_tl[0]
    ix0 -= pads_tl[1]
    y_lo, y_hi = max(iy0, 0), min(iy0 + ih, h)
    x_lo, x_hi = max(ix0, 0), min(ix0 + iw, w)
    if y_hi <= y_lo or x_hi <= x_lo:  # the whole block is padding
        return Window(0, 0, 0, (ih, 0, iw, 0), ih, iw)
    pads = (y_lo - iy0, iy0 + ih - y_hi, x_lo - ix0, ix0 + iw - x_hi)
    return Window(y_lo * w + x_lo, y_hi - y_lo, x_hi - x_lo, pads, ih, iw)


def load_window(node: str, ctx: Context, tensor: str, image_offset: int, win: Window,
                 channels: int, c0: int, block: int, sram: int, pad_value: int, width: int) -> Op:
    if max(win.pads) > _PAD_MAX:
        raise CompileError(f"layer {node!r}: padding of {max(win.pads)} pixels exceeds the "
                           f"LOAD pad field ({_PAD_MAX})")
    dram = (image_offset + win.dram_offset) * channels + c0
    return instruction(node, isa.LOAD, ctx.access(tensor, False), mem="scratchpad", sram=sram, dram=dram,
               y_size=win.y_size, x_size=win.x_size, elem_bytes=block, x_stride=channels,
               y_stride=width * channels, pad_top=win.pads[0], pad_bottom=win.pads[1],
               pad_left=win.pads[2], pad_right=win.pads[3], pad_value=pad_value)


def pixel_tile_grid(batch: int, out_hw, tile_hw):
    (oh, ow), (th, tw) = out_hw, tile_hw
    for image in range(batch):
        for y0 in range(0, oh, th):
            for x0 in range(0, ow, tw):
                yield image, y0, min(th, oh - y0), x0, min(tw, ow - x0)


def relocate(steps: list[Step], addresses: dict[str, int], sizes: dict[str, int]) -> list[Step]:
    """Add each activation's DRAM base to the instructions that name it; their DRAM access
    becomes the tensor's byte interval, which the scheduler's hazard check compares."""
    def fix(op: Op) -> Op:
        if not op.dram:
            return op
        intervals = tuple((addresses[t], addresses[t] + max(sizes[t], 1), write)
                          for t, write in op.dram)
        args = op.args
        if "dram" in args:  # a DMA names one tensor: its address becomes absolute
            (tensor, _), = op.dram
            args = {**args, "dram": args["dram"] + addresses[tensor]}
        return Op(op.row, args, op.source, intervals)
    return [Step(tuple(map(fix, s.loads)), tuple(map(fix, s.body))) for s in steps]
