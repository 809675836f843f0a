"""The backend's options and what joins its steps into a Program: the I/O bindings, the
convolutions that may read a pre-padded model input, and the summary the compile command
prints. The steps run in the order `compiler.pipeline.compile_int8` lists them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from compiler.backend.codegen.convolution import PaddedInput
from compiler.backend.layers import (ConvLayer, HostLayer, Lowered, MatMulLayer,
                                     transpose_input_strides)
from compiler.backend.memory import DramPlan, reads
from compiler.backend.schedule import Scheduled
from compiler.backend.tiling import Region, Tiles
from simulator import isa
from simulator.arch import Arch
from simulator.program import IOBinding, Program


@dataclass(frozen=True)
class BackendOptions:
    double_buffer: bool = True  # ping-pong local buffers so DMA overlaps compute
    allow_host: bool = False  # nodes the accelerator cannot run go to host segments

    def to_dict(self) -> dict:
        return {"double_buffer": self.double_buffer, "allow_host": self.allow_host}


@dataclass(frozen=True)
class Summary:
    """What the compile command reports: sizes, memory use and the cycle figures."""

    layers: int
    instructions: int
    per_queue: dict
    syncs: int
    macs: int  # the model's: what the roofline counts
    array_macs: int  # issued to the array, zero blocks of grouped convolutions included
    dram_image_bytes: int
    activation_peak_bytes: int
    activation_lower_bound_bytes: int
    dram_total_bytes: int
    scratchpad_peak_bytes: int  # the largest layer's local buffers (all ping-pong halves)
    accumulator_peak_bytes: int
    compulsory_dram_bytes: int
    dram_bytes_moved: int
    # The busiest unit's (or the DRAM port's) cycles: a lower bound that assumes every unit
    # overlaps every other perfectly. Layers mostly wait for the one before them, and each
    # layer's first loads and last stores overlap nothing, so a run takes longer; the machine's
    # own timing (`simulator.machine.timing`) gives the cycles.
    busiest_unit_cycles: int
    bound_cycles: int  # the roofline, `Program.bound`, of the model's MACs
    per_layer: tuple[dict, ...] = field(default=())
    # What runs on the host: per segment its nodes, flops, DRAM bytes and HOST cycles.
    host_segments: tuple[dict, ...] = field(default=())

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Compiled:
    program: Program
    summary: Summary


def packable(lowered: Lowered) -> set[str]:
    """Convolutions that alone read a model input, as the input's own N x C x H x W (not
    through a Reshape that splits or merges its axes): that input may be stored pre-padded,
    its binding's strides those of the padded map (`bindings`)."""
    readers: dict[str, list] = {}
    for layer in lowered.layers:
        for name in reads(layer):
            readers.setdefault(name, []).append(layer)
    outputs = {b.tensor for b in lowered.outputs}
    inputs = {b.tensor: b for b in lowered.inputs}
    return {layers[0].node for tensor, layers in readers.items()
            if tensor in inputs and tensor not in outputs
            and len(layers) == 1 and isinstance(layers[0], ConvLayer)
            and layers[0].x_view is None and _as_map(inputs[tensor]) == (
                layers[0].batch, layers[0].in_channels, *layers[0].in_hw)}


def _as_map(b) -> tuple[int, ...]:
    """A binding's shape as the N x C x H x W its tensor holds (its perm undone)."""
    perm = b.perm or tuple(range(len(b.shape)))
    return tuple(b.shape[axis] for axis in perm)


def bindings(lowered: Lowered, plan: DramPlan,
             padded: dict[str, PaddedInput]) -> tuple[tuple[IOBinding, ...], ...]:
    def binding(b):
        if b.tensor in padded:  # inside its zero-point border, rows of the padded width
            p = padded[b.tensor]  # (an int16 input: each plane inside its own copy's border)
            perm = b.perm or tuple(range(len(b.shape)))
            c = b.shape[perm[1]]  # the tensor's N x C x H x W is the binding's, permuted
            dram = p.address + (p.top * p.width + p.left) * c
            nchw = (p.height * p.width * c, 1, p.width * c, c)
            return IOBinding(b.name, dram, b.shape, b.scale, b.zero_point,
                             "int16" if p.plane else "int8", transpose_input_strides(perm, nchw),
                             p.plane)
        return IOBinding(b.name, plan.addresses[b.tensor] + b.offset, b.shape, b.scale,
                         b.zero_point, b.dtype, b.strides, b.plane)
    return (tuple(binding(b) for b in lowered.inputs),
            tuple(binding(b) for b in lowered.outputs))


