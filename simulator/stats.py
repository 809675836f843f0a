"""What a run measured: per-instruction times (Timeline) and their totals (Stats), and the JSON
performance report built from them.

The totals are explainable from the architecture: `bound_cycles` is the program's roofline
(`Program.bound`, the one the compiler's summary prints too), which the machine can never beat:
the array does at most rows * cols MACs per cycle, the DRAM port moves at most bytes_per_cycle
(of the compulsory bytes: DRAM image + inputs + outputs, capped by the bytes actually moved),
and HOSTs run one at a time. Its MACs are the model's when the program records them
(`Program.model_macs`); `macs` counts those issued to the array, zero blocks of block-diagonal
grouped convolutions included. Per layer (grouped by the program's source node names), `cycles`
is the layer's span on the timeline (first start to last end over its instructions; pipelined
layers overlap), and its bound uses the layer's own DRAM traffic and, as a third roof, its
vector-unit cycles (elements / lanes: the vector unit's own peak). Per layer and unit,
`busy_cycles` and `unit_spans` ([first start, last end]) say where the layer's time went. Peak
local-memory occupancy is the high-water mark of rows written, in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator import isa
from simulator.units import host as host_unit

UNITS = {"load": "load", "compute": "array", "vector": "vector", "store": "store"}
# HOST instructions sit on the store queue but run on the host CPU: their time counts there.
HOST_UNIT = len(UNITS)
REPORT_VERSION = 1


@dataclass(frozen=True)
class Timeline:
    """start[i], end[i] (cycles) and queue[i] of every instruction but END; stall cycles by
    "queue.cause"."""

    start: np.ndarray
    end: np.ndarray
    queue: np.ndarray
    stall: dict

    @property
    def cycles(self) -> int:
        """The run's length: the last instruction's end."""
        return int(self.end.max()) if len(self.end) else 0


@dataclass(frozen=True)
class Layer:
    name: str
    start: int
    end: int
    macs: int
    dram_bytes: int
    bound_cycles: int
    bound_by: str
    busy: dict  # unit -> busy cycles of this layer's instructions
    spans: dict  # unit -> (first start, last end) of this layer's instructions on it
    unit: str = "accelerator"  # "host" when the layer ran on the host CPU (a HOST instruction)

    @property
    def cycles(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Stats:
    arch_name: str
    clock_mhz: float
    cycles: int
    instructions: int
    macs: int  # issued to the array, zero blocks of grouped convolutions included
    model_macs: int  # the model's, which the roofline counts (`Program.roofline_macs`)
    bound_cycles: int
    busy: dict
    stall: dict
    dram_bytes_read: int
    dram_bytes_written: int
    peak_bytes: dict
    energy_uj: float
    layers: tuple[Layer, ...]
    macs_per_cycle: int
    dram_bytes_per_cycle: int
    compulsory_dram_bytes: int
    host_segments: tuple[dict, ...] = ()  # per host segment: where its HOST time went

    @classmethod
    def collect(cls, program, timeline: Timeline) -> "Stats":
        arch = program.arch
        insns = program.instructions[:-1]
        macs, read, written, local, sp_end, acc_end = work_columns(arch, insns)
        duration = timeline.end - timeline.start
        units = unit_ids(program, timeline)
        busy = {unit: int(duration[units == q].sum())
                for q, unit in enumerate((*UNITS.values(), "host"))}
        busy["dram"] = sum(insn.op.transfer(arch, insn) for insn in insns
                           if insn.op.transfer is not None)
        traffic = int(read.sum() + written.sum())
        energy_pj = (macs.sum() * arch.energy.mac_pj + local.sum() * arch.energy.local_byte_pj
                     + traffic * arch.energy.dram_byte_pj)
        return cls(
            arch_name=arch.name, clock_mhz=arch.clock_mhz, cycles=timeline.cycles,
            instructions=len(program.instructions), macs=int(macs.sum()),
            model_macs=program.roofline_macs(int(macs.sum())),
            bound_cycles=program.bound(int(macs.sum()), traffic)[0],
            busy=busy, stall=dict(timeline.stall),
            dram_bytes_read=int(read.sum()), dram_bytes_written=int(written.sum()),
            peak_bytes={"scratchpad": int(sp_end.max(initial=0)) * arch.scratchpad.row_bytes,
                        "accumulator": int(acc_end.max(initial=0)) * arch.accumulator.row_bytes},
            energy_uj=float(energy_pj) / 1e6,
            layers=_layers(program, timeline, macs, read + written, units),
            macs_per_cycle=arch.macs_per_cycle, dram_bytes_per_cycle=arch.dma.bytes_per_cycle,
            compulsory_dram_bytes=program.compulsory_dram_bytes,
            host_segments=_host_segments(program, timeline, units))

    @property
    def host_cycles(self) -> int:
        """Cycles HOST instructions were busy (the host CPU and its transfers)."""
        return self.busy.get("host", 0)

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
            "model_macs": self.model_macs,
            "peak_macs_per_cycle": self.macs_per_cycle,
            "dram_bytes_per_cycle": self.dram_bytes_per_cycle,
            "mac_utilization": (self.macs / (self.macs_per_cycle * self.cycles)
                                if self.cycles else 0.0),
            "utilization": self.utilization,
            "busy_cycles": self.busy,
            "stall_cycles": self.stall,
            "dram_bytes_read": self.dram_bytes_read,
            "dram_bytes_written": self.dram_bytes_written,
            "compulsory_dram_bytes": self.compulsory_dram_bytes,
            "peak_local_bytes": self.peak_bytes,
            "energy_uj": self.energy_uj,
            "host_cycles": self.host_cycles,
            "host_segments": [dict(segment) for segment in self.host_segments],
            "layers": [{"name": layer.name, "cycles": layer.cycles, "start_cycle": layer.start,
                        "macs": layer.macs, "dram_bytes": layer.dram_bytes,
                        "bound_cycles": layer.bound_cycles, "bound_by": layer.bound_by,
                        "busy_cycles": layer.busy, "unit": layer.unit,
                        "unit_spans": {u: list(span) for u, span in layer.spans.items()}}
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


def unit_ids(program, timeline: Timeline) -> np.ndarray:
    """Per instruction, the index of the unit it ran on in (*UNITS.values(), "host"): its
    queue's, or HOST_UNIT for HOST."""
    if not program.host_segments:  # no HOST without segments (`Program` checks)
        return timeline.queue
    is_host = np.array([insn.op is isa.HOST for insn in program.instructions[:-1]], bool)
    return np.where(is_host, HOST_UNIT, timeline.queue).astype(timeline.queue.dtype)


