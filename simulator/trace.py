"""Chrome trace-event JSON of a run, which Perfetto and chrome://tracing open.

One thread (tid) per unit, named by `thread_name` metadata events (a "host" thread for the HOST
instructions of a program with host segments). On each, a slice per run of
consecutive instructions of the same layer (source node), and at level "instruction" a slice per
instruction nested inside it. Times are microseconds from the arch clock, rounded to the
nanosecond so that nesting survives float rounding; the cycle counts are kept in `args`.
Counters: the high-water mark of each local memory (bytes) and, at level "instruction", the
DRAM bytes in flight.
"""

from __future__ import annotations

import numpy as np

from simulator import isa
from simulator.stats import UNITS, Timeline, unit_ids, work_columns
from simulator.units import Work

LEVELS = ("layer", "instruction")
_PID = 1


def chrome_trace(program, timeline: Timeline, level: str = "layer") -> dict:
    if level not in LEVELS:
        raise ValueError(f"trace level {level!r}: expected one of {', '.join(LEVELS)}")
    arch = program.arch
    us = arch.cycle_us
    insns = program.instructions[:-1]

    def at(cycle) -> float:
        return round(int(cycle) * us, 3)

    events = [{"ph": "M", "name": "process_name", "pid": _PID, "tid": 0,
               "args": {"name": f"ember {arch.name} @ {arch.clock_mhz} MHz"}}]
    tracks = (*UNITS.values(), "host") if program.host_segments else tuple(UNITS.values())
    units = unit_ids(program, timeline)
    for q, unit in enumerate(tracks):
        events.append({"ph": "M", "name": "thread_name", "pid": _PID, "tid": q + 1,
                       "args": {"name": unit}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": _PID, "tid": q + 1,
                       "args": {"sort_index": q}})
    for q in range(len(tracks)):
        members = np.flatnonzero(units == q)
        for run in _runs(members, program.source):
            first, last = run[0], run[-1]
            s, e = timeline.start[first], timeline.end[last]
            events.append({"ph": "X", "cat": "layer", "name": program.source[first] or "(none)",
                           "pid": _PID, "tid": q + 1, "ts": at(s), "dur": round(at(e) - at(s), 3),
                           "args": {"cycles": int(e - s), "start_cycle": int(s),
                                    "instructions": len(run)}})
            if level == "instruction":
                for i in run:
                    s, e = timeline.start[i], timeline.end[i]
                    events.append({"ph": "X", "cat": "instruction",
                                   "name": insns[i].op.mnemonic, "pid": _PID, "tid": q + 1,
                                   "ts": at(s), "dur": round(at(e) - at(s), 3),
                                   "args": {"index": int(i), "cycles": int(e - s),
                                            "start_cycle": int(s),
                                            "asm": isa.disassemble(insns[i])}})
    events += _counters(program, timeline, at, level)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"arch": arch.name, "clock_mhz": arch.clock_mhz,
                          "cycles": int(timeline.end.max()) if len(insns) else 0}}


def _runs(members: np.ndarray, source) -> list[list[int]]:
    """Split a queue's instructions into runs of consecutive ones with the same source node."""
    runs: list[list[int]] = []
    for i in members.tolist():
        if runs and source[runs[-1][-1]] == source[i]:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _counters(program, timeline: Timeline, at, level: str) -> list[dict]:
    arch = program.arch
    insns = program.instructions[:-1]
    if not insns:
        return []
    work = np.stack(work_columns(arch, insns), axis=1)
    order = np.argsort(timeline.start, kind="stable")
    events = []
    # Each local memory's high-water mark: its `Work.<memory>_end` column, in rows, times its
    # row size.
    ends = {name: Work._fields.index(f"{name}_end") for name in isa.MEMORIES}
    rows = {name: memory.row_bytes for name, memory in zip(isa.MEMORIES, arch.memories)}
    marks = dict.fromkeys(isa.MEMORIES, 0)
    for i in order.tolist():
        for name, column in ends.items():
            high = int(work[i, column]) * rows[name]
            if high > marks[name]:
                marks[name] = high
                events.append({"ph": "C", "name": "local memory high-water mark (bytes)",
                               "pid": _PID, "ts": at(timeline.start[i]), "args": dict(marks)})
    if level == "instruction":
        changes = []
        for i in range(len(insns)):
            moved = int(work[i, 1] + work[i, 2])
            if moved:
                changes += [(int(timeline.start[i]), moved), (int(timeline.end[i]), -moved)]
        in_flight = 0
        for cycle, delta in sorted(changes):
            in_flight += delta
            events.append({"ph": "C", "name": "DRAM bytes in flight", "pid": _PID,
                           "ts": at(cycle), "args": {"bytes": in_flight}})
    return events