def local_footprint(tiles: list[Tiles], arch: Arch) -> tuple[int, int]:
    """Bytes of scratchpad and accumulator the largest layer's regions take."""
    peak = dict.fromkeys(isa.MEMORIES, 0)
    for t in tiles:
        used = dict.fromkeys(isa.MEMORIES, 0)
        for f in dataclasses.fields(t):
            region = getattr(t, f.name)
            if isinstance(region, Region):
                used[region.mem] += region.rows * region.count
        peak = {mem: max(peak[mem], used[mem]) for mem in peak}
    return (peak["scratchpad"] * arch.scratchpad.row_bytes,
            peak["accumulator"] * arch.accumulator.row_bytes)


def summarize(lowered: Lowered, plan: DramPlan, scheduled: Scheduled, program: Program,
              tiles: list[Tiles]) -> Summary:
    arch = program.arch
    insns = scheduled.instructions[:-1]
    per_queue = {q: 0 for q in isa.QUEUES}
    busy = {q: 0 for q in isa.QUEUES}
    dram_moved = transfer = 0
    layer_macs: dict[str, int] = {}
    host_cycles: dict[str, int] = {}
    # Cost and work are functions of the fields alone, which equal instructions share (codegen
    # builds each once; a flagged copy keeps its fields): each is computed once.
    costs: dict[int, tuple] = {}
    for insn, source in zip(insns, scheduled.source):
        cost = costs.get(id(insn.args))
        if cost is None:
            work = insn.op.work(arch, insn)
            cost = costs[id(insn.args)] = (
                insn.queue, insn.op.cycles(arch, insn), work.dram_read + work.dram_written,
                # LOAD, STORE, HOST: the one DRAM port
                0 if insn.op.transfer is None else insn.op.transfer(arch, insn), work.macs,
                insn.op is isa.HOST)
        q, cycles, moved, moving, macs, on_host = cost
        per_queue[q] += 1
        busy[q] += cycles
        dram_moved += moved
        transfer += moving
        if on_host:
            host_cycles[source] = host_cycles.get(source, 0) + cycles
        layer_macs[source] = layer_macs.get(source, 0) + macs
    array_macs = sum(layer_macs.values())
    per_layer = tuple({"name": layer.node, "kind": type(layer).__name__.removesuffix("Layer"),
                       "macs": layer.macs if isinstance(layer, (ConvLayer, MatMulLayer)) else 0,
                       "array_macs": layer_macs.get(layer.node, 0)} for layer in lowered.layers)
    return Summary(
        layers=len(lowered.layers), instructions=len(scheduled.instructions),
        per_queue=per_queue, syncs=scheduled.syncs, macs=program.roofline_macs(array_macs),
        array_macs=array_macs,
        dram_image_bytes=plan.image_bytes, activation_peak_bytes=plan.peak_bytes,
        activation_lower_bound_bytes=plan.lower_bound_bytes, dram_total_bytes=plan.total_bytes,
        scratchpad_peak_bytes=local_footprint(tiles, arch)[0],
        accumulator_peak_bytes=local_footprint(tiles, arch)[1],
        compulsory_dram_bytes=program.compulsory_dram_bytes, dram_bytes_moved=dram_moved,
        busiest_unit_cycles=max(max(busy.values()), transfer),
        bound_cycles=program.bound(array_macs, dram_moved)[0],
        per_layer=per_layer, host_segments=tuple(
            {"name": layer.node, "nodes": list(layer.nodes), "flops": layer.flops,
             "read_bytes": layer.read_bytes, "write_bytes": layer.write_bytes,
             "compute_cycles": arch.host_cycles(layer.flops),
             "cycles": host_cycles.get(layer.node, 0)}
            for layer in lowered.layers if isinstance(layer, HostLayer)))