def _host_segments(program, timeline: Timeline, units) -> tuple[dict, ...]:
    """Per host segment: its name and nodes, and the busy cycles, DRAM bytes and compute cycles
    of the HOST instructions that ran it."""
    if not program.host_segments:
        return ()
    out = [{"name": segment["name"], "nodes": list(segment["nodes"]), "cycles": 0,
            "read_bytes": 0, "write_bytes": 0, "compute_cycles": 0}
           for segment in program.host_segments]
    insns = program.instructions
    for i in np.flatnonzero(units == HOST_UNIT).tolist():
        a = insns[i].args
        record = out[a["segment"]]
        record["cycles"] += int(timeline.end[i] - timeline.start[i])
        record["read_bytes"] += a["read_bytes"]
        record["write_bytes"] += a["write_bytes"]
        record["compute_cycles"] += a["compute_cycles"]
    return tuple(out)


def _layers(program, timeline: Timeline, macs, dram, units) -> tuple[Layer, ...]:
    names = program.source[:-1]
    order = list(dict.fromkeys(n for n in names if n))
    index = {name: k for k, name in enumerate(order)}
    ids = np.array([index.get(n, -1) for n in names], np.int64)
    duration = timeline.end - timeline.start
    layers = []
    for k, name in enumerate(order):
        mask = ids == k
        layer_macs, layer_dram = int(macs[mask].sum()), int(dram[mask].sum())
        busy, spans = {}, {}
        for q, unit in enumerate((*UNITS.values(), "host")):
            on = mask & (units == q)
            busy[unit] = int(duration[on].sum())
            if on.any():
                spans[unit] = (int(timeline.start[on].min()), int(timeline.end[on].max()))
        hosts = [program.instructions[i] for i in np.flatnonzero(mask & (units == HOST_UNIT))]
        bound, by = program.arch.roofline(
            layer_macs, layer_dram, busy["vector"],
            sum(host_unit.roof_cycles(program.arch, insn) for insn in hosts))
        layers.append(Layer(name, int(timeline.start[mask].min()), int(timeline.end[mask].max()),
                            layer_macs, layer_dram, bound, by, busy, spans,
                            "host" if hosts else "accelerator"))
    return tuple(layers)
