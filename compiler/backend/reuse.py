"""On-chip reuse between consecutive layers: an activation that only the next layer reads, and
that fits in the scratchpad beside both layers' own regions, never goes to DRAM.

The consumer must load its whole input as one tile (a convolution's whole-layer plan of one
pixel tile, blocked 1x1 or windowed; a pooling layer of one tile), so its input block has a
fixed layout: one block of window rows per channel block, padding included (`OnChip`). The
producer (a convolution whose output-channel blocks are the consumer's channel blocks)
requantizes each output tile straight into the rows where the consumer's LOAD would have put
those pixels, and stores nothing; the consumer loads nothing. When the consumer's window has
padding, one LOAD with only padding (no DRAM bytes) fills the block with the pad value before
the producer's first REQUANT, which then overwrites the real pixels. The block sits at the top
of the scratchpad, reserved in both layers' plans (`tiling.alternate` keeps it in place, and
the producer is tiled with fewer rows); the tensor gets no DRAM buffer (`memory.plan_dram`).
Tokens come from the scheduler's hazards on local rows, as for every other access.

A batch keeps every image: the producer finishes all of them before the consumer starts, so
the block holds one image's slots after another, and each layer reads or writes its image's.

Pairs are taken in layer order; in a chain (a consumer that keeps its own output too) each
block goes just below the blocks its producer already holds. A pair is kept when
the producer, tiled again with the rows reserved, keeps its pixel tiles and its plan's cost
(`tiling.conv_cost`) grows by less than the DMA cycles the tensor's store and load took.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from compiler.backend.codegen.emit import PAD_MAX, instruction
from compiler.backend.layers import ConvLayer, Lowered, PoolLayer
from compiler.backend.memory import reads
from compiler.backend.tiling import (ConvTiles, PoolTiles, Region, Tiles, active_blocks, ceil_div,
                                     conv_cost, conv_input_extent, tile_conv)
from compiler.errors import CompileError
from simulator import isa
from simulator.arch import Arch


@dataclass(frozen=True)
class OnChip:
    """Where a tensor kept in the scratchpad sits: per image of the batch, `slots` blocks of
    height x width pixel rows, image i's from row `base + i * image_rows`, slot s holding
    channels [s * block, (s + 1) * block); the image's pixel (y, x) at row
    (y + top) * width + x + left of its slot; the other rows are `pad_value`."""

    tensor: str
    base: int
    slots: int
    height: int
    width: int
    top: int
    left: int
    block: int
    pad_value: int
    image_hw: tuple[int, int]
    images: int = 1  # the batch: the consumer reads image by image, the producer writes all

    @property
    def slot_rows(self) -> int:
        return self.height * self.width

    @property
    def image_rows(self) -> int:
        return self.slots * self.slot_rows

    @property
    def rows(self) -> int:
        return self.images * self.image_rows

    @property
    def padded(self) -> bool:
        (h, w) = self.image_hw
        return (self.top > 0 or self.left > 0 or self.height > self.top + h
                or self.width > self.left + w)

    def row(self, y: int, x: int, c0: int, image: int = 0) -> int:
        return (self.base + image * self.image_rows + c0 // self.block * self.slot_rows
                + (y + self.top) * self.width + x + self.left)

    def fill(self, node: str, lanes: int) -> list:
        """The LOADs with only padding that set every row of the block to the pad value (the
        images' slots are contiguous: one run of slots)."""
        slots = self.images * self.slots
        per = slots if slots * self.height <= PAD_MAX else 1
        return [instruction(node, isa.LOAD, mem="scratchpad", sram=self.base + s * self.slot_rows,
                            dram=0, y_size=0, x_size=0, elem_bytes=lanes, x_stride=lanes,
                            y_stride=lanes, pad_top=per * self.height, pad_left=self.width,
                            pad_value=self.pad_value)
                for s in range(0, slots, per)] if self.padded else []


def _consumer_layout(layer, t: Tiles, arch: Arch) -> dict | None:
    """The input block's layout (OnChip's fields but tensor and base) when `layer` loads its
    whole input as one tile, else None."""
    if isinstance(layer, ConvLayer) and isinstance(t, ConvTiles):
        if (layer.x_view is not None or not t.whole_layer or t.tile_hw != layer.out_hw
                or t.packed_taps != 1):
            return None
        n_in = ceil_div(layer.in_channels, t.in_block)
        if t.blocked_input:
            h, w = layer.in_hw
            return dict(slots=n_in, height=h, width=w, top=0, left=0, block=t.in_block,
                        pad_value=layer.x_zero_point, images=layer.batch)
        # every K slice must have its slot (`conv_steps` numbers the used ones)
        used = {ib for a in active_blocks(layer, t.in_block, t.out_block) for ib in a}
        if used != set(range(n_in)):
            return None
        (oh, ow), (kh, kw) = layer.out_hw, layer.kernel
        (sh, sw), (dh, dw) = layer.strides, layer.dilations
        return dict(slots=n_in, height=conv_input_extent(oh, sh, kh, dh),
                    width=conv_input_extent(ow, sw, kw, dw), top=layer.pads[0],
                    left=layer.pads[1], block=t.in_block, pad_value=layer.x_zero_point,
                    images=layer.batch)
    if isinstance(layer, PoolLayer) and isinstance(t, PoolTiles):
        if layer.x_view is not None or t.tile_hw != layer.out_hw:
            return None
        (oh, ow), (kh, kw), (sh, sw) = layer.out_hw, layer.kernel, layer.strides
        return dict(slots=ceil_div(layer.channels, t.channel_block),
                    height=conv_input_extent(oh, sh, kh, 1),
                    width=conv_input_extent(ow, sw, kw, 1), top=layer.pads[0],
                    left=layer.pads[1], block=t.channel_block, pad_value=layer.pad_value,
                    images=layer.batch)
    return None


def _end(t: Tiles) -> int:
    """The first scratchpad row past a plan's regions."""
    return max((r.end for f in dataclasses.fields(t)
                if isinstance(r := getattr(t, f.name), Region) and r.mem == "scratchpad"),
               default=0)


def _own_rows(t: Tiles) -> int:
    """Scratchpad rows a consumer's regions take once its input block is shared."""
    return sum(r.rows * r.count for f in dataclasses.fields(t)
               if isinstance(r := getattr(t, f.name), Region) and r.mem == "scratchpad"
               and f.name != "inputs")


def keep_on_chip(lowered: Lowered, tiles: list[Tiles], arch: Arch,
                 packable: set[str] = frozenset()
                 ) -> tuple[list[Tiles], dict[str, OnChip], list[int]]:
    """Choose the tensors kept in the scratchpad: the tiles with the shared rows reserved and
    placed, the kept tensors' layouts (by tensor), and per layer the rows reserved at the top
    of the scratchpad (for `tiling.alternate`). In a chain (a consumer that also keeps its own
    output), each next block goes just below the blocks its producer already holds."""
    layers = lowered.layers
    readers: dict[str, int] = {}
    for layer in layers:
        for name in reads(layer):
            readers[name] = readers.get(name, 0) + 1
    outputs = {b.tensor for b in lowered.outputs}
    viewed = set(lowered.views.values())
    sp_rows = arch.scratchpad.rows
    plain, tiles = list(tiles), list(tiles)  # each layer's own plan; the plans as shared
    reserved = [0] * len(layers)
    kept: dict[str, OnChip] = {}
    for i in range(len(layers) - 1):
        producer, consumer = layers[i], layers[i + 1]
        # An int16 value's two planes are not kept (REQUANT into a consumer's rows writes
        # one block of int8 codes).
        if not (isinstance(producer, ConvLayer) and producer.y_view is None
                and not producer.y_plane and not getattr(consumer, "x_plane", 0)
                and getattr(consumer, "x", None) == producer.y
                and readers.get(producer.y) == 1 and producer.y not in outputs
                and producer.y not in viewed):
            continue
        found = _try_pair(producer, consumer, plain[i], plain[i + 1], arch,
                          producer.node in packable, sp_rows - reserved[i],
                          kept.get(producer.x))
        if found is None:
            continue
        tiles[i], tiles[i + 1], layout = found
        reserved[i] = reserved[i + 1] = sp_rows - layout.base
        kept[layout.tensor] = layout
    return tiles, kept, reserved


def _share_input(t: Tiles, layout: OnChip) -> Tiles:
    """A consumer's plan reading its input from the shared block: its own outputs move down to
    where its input buffers were."""
    shared = Region("scratchpad", layout.base, layout.rows, 1, fixed=True)
    outputs = dataclasses.replace(t.outputs, base=t.inputs.base)
    return dataclasses.replace(t, inputs=shared, outputs=outputs)


def _layout_fields(layout: OnChip) -> dict:
    return {f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)
            if f.name not in ("tensor", "base", "image_hw")}


