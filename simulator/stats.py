"""What a run measured: per-instruction times (Timeline) and their totals (Stats), and the JSON
performance report built from them.

The totals are explainable from the architecture: `bound_cycles` is the roofline
max(MACs / (rows * cols), DRAM bytes / bytes_per_cycle), which the machine can never beat (the
array does at most rows * cols MACs per cycle and the DRAM port moves at most bytes_per_cycle).
The DRAM term uses the compulsory bytes (DRAM image + inputs + outputs), capped by the bytes
actually moved. Per layer (grouped by the program's source node names), `cycles` is the layer's
span on the timeline (first start to last end over its instructions; pipelined layers overlap),
and its bound uses the layer's own DRAM traffic. Peak local-memory occupancy is the high-water mark
of rows written, in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator import isa

UNITS = {"load": "load", "compute": "array", "vector": "vector", "store": "store"}
REPORT_VERSION = 1


@dataclass(frozen=True)
class Timeline:
    """start[i], end[i] (cycles) and queue[i] of every instruction but END; stall cycles by
    "queue.cause"."""

    start: np.ndarray
    end: np.ndarray
    queue: np.ndarray
    stall: dict


@dataclass(frozen=True)
class Layer:
    name: str
    start: int
    end: int
    macs: int
    dram_bytes: int
    bound_cycles: int
    bound_by: str

    @property
    def cycles(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Stats:
    arch_name: str
    clock_mhz: float
    cycles: int
    instructions: int
    macs: int
    bound_cycles: int
    busy: dict
    stall: dict
    dram_bytes_read: int
    dram_bytes_written: int
    peak_bytes: dict
    energy_uj: float
    layers: tuple[Layer, ...]
    macs_per_cycle: int

    @classmethod
    def collect(cls, program, timeline: Timeline) -> "Stats":
        arch = program.arch
        insns = program.instructions[:-1]
        macs, read, written, local, sp_end, acc_end = work_columns(arch, insns)
        duration = timeline.end - timeline.start
        total = int(timeline.end.max()) if len(insns) else 0
        busy = {unit: int(duration[timeline.queue == q].sum())
                for q, unit in enumerate(UNITS.values())}
        busy["dram"] = sum(insn.op.cycles(arch, insn) - arch.dma.latency_cycles
                           for insn in insns if insn.op is isa.LOAD or insn.op is isa.STORE)
        compulsory = len(program.dram_image) + sum(b.size_bytes for b in program.inputs) \
            + sum(b.size_bytes for b in program.outputs)
        traffic = int(read.sum() + written.sum())
        energy_pj = (macs.sum() * arch.energy.mac_pj + local.sum() * arch.energy.local_byte_pj
                     + traffic * arch.energy.dram_byte_pj)
        return cls(
            arch_name=arch.name, clock_mhz=arch.clock_mhz, cycles=total,
            instructions=len(program.instructions), macs=int(macs.sum()),
            bound_cycles=_bound(arch, int(macs.sum()), min(compulsory, traffic))[0],
            busy=busy, stall=dict(timeline.stall),
            dram_bytes_read=int(read.sum()), dram_bytes_written=int(written.sum()),
            peak_bytes={"scratchpad": int(sp_end.max(initial=0)) * arch.scratchpad.row_bytes,
                        "accumulator": int(acc_end.max(initial=0)) * arch.accumulator.row_bytes},
            energy_uj=float(energy_pj) / 1e6,
            layers=_layers(program, timeline, macs, read + written),
            macs_per_cycle=arch.macs_per_cycle)

    @property
    def utilization(self) -> dict:
        return {unit: (b / self.cycles if self.cycles else 0.0) for unit, b in self.busy.items()}

    def to_report(self) -> dict:
        """The JSON performance report; its keys are stable (see REPORT_VERSION)."""
        return {
            "report_version": REPORT_VERSION,
            "arch": self.arch_name,
            "clock_mhz": self.clock_mhz,
            "cycles": self.cycles,
            "time_ms": self.cycles / (self.clock_mhz * 1000.0),
            "bound_cycles": self.bound_cycles,
            "instructions": self.instructions,
            "macs": self.macs,
            "mac_utilization": (self.macs / (self.macs_per_cycle * self.cycles)
                                if self.cycles else 0.0),
            "utilization": self.utilization,
            "busy_cycles": self.busy,
            "stall_cycles": self.stall,
            "dram_bytes_read": self.dram_bytes_read,
            "dram_bytes_written": self.dram_bytes_written,
            "peak_local_bytes": self.peak_bytes,
            "energy_uj": self.energy_uj,
            "layers": [{"name": layer.name, "cycles": layer.cycles, "start_cycle": layer.start,
                        "macs": layer.macs, "dram_bytes": layer.dram_bytes,
                        "bound_cycles": layer.bound_cycles, "bound_by": layer.bound_by}
                       for layer in self.layers],
        }


def work_columns(arch, insns) -> list[np.ndarray]:
    """The six `Work` fields of every instruction, as int64 columns."""
    if not insns:
        return [np.zeros(0, np.int64)] * 6
    cache: dict[int, tuple] = {}  # loaded programs share equal instructions
    rows = [cache.get(id(insn)) or cache.setdefault(id(insn), insn.op.work(arch, insn))
            for insn in insns]
    return [np.array(column, np.int64) for column in zip(*rows)]


def _bound(arch, macs: int, dram_bytes: int) -> tuple[int, str]:
    array = -(-macs // arch.macs_per_cycle)
    dram = -(-dram_bytes // arch.dma.bytes_per_cycle)
    return (array, "array") if array >= dram else (dram, "dram")


def _layers(program, timeline: Timeline, macs, dram) -> tuple[Layer, ...]:
    names = program.source[:-1]
    order = list(dict.fromkeys(n for n in names if n))
    index = {name: k for k, name in enumerate(order)}
    ids = np.array([index.get(n, -1) for n in names], np.int64)
    layers = []
    for k, name in enumerate(order):
        mask = ids == k
        layer_macs, layer_dram = int(macs[mask].sum()), int(dram[mask].sum())
        bound, by = _bound(program.arch, layer_macs, layer_dram)
        layers.append(Layer(name, int(timeline.start[mask].min()), int(timeline.end[mask].max()),
                            layer_macs, layer_dram, bound, by))
    return tuple(layers)
