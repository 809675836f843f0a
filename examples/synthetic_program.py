"""A synthetic program with ResNet-18's convolution shapes (224x224 input, batch 1), written
directly in machine instructions, for measuring the simulator on a program of real size.

It is tiled the way a weight-stationary compiler would: per output tile and 16-channel output
block, one PRELOAD and one strided COMPUTE per kernel position and input-channel block, then
REQUANT and STORE; loads, accumulators and outputs double-buffered with dependency tokens. The
data is zero; the work per instruction is the real one.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator import isa
from simulator.arch import Arch
from simulator.program import Program


@dataclass(frozen=True)
class Conv:
    name: str
    size_in: int
    cin: int
    cout: int
    kernel: int
    stride: int

    @property
    def pad(self) -> int:
        return self.kernel // 2

    @property
    def size_out(self) -> int:
        return (self.size_in + 2 * self.pad - self.kernel) // self.stride + 1


def resnet18_convs() -> list[Conv]:
    convs = [Conv("conv1", 224, 3, 64, 7, 2)]
    size, cin = 56, 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            prefix = f"layer{stage}.{block}"
            convs.append(Conv(f"{prefix}.conv1", size, cin, cout, 3, stride))
            if stride == 2 or cin != cout:
                convs.append(Conv(f"{prefix}.downsample", size, cin, cout, 1, stride))
            size = (size + 2 - 3) // stride + 1
            convs.append(Conv(f"{prefix}.conv2", size, cout, cout, 3, 1))
            cin = cout
    convs.append(Conv("fc", 1, 512, 1000, 1, 1))
    return convs


@dataclass(frozen=True)
class Layout:
    """Fixed scratchpad regions shared by every layer, so that buffer reuse across layers is
    ordered by the same double-buffering tokens: inputs, weights and outputs, two of each."""

    acc_half: int
    input_rows: int
    weights_base: int
    weight_rows: int
    out_base: int

    @classmethod
    def of(cls, arch: Arch, convs: list[Conv]) -> "Layout":
        acc_half = (arch.accumulator.rows - 2) // 2  # the last two rows hold the params
        weight_rows = max(c.kernel * c.kernel * -(-c.cin // arch.lanes) for c in convs) \
            * arch.lanes
        out_base = arch.scratchpad.rows - 2 * acc_half
        input_rows = (out_base - 2 * weight_rows) // 2
        if input_rows <= 0:
            raise ValueError(f"{arch.name}: the scratchpad cannot double-buffer the weights")
        return cls(acc_half, input_rows, 2 * input_rows, weight_rows, out_base)


def conv_jobs(arch: Arch, conv: Conv, layout: Layout, job: int, tile: int, dram: int):
    """(load, compute, vector, store) instruction lists, one per output tile x 16 channels;
    `job` and `tile` count from the start of the network so buffer parities continue."""
    lanes = arch.lanes
    cin_blocks = -(-conv.cin // lanes)
    cout_blocks = -(-conv.cout // lanes)
    width_in = conv.size_in + 2 * conv.pad
    taps = conv.kernel * conv.kernel * cin_blocks
    tile_h = max(1, min(conv.size_out, layout.acc_half // conv.size_out))
    while (tile_h - 1) * conv.stride + conv.kernel > layout.input_rows // (cin_blocks * width_in):
        if tile_h == 1:
            raise ValueError(f"{conv.name}: an input tile does not fit the scratchpad")
        tile_h -= 1
    rows_in = (tile_h - 1) * conv.stride + conv.kernel
    in_rows = rows_in * width_in
    jobs = []
    for y0 in range(0, conv.size_out, tile_h):
        h = min(tile_h, conv.size_out - y0)
        m = h * conv.size_out
        in_buf = (tile % 2) * layout.input_rows
        for cb in range(cout_blocks):
            loads = []
            if cb == 0:
                for c in range(cin_blocks):
                    loads.append(isa.LOAD(
                        mem="scratchpad", sram=in_buf + c * in_rows, dram=dram + c * lanes,
                        y_size=rows_in - conv.pad if y0 == 0 else rows_in,
                        x_size=conv.size_in, elem_bytes=min(lanes, conv.cin),
                        x_stride=conv.cin, y_stride=conv.size_in * conv.cin,
                        pad_top=conv.pad if y0 == 0 else 0,
                        pad_left=conv.pad, pad_right=conv.pad))
            w_buf = layout.weights_base + (job % 2) * layout.weight_rows
            loads.append(isa.LOAD(mem="scratchpad", sram=w_buf, dram=dram, y_size=taps * lanes,
                                  x_size=1, elem_bytes=lanes, x_stride=lanes, y_stride=lanes))
            acc = (job % 2) * layout.acc_half
            computes = []
            for t in range(taps):
                c, tap = divmod(t, conv.kernel * conv.kernel)
                ky, kx = divmod(tap, conv.kernel)
                computes.append(isa.PRELOAD(sp=w_buf + t * lanes, k=lanes))
                computes.append(isa.COMPUTE(
                    sp=in_buf + c * in_rows + ky * width_in + kx, acc=acc, m_outer=h,
                    m_inner=conv.size_out, outer_stride=conv.stride * width_in,
                    inner_stride=conv.stride, k=lanes, n=lanes, accumulate=int(t > 0)))
            out = layout.out_base + (job % 2) * layout.acc_half
            vector = [isa.REQUANT(acc=acc, sp=out, rows=m, param=arch.accumulator.rows - 2)]
            store = [isa.STORE(mem="scratchpad", sram=out, dram=dram, y_size=m, x_size=1,
                               elem_bytes=lanes, x_stride=conv.cout, y_stride=conv.cout)]
            jobs.append((loads, computes, vector, store))
            job += 1
        tile += 1
    return jobs, tile


def _flag(insn: isa.Insn, **flags) -> isa.Insn:
    args = dict(insn.args)
    names = {name: bool(insn.deps & bit) for bit, name in
             zip((isa.POP_PREV, isa.POP_NEXT, isa.PUSH_PREV, isa.PUSH_NEXT), isa.DEPS)}
    names.update(flags)
    return insn.op(**args, **names)


def resnet18_program(arch: Arch, convs: list[Conv] | None = None) -> Program:
    """Interleave the jobs' queues and add the double-buffering tokens (all of ResNet-18's
    convolutions, or just `convs`)."""
    convs = resnet18_convs() if convs is None else convs
    layout = Layout.of(arch, convs)
    jobs, tile = [], 0
    for conv in convs:
        layer, tile = conv_jobs(arch, conv, layout, len(jobs), tile, dram=0x100000)
        jobs += [(conv.name, job) for job in layer]
    count = len(jobs)
    insns, source = [], []
    params = isa.LOAD(mem="accumulator", sram=arch.accumulator.rows - 2, dram=0, y_size=2,
                      x_size=1, elem_bytes=4 * arch.lanes, x_stride=4 * arch.lanes,
                      y_stride=4 * arch.lanes)
    insns.append(params)
    source.append("params")
    for n, (name, (loads, computes, vector, store)) in enumerate(jobs):
        later = n < count - 2  # the last two buffers are never reused: no token back
        loads[0] = _flag(loads[0], pop_next=n >= 2)
        loads[-1] = _flag(loads[-1], push_next=True)
        computes[0] = _flag(computes[0], pop_prev=True, pop_next=n >= 2)
        computes[-1] = _flag(computes[-1], push_next=True, push_prev=later)
        vector[0] = _flag(vector[0], pop_prev=True, pop_next=n >= 2, push_next=True,
                          push_prev=later)
        store[0] = _flag(store[0], pop_prev=True, push_prev=later)
        for part in (loads, computes, vector, store):
            insns += part
            source += [name] * len(part)
    insns.append(isa.END())
    source.append("")
    return Program(arch=arch, instructions=insns, source=source,
                   metadata={"benchmark": "synthetic resnet18"})
