"""Scheduling: program order and dependency tokens, derived from the hazards on buffers.

Codegen hands over each layer as a list of `Step`s (the loads of one tile, then the work on it).
With double buffering, the loads of step t + 1 are placed before the work of step t, so the load
queue fetches the next tile while the array computes this one (the buffers alternate, so they
do not collide); without it, steps run one after another in one buffer. A layer's first loads
read what the previous layer stored, so layers never interleave.

Tokens are then derived, not written by hand. Walking the program in order, every instruction's
local-memory accesses (`InsnDef.access`, the function the machine's race check uses) and every
activation DRAM access are compared with the last writer and readers of the same rows or bytes
on the other queues: read-after-write, write-after-read and write-after-write each require the
earlier instruction to finish first. A vector clock per queue (as in `simulator.hazards`) says
which requirements already hold through earlier tokens and in-order queues; each one that does
not gets one token, from the producer itself when the queues are neighbours, or relayed by a SYNC
on each queue in between (load -> compute -> vector -> store). An instruction pops at most one
token per side: requirements on one side are satisfied farthest first, and the relay SYNC
(placed just before the instruction) then covers the nearer ones by queue order. Because every
dependency points backwards in program order, and no token FIFO ever holds more than
`arch.queues.token_depth` tokens when the program runs in program order, program order is always
a valid execution: no deadlock, and every pushed token is popped.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from compiler.errors import CompileError
from simulator import isa
from simulator.arch import Arch

NQ = len(isa.QUEUES)
_MEMORIES = ("scratchpad", "accumulator")


@dataclass(frozen=True, eq=False)
class Op:
    """One instruction before tokens: its row, its fields, the node it implements, and the
    activation DRAM it reads or writes, one access per tensor: (start, stop, write) bytes once
    relocated, (tensor, write) from codegen before that; empty for constants or nothing."""

    row: isa.InsnDef
    args: dict
    source: str
    dram: tuple[tuple, ...] = ()

    @cached_property
    def insn(self) -> isa.Insn:
        """The instruction without dependency flags, built (and checked) once."""
        return self.row(**self.args)


@dataclass(frozen=True)
class Step:
    """The unit of overlap: the loads of one tile, then the work that consumes them."""

    loads: tuple[Op, ...]
    body: tuple[Op, ...]


@dataclass(frozen=True)
class Scheduled:
    instructions: tuple[isa.Insn, ...]
    source: tuple[str, ...]
    syncs: int  # relay instructions the scheduler added


def order(layers: list[list[Step]], double_buffer: bool) -> list[Op]:
    """Program order: with double buffering, each step's loads one step ahead of its work."""
    ops: list[Op] = []
    for steps in layers:
        if not double_buffer:
            for step in steps:
                ops += step.loads + step.body
            continue
        if steps:
            ops += steps[0].loads
        for t, step in enumerate(steps):
            if t + 1 < len(steps):
                ops += steps[t + 1].loads
            ops += step.body
    return ops


@dataclass
class _Entry:
    row: isa.InsnDef
    args: dict
    source: str
    queue: int
    flags: set = field(default_factory=set)
    clock: tuple[int, ...] = ()
    insn: isa.Insn | None = None  # built without flags; reused when no flag is added


