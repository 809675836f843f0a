"""Code generation of an embedding lookup: the table into the DRAM image, and GATHERs (the
indexed DMA) that copy the rows its int32 indices pick into the output tensor, as many
instructions as the `count` field needs."""

from __future__ import annotations

from compiler.backend.codegen.emit import Context, instruction
from compiler.backend.layers import GatherLayer
from compiler.backend.memory import ImageBuilder
from compiler.backend.steps import Step
from simulator import isa

INDEX_BYTES = 4  # the indices are int32


def gather_steps(layer: GatherLayer, ctx: Context, image: ImageBuilder) -> list[Step]:
    """One step of GATHERs, each reading its indices from x and writing its rows of y (both
    addresses relative to their tensors until `emit.relocate`)."""
    rows, width = layer.table.shape
    table = image.add(layer.table.tobytes())
    most = isa.GATHER.field("count").range[1]
    ops = tuple(
        instruction(layer.node, isa.GATHER,
                    (ctx.access(layer.x, False), ctx.access(layer.y, True)),
                    relative={"index": layer.x, "dst": layer.y},
                    index=first * INDEX_BYTES, count=min(most, layer.count - first),
                    table=table, rows=rows, row_bytes=width, table_stride=width,
                    dst=first * width, dst_stride=width)
        for first in range(0, layer.count, most))
    return [Step(ops, ())]