def _try_pair(producer: ConvLayer, consumer, p_plain: ConvTiles, c_plain: Tiles, arch: Arch,
              packable: bool, top: int, p_input: OnChip | None):
    """The producer's and consumer's plans sharing a block that ends at row `top`, and its
    layout; None when the consumer does not load its input whole, the rows do not fit, or the
    cost model says no. `p_input`: the producer's own input block, when it is kept too."""
    fields = _consumer_layout(consumer, c_plain, arch)
    if fields is None or fields["block"] != p_plain.out_block:
        return None
    # The same pixels: a consumer may read the bytes as another block (a mean over T of a
    # row-major [N, T, C] a MatMul wrote as N * T pixels of one row).
    if (consumer.batch, consumer.in_hw) != (producer.batch, producer.out_hw):
        return None
    if max(fields["height"], fields["width"]) > PAD_MAX:
        return None
    layout = OnChip(producer.y, 0, image_hw=producer.out_hw, **fields)
    base = top - layout.rows
    if _own_rows(c_plain) > base:
        return None
    layout = dataclasses.replace(layout, base=base)
    # With fewer rows, the plan that already fits below the block stays the cheapest.
    if _end(p_plain) <= base:
        retiled = p_plain
    else:
        try:
            retiled = tile_conv(producer, arch, packable, reserve=arch.scratchpad.rows - base)
        except CompileError:
            return None
    # The same output channel blocks and pixel tiles: smaller tiles would multiply the
    # producer's instructions (compile time, per-instruction overheads the cost leaves out).
    if retiled.out_block != p_plain.out_block or retiled.tile_hw != p_plain.tile_hw:
        return None
    # The DMA the tensor's store and load would take, against what the smaller plan costs.
    size = producer.batch * producer.out_hw[0] * producer.out_hw[1] * producer.out_channels
    saved = isa.STORE.min_cycles(arch, 0, 2 * size)  # their latencies overlap other work
    if conv_cost(producer, retiled, arch) > conv_cost(producer, p_plain, arch) + saved:
        return None
    if p_input is not None:  # it must still read its kept input whole, in the same layout
        if _consumer_layout(producer, retiled, arch) != _layout_fields(p_input):
            return None
        retiled = _share_input(retiled, p_input)
    return retiled, _share_input(c_plain, layout), layout
