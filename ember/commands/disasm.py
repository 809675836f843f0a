"""`ember disasm`: print a program's header and one line per instruction."""

from __future__ import annotations

from collections import Counter

import click

from ember.files import InputPath
from simulator import isa
from simulator.program import FORMAT_VERSION, Program


@click.command()
@click.argument("program", type=InputPath(dir_okay=False))
def disasm(program: str) -> None:
    """Print PROGRAM (an .ember file): its header, then each instruction with its index and
    the source graph node it implements.

    \b
    Each instruction line reads back with the assembler (`simulator.isa.assemble`):
      <index>  MNEMONIC field=value ... [pop_prev pop_next push_prev push_next]  ; <node>

    \b
    Example:
      ember disasm model.ember | less
    """
    prog = Program.load(program)
    arch = prog.arch
    body = prog.instructions
    per_queue = Counter(insn.queue for insn in body)
    lines = [
        f"; {program}: ember program format {FORMAT_VERSION}, {len(body)} instructions "
        f"({', '.join(f'{q} {per_queue[q]}' for q in isa.QUEUES)}), "
        f"DRAM image {len(prog.dram_image)} bytes",
        f"; target {arch.name}: {arch.array.rows}x{arch.array.cols} {arch.array.dataflow} "
        f"array at {arch.clock_mhz} MHz, scratchpad {arch.scratchpad.size_bytes} B, "
        f"accumulator {arch.accumulator.size_bytes} B, DMA {arch.dma.bytes_per_cycle} B/cycle",
    ]
    for kind, bindings in (("input", prog.inputs), ("output", prog.outputs)):
        for b in bindings:
            lines.append(f"; {kind} {b.name}: {b.dtype}{list(b.shape)} at DRAM {b.dram:#x}, "
                         f"scale {b.scale:g}, zero point {b.zero_point}")
    for key, value in sorted(prog.metadata.items()):
        lines.append(f"; {key}: {value}")
    width = len(str(len(body)))
    for i, insn in enumerate(body):
        node = f"  ; {prog.source[i]}" if prog.source[i] else ""
        lines.append(f"{i:>{width}}  {isa.disassemble(insn)}{node}")
    click.echo("\n".join(lines))
