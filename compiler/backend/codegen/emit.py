"""Building instructions for codegen: the shared context, one checked instruction, parameter
block loads, input windows with their padding, pixel tiles, and relocation of DRAM addresses."""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.backend.layers import View
from compiler.backend.steps import Op, Step
from compiler.errors import CompileError
from simulator import isa
from simulator.arch import Arch
from simulator.errors import SimulatorError

# The most padding a LOAD writes on one side (its pad fields' range).
PAD_MAX = min(isa.LOAD.field(f"pad_{side}").range[1] for side in ("top", "bottom", "left", "right"))


@dataclass(frozen=True)
class Context:
    """What every layer's codegen reads: the target and whether buffers alternate.

    The DRAM address of an activation is not known yet (the image grows as layers are
    generated, and activations live above it): an instruction touching one carries the
    address relative to the tensor and names the tensor; `relocate` adds the bases. A tensor
    kept in the scratchpad (`on_chip`) is written there by its producer and read in place by
    its consumer, with no DMA."""

    arch: Arch
    double_buffer: bool
    on_chip: dict = field(default_factory=dict)  # tensor → its `compiler.backend.reuse.OnChip` rows

    def buffer(self, region, i: int) -> int:
        return region.base + (i % (region.count if self.double_buffer else 1)) * region.rows

    @staticmethod
    def access(tensor: str, write: bool, view: View | None = None) -> tuple:
        """An access to activation `tensor`: the whole buffer, or only the bytes `view` spans
        (so that writers of disjoint parts of one buffer, as Concat's producers, and readers
        of disjoint slices are not ordered by false hazards)."""
        return (tensor, write) if view is None else (tensor, write, *view.span())


def instruction(node: str, row: isa.InsnDef, access=None, relative=None, **args) -> Op:
    """An instruction of layer `node`; `access` names the activation tensor it touches
    (`Context.access`), or is a tuple of them for an instruction touching several;
    `relative` maps the fields other than a DMA's `dram` that hold an address relative to a
    tensor to that tensor (`relocate` adds its base)."""
    accesses = () if access is None else (access,) if isinstance(access[0], str) else access
    op = Op(row, args, node, tuple(accesses), dict(relative or {}))
    try:
        op.insn  # check every field now, where the layer is known
    except SimulatorError as err:
        raise CompileError(f"layer {node!r}: {err}") from None
    return op


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
    y: int = 0  # the first real pixel's row and column in the image
    x: int = 0


def input_window(in_hw, origin, extent, pads_tl) -> Window:
    (h, w), (iy0, ix0), (ih, iw) = in_hw, origin, extent
    iy0 -= pads_tl[0]
    ix0 -= pads_tl[1]
    y_lo, y_hi = max(iy0, 0), min(iy0 + ih, h)
    x_lo, x_hi = max(ix0, 0), min(ix0 + iw, w)
    if y_hi <= y_lo or x_hi <= x_lo:  # the whole block is padding
        return Window(0, 0, 0, (ih, 0, iw, 0), ih, iw)
    pads = (y_lo - iy0, iy0 + ih - y_hi, x_lo - ix0, ix0 + iw - x_hi)
    return Window(y_lo * w + x_lo, y_hi - y_lo, x_hi - x_lo, pads, ih, iw, y_lo, x_lo)


def load_window(node: str, ctx: Context, tensor: str, view: View, image: int, win: Window,
                c0: int, block: int, sram: int, pad_value: int) -> Op:
    """The window `win` of image `image`, channels [c0, c0 + block), of a feature map that is
    `view` of buffer `tensor`, into pixel rows from `sram` with its padding filled."""
    if max(win.pads) > PAD_MAX:
        raise CompileError(f"layer {node!r}: padding of {max(win.pads)} pixels exceeds the "
                           f"LOAD pad field ({PAD_MAX})")
    dram = view.at(image, win.y, win.x, c0)
    return instruction(node, isa.LOAD, ctx.access(tensor, False, view), mem="scratchpad",
               sram=sram, dram=dram,
               y_size=win.y_size, x_size=win.x_size, elem_bytes=block, x_stride=view.pixel,
               y_stride=view.row, pad_top=win.pads[0], pad_bottom=win.pads[1],
               pad_left=win.pads[2], pad_right=win.pads[3], pad_value=pad_value)


def pixel_tile_grid(batch: int, out_hw, tile_hw):
    (oh, ow), (th, tw) = out_hw, tile_hw
    for image in range(batch):
        for y0 in range(0, oh, th):
            for x0 in range(0, ow, tw):
                yield image, y0, min(th, oh - y0), x0, min(tw, ow - x0)


def _dma_span(args: dict, write: bool) -> tuple:
    """(start, stop, write, pattern): the DRAM bytes a strided LOAD or STORE touches, first to
    last, and its (y_size, x_size, elem_bytes, x_stride, y_stride), so that the scheduler can
    tell apart the interleaved channel blocks of one feature map."""
    y, x, eb = args["y_size"], args["x_size"], args["elem_bytes"]
    start = args["dram"]
    if y * x * eb == 0:
        return (start, start, write)
    stop = start + (y - 1) * args["y_stride"] + (x - 1) * args["x_stride"] + eb
    return (start, stop, write, (y, x, eb, args["x_stride"], args["y_stride"]))


def relocate(steps: list[Step], addresses: dict[str, int], sizes: dict[str, int]) -> list[Step]:
    """Add each activation's DRAM base to the instructions that name it; their DRAM access
    becomes a byte interval, which the scheduler's hazard check compares: a DMA's own span,
    any other instruction's whole tensor (or the part of it its view names)."""
    def fix(op: Op) -> Op:
        if not op.dram:
            return op
        args = op.args
        if "dram" in args:  # a DMA names one tensor: its address becomes absolute, and its
            #                 access the bytes it spans, so that the next layer's first loads
            #                 wait only for the stores of the rows they read
            (tensor, write, *_), = op.dram
            base = addresses[tensor]
            args = {**args, "dram": args["dram"] + base}
            return Op(op.row, args, op.source, (_dma_span(args, write),))
        intervals = tuple((addresses[t] + span[0], addresses[t] + span[1], write)
                          if span else (addresses[t], addresses[t] + max(sizes[t], 1), write)
                          for t, write, *span in op.dram)
        args = {**args, **{name: args[name] + addresses[t] for name, t in op.relative.items()}}
        return Op(op.row, args, op.source, intervals)
    return [Step(tuple(map(fix, s.loads)), tuple(map(fix, s.body))) for s in steps]