class _Tokens:
    """Builds the program, adding push/pop flags and relay SYNCs as hazards require."""

    def __init__(self, arch: Arch):
        self.arch = arch
        self.entries: list[_Entry] = []
        self.latest = [-1] * NQ  # program index of each queue's latest instruction
        # Per local memory row: last writer per queue, then last reader per queue.
        self.local = [np.full((arch.scratchpad.rows, 2 * NQ), -1, np.int64),
                      np.full((arch.accumulator.rows, 2 * NQ), -1, np.int64)]
        self.dram: dict[tuple[int, int], np.ndarray] = {}  # byte interval → (2 * NQ) table
        self._overlaps: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.syncs = 0
        self.pops: dict[tuple[int, int], list[int]] = {}  # (from, to) queue → popper indices

    def queue_clock(self, q: int) -> list[int]:
        j = self.latest[q]
        return list(self.entries[j].clock) if j >= 0 else [-1] * NQ

    # -- hazards --

    def _dram_tables(self, interval: tuple[int, int]) -> list[np.ndarray]:
        """The tables of every recorded DRAM interval overlapping `interval` (reused buffers
        overlap), creating its own on first sight."""
        if interval not in self.dram:
            self.dram[interval] = np.full(2 * NQ, -1, np.int64)
            lo, hi = interval
            self._overlaps[interval] = [k for k in self.dram if k[0] < hi and lo < k[1]]
            for k in self._overlaps[interval]:
                if k != interval:
                    self._overlaps[k].append(interval)
        return [self.dram[k] for k in self._overlaps[interval]]

    def needs(self, op: Op, q: int, accesses) -> dict[int, int]:
        """Other queue → the latest of its instructions this op must wait for."""
        need = [-1] * NQ
        for mem, start, stop, write in accesses:
            table = self.local[mem]
            stop = min(stop, table.shape[0])
            if start >= stop:
                continue
            last = table[start:stop].max(axis=0)
            for p in range(NQ):
                need[p] = max(need[p], int(last[p]))
                if write:
                    need[p] = max(need[p], int(last[NQ + p]))
        for start, stop, write in op.dram:
            for table in self._dram_tables((start, stop)):
                for p in range(NQ):
                    need[p] = max(need[p], int(table[p]))
                    if write:
                        need[p] = max(need[p], int(table[NQ + p]))
        return {p: j for p, j in enumerate(need) if p != q and j >= 0}

    def record(self, op: Op, q: int, index: int, accesses) -> None:
        for mem, start, stop, write in accesses:
            self.local[mem][start:stop, q if write else NQ + q] = index
        for start, stop, write in op.dram:
            self.dram[(start, stop)][q if write else NQ + q] = index

    # -- tokens --

    def _token(self, pusher: int, entry: _Entry, clock: list[int]) -> None:
        """A token from `pusher` (or a later instruction of its queue) to `entry`, between
        neighbouring queues; merge the pusher's clock.

        The FIFO holds `arch.queues.token_depth` tokens. Executed in program order, the new
        token is outstanding from its push to `entry`; earlier tokens on the channel were all
        pushed before it, so the FIFO is fullest right at the push. If the tokens still
        unpopped there would overflow it, a later instruction of the same queue pushes
        instead (the latest, or a SYNC placed just before `entry`): the program order then
        never overflows a FIFO, so the machine can always follow it and never deadlocks."""
        p = self.entries[pusher].queue
        channel = (p, entry.queue)
        pops = self.pops.setdefault(channel, [])
        depth = self.arch.queues.token_depth
        for candidate in (pusher, self.latest[p]):
            if len(pops) - bisect.bisect_right(pops, candidate) < depth:
                pusher = candidate
                break
        else:
            sync = _Entry(isa.SYNC, {"queue": isa.QUEUES[p]}, entry.source, p)
            pusher = self.append(sync, self.queue_clock(p))
            self.syncs += 1
        src = self.entries[pusher]
        toward_next = entry.queue > src.queue
        push = "push_next" if toward_next else "push_prev"
        pop = "pop_prev" if toward_next else "pop_next"
        if push in src.flags or pop in entry.flags:
            raise AssertionError(f"scheduler: token slot taken between instruction {pusher} and "
                                 f"a {isa.QUEUES[entry.queue]} instruction")
        src.flags.add(push)
        entry.flags.add(pop)
        clock[:] = map(max, clock, src.clock)

    def make_after(self, entry: _Entry, clock: list[int], p: int, j: int) -> None:
        """Ensure `entry` (not yet appended) starts after instruction j of queue p."""
        q = entry.queue
        if clock[p] >= j:
            return
        r = q - 1 if p < q else q + 1
        if r == p:
            self._token(j, entry, clock)
            return
        y = self.latest[r]
        if y < 0 or self.entries[y].clock[p] < j:
            sync = _Entry(isa.SYNC, {"queue": isa.QUEUES[r]}, entry.source, r)
            sync_clock = self.queue_clock(r)
            self.make_after(sync, sync_clock, p, j)
            y = self.append(sync, sync_clock)
            self.syncs += 1
        self._token(y, entry, clock)

    def append(self, entry: _Entry, clock: list[int]) -> int:
        index = len(self.entries)
        clock[entry.queue] = index
        entry.clock = tuple(clock)
        self.entries.append(entry)
        self.latest[entry.queue] = index
        for flag, side in (("pop_prev", -1), ("pop_next", 1)):
            if flag in entry.flags:
                self.pops.setdefault((entry.queue + side, entry.queue), []).append(index)
        return index

    def add(self, op: Op) -> None:
        q = isa.QUEUES.index(op.row.queue)
        entry = _Entry(op.row, op.args, op.source, q, insn=op.insn)
        clock = self.queue_clock(q)
        accesses = op.row.access(self.arch, op.insn)
        need = self.needs(op, q, accesses)
        # Farthest first on each side, so a relay SYNC also covers the nearer queues.
        for p in sorted(need, key=lambda p: -abs(p - q)):
            self.make_after(entry, clock, p, need[p])
        index = self.append(entry, clock)
        self.record(op, q, index, accesses)


def schedule(layers: list[list[Step]], arch: Arch, double_buffer: bool = True) -> Scheduled:
    """The instruction stream with its tokens, ending in END."""
    tokens = _Tokens(arch)
    for op in order(layers, double_buffer):
        if op.row.queue not in isa.QUEUES:
            raise CompileError(f"internal: {op.row.mnemonic} has no fixed queue")
        tokens.add(op)
    insns = [e.insn if e.insn is not None and not e.flags
             else e.row(**e.args, **{flag: True for flag in e.flags}) for e in tokens.entries]
    source = [e.source for e in tokens.entries]
    return Scheduled(tuple(insns) + (isa.END(),), tuple(source) + ("",), tokens.syncs)
