"""The host CPU as a unit: HOST runs one host segment (a subgraph the accelerator does not run:
nodes kept in fp32, operators it lacks) through the runner given to `machine.run`.

A segment's inputs and outputs live in DRAM at their bindings. HOST reads every input binding,
calls the runner, checks each returned array against its output binding (shape and dtype, exact)
and writes it back. It touches no local memory. Timing: the DMA latency once, the segment's
read_bytes + write_bytes over the shared DRAM port at the DMA's bandwidth, then the host's compute
time, which the compiler priced in accelerator cycles (`Arch.host_cycles`) and put in the word.
"""

from __future__ import annotations

import numpy as np

from simulator.errors import SimulatorError
from simulator.units import Work, ceil_div


def run(state, insn) -> None:
    """One runner call per sample (a segment is compiled for one sample's shapes)."""
    segment, inputs, outputs = state.host_segments[insn.args["segment"]]
    name = segment["name"]
    if state.host is None:
        raise SimulatorError(f"host segment {name!r}: no host runner was given")
    values = {b.name: state.read(b) for b in inputs}
    for sample in range(state.batch):
        results = state.host(segment, {key: v[sample] for key, v in values.items()})
        if not isinstance(results, dict):
            raise SimulatorError(f"host segment {name!r}: the runner returned "
                                 f"{type(results).__name__}, expected a dict of output arrays")
        for b in outputs:
            if b.name not in results:
                raise SimulatorError(f"host segment {name!r}: the runner returned no output "
                                     f"{b.name!r} (it returned {sorted(results)})")
            value = np.asarray(results[b.name])
            if value.shape != b.shape or value.dtype != np.dtype(b.dtype):
                raise SimulatorError(f"host segment {name!r}: output {b.name!r}: expected "
                                     f"{b.dtype} of shape {b.shape}, the runner returned "
                                     f"{value.dtype} of shape {value.shape}")
        for b in outputs:
            state.write(b, results[b.name], sample)


def transfer_cycles(arch, insn) -> int:
    """Cycles the segment's inputs and outputs occupy the DRAM port."""
    a = insn.args
    return ceil_div(a["read_bytes"] + a["write_bytes"], arch.dma.bytes_per_cycle)


def roof_cycles(arch, insn) -> int:
    """The cycles no schedule hides: HOSTs run one at a time on the store queue, each moving its
    bytes and then computing (the DMA latency overlaps other work)."""
    return transfer_cycles(arch, insn) + insn.args["compute_cycles"]


def cycles(arch, insn) -> int:
    """latency + transfer + compute: the host reads its inputs, computes, writes its outputs."""
    return arch.dma.latency_cycles + transfer_cycles(arch, insn) + insn.args["compute_cycles"]


def work(arch, insn) -> Work:
    return Work(dram_read=insn.args["read_bytes"], dram_written=insn.args["write_bytes"])
