"""Scheduling: program order and dependency tokens, derived from the hazards on buffers.

Codegen hands over each layer as a list of `Step`s (the loads of one tile, then the work on it).
With double buffering, the loads of the next step that loads are placed before the work of step t,
so the load queue fetches the next tile while the array computes this one (the buffers alternate, so
they do not collide); without it, steps run one after another in one buffer. A layer's first loads
of activations follow the previous layer's work in program order, but wait only for the stores of
the DRAM blocks they read (a DMA's access is the elements it touches,
`compiler.backend.codegen.emit.relocate`), so a layer may start on rows its predecessor has already
stored; its first loads of constants may come before the previous layer's last work (`order`).

Tokens are then derived, not written by hand. Walking the program in order, every instruction's
local-memory accesses (`InsnDef.access`, the function the machine's race check uses) and every
activation DRAM access are compared with the last writer and readers of the same rows or bytes
on the other queues: read-after-write, write-after-read and write-after-write each require the
earlier instruction to finish first. A vector clock per queue (as in `simulator.hazards`) says
which requirements already hold through earlier tokens and in-order queues; each one that does
not gets one token, from the producer itself when the queues are neighbours, or relayed by a SYNC
on each queue in between (load -> compute -> vector -> store). An instruction pops at most one
token per side: when it needs queues beyond its neighbour, the token comes from the neighbour's
latest instruction if that one already follows all of them, else from a relay SYNC placed there
just before the instruction and made to follow them all (`_Tokens.make_after`). Because every
dependency points backwards in program order, and no token FIFO ever holds more than
`arch.queues.token_depth` tokens when the program runs in program order, program order is always
a valid execution: no deadlock, and every pushed token is popped.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from compiler.backend.progress import Progress, quiet
from compiler.backend.steps import Op, Step
from compiler.errors import CompileError
from simulator import isa
from simulator.arch import Arch

NQ = len(isa.QUEUES)
_DRAM_BLOCK_BYTES = 16  # the DRAM hazard table's granularity (activations are 64-B aligned)
_DRAM_MAX_BLOCKS = 1 << 22
_PROGRESS_EVERY = 1024  # instructions between progress reports: a report costs a lock


@dataclass(frozen=True)
class Scheduled:
    instructions: tuple[isa.Insn, ...]
    source: tuple[str, ...]
    syncs: int  # relay instructions the scheduler added


def order(layers: list[list[Step]], double_buffer: bool, arch: Arch | None = None) -> list[Op]:
    """Program order: with double buffering, the loads of the next step that loads anything
    come before the work of this step. Steps without loads (the K slices of a resident
    block's tile, the output-channel blocks of a pixel tile) do not shorten the lookahead: a
    block's weights stream in while the whole previous block computes. Given `arch`, the
    next layer's first loads of constants (parameters, weights: no activation DRAM) come
    before this layer's last work when they touch none of its local rows, so they overlap it
    too (the program still means the same)."""
    ops: list[Op] = []
    hoisted: set[int] = set()  # ids of the loads placed with the previous layer
    for i, steps in enumerate(layers):
        if not double_buffer:
            for step in steps:
                ops += step.loads + step.body
            continue
        loading = [t for t, step in enumerate(steps) if step.loads]
        k = 0  # loading[k]: the first step whose loads are not placed yet
        for t, step in enumerate(steps):
            # place the loads of every step up to the first one after t that loads
            while k < len(loading) and (loading[k] <= t or k == 0 or loading[k - 1] <= t):
                ops += [op for op in steps[loading[k]].loads if id(op) not in hoisted]
                k += 1
            if t == len(steps) - 1 and arch is not None:
                ops += _first_constant_loads(layers[i + 1:], step.body, arch, hoisted)
            ops += step.body
    return ops


def _dram_blocks(start: int, stop: int, pattern, base: int, g: int):
    """The blocks of g bytes from `base` holding bytes [start, stop), or only those of the
    strided elements of `pattern` (y_size, x_size, elem_bytes, x_stride, y_stride) from start."""
    whole = slice((start - base) // g, (stop - 1 - base) // g + 1)
    if not pattern:
        return whole
    (y, x, eb, xs, ys), = pattern
    if (xs == eb or x == 1) and (ys == x * eb or y == 1) or max(xs, ys) <= g:
        return whole  # contiguous, or gaps too small for a block
    first = (start - base + np.add.outer(np.arange(y) * ys, np.arange(x) * xs)).ravel()
    lo, hi = first // g, (first + eb - 1) // g
    width = int((hi - lo).max()) + 1
    blocks = (lo[:, None] + np.arange(width)).ravel()
    # Repeated blocks are harmless (a maximum over them, or the same index written to each
    # again): no sort to make them unique.
    return blocks[blocks <= (stop - 1 - base) // g]



def _first_constant_loads(layers: list[list[Step]], body: tuple[Op, ...], arch: Arch,
                          hoisted: set[int]) -> list[Op]:
    """The leading loads of the next layer's first loading step that touch no activation DRAM
    and none of the local rows `body` touches: moved before `body`, they change nothing but
    the timing. Their ids go to `hoisted` (the previous ones are forgotten)."""
    hoisted.clear()
    step = next((s for s in (layers[0] if layers else []) if s.loads), None)
    if step is None:
        return []
    busy = [a for op in body for a in op.row.access(arch, op.insn)]
    moved = []
    for op in step.loads:
        if op.dram or any(a.mem == b.mem and a.start < b.stop and b.start < a.stop
                          for a in op.row.access(arch, op.insn) for b in busy):
            break
        moved.append(op)
    hoisted.update(map(id, moved))
    return moved


@dataclass
class _Entry:
    row: isa.InsnDef
    args: dict
    source: str
    queue: int
    flags: set = field(default_factory=set)
    clock: tuple[int, ...] = ()
    insn: isa.Insn | None = None  # built without flags; reused when no flag is added


_QUEUE_INDEX = {name: i for i, name in enumerate(isa.QUEUES)}
_max_rows = np.maximum.reduce  # a table's column maxima over a slice of its rows


class _Tokens:
    """Builds the program, adding push/pop flags and relay SYNCs as hazards require."""

    def __init__(self, arch: Arch, dram_span: tuple[int, int] = (0, 0)):
        self.arch = arch
        self.entries: list[_Entry] = []
        self.latest = [-1] * NQ  # program index of each queue's latest instruction
        # Per local memory row: last writer per queue, then last access of any kind per queue
        # (what a read waits for, and what a write waits for: one reduction either way).
        self.local = [np.full((memory.rows, 2 * NQ), -1, np.int64) for memory in arch.memories]
        # Per DRAM block of `dram_block` bytes from dram_base: last writer per queue, then last
        # reader per queue (a block is conservative: accesses sharing one are ordered). Blocks
        # grow past _DRAM_BLOCK_BYTES only for a span too large for the table.
        self.dram_base = dram_span[0]
        self.dram_block = _DRAM_BLOCK_BYTES
        while (dram_span[1] - dram_span[0]) // self.dram_block > _DRAM_MAX_BLOCKS:
            self.dram_block *= 2
        blocks = -(-(dram_span[1] - dram_span[0]) // self.dram_block)
        self.dram = np.full((max(blocks, 1), 2 * NQ), -1, np.int64)
        self.syncs = 0
        self.pops: dict[tuple[int, int], list[int]] = {}  # (from, to) queue → popper indices
        self._accesses: dict[int, tuple] = {}  # id(Insn) → its local accesses
        self._strided: dict[tuple, np.ndarray] = {}  # a strided DRAM access → its blocks

    def queue_clock(self, q: int) -> list[int]:
        j = self.latest[q]
        return list(self.entries[j].clock) if j >= 0 else [-1] * NQ

    # -- hazards --

    def needs(self, op: Op, q: int, accesses) -> list[int]:
        """Per queue, the latest of its instructions this op must wait for (-1: none; its own
        queue's entry means nothing: a queue is in order)."""
        need = None
        for mem, start, stop, write in accesses:
            table = self.local[mem]
            if start >= min(stop, table.shape[0]):
                continue
            # a read waits for the rows' writers; a write for every access to them
            last = _max_rows(table[start:stop, NQ:] if write
                             else table[start:stop, :NQ]).tolist()
            need = last if need is None else list(map(max, need, last))
        for start, stop, write, *pattern in op.dram:
            if stop <= start:
                continue
            last = _max_rows(self.dram[self._blocks(start, stop, pattern)]).tolist()
            last = list(map(max, last[:NQ], last[NQ:])) if write else last[:NQ]
            need = last if need is None else list(map(max, need, last))
        return [-1] * NQ if need is None else need

    def record(self, op: Op, q: int, index: int, accesses) -> None:
        for mem, start, stop, write in accesses:
            table = self.local[mem]
            if write:
                table[start:stop, q] = index
            table[start:stop, NQ + q] = index
        for start, stop, write, *pattern in op.dram:
            if stop > start:
                self.dram[self._blocks(start, stop, pattern), q if write else NQ + q] = index

    def _blocks(self, start: int, stop: int, pattern=()):
        if not pattern:
            return _dram_blocks(start, stop, pattern, self.dram_base, self.dram_block)
        # A strided tile's blocks: the same tile is loaded again for each block of outputs.
        key = (start, stop, *pattern)
        blocks = self._strided.get(key)
        if blocks is None:
            blocks = self._strided[key] = _dram_blocks(start, stop, pattern, self.dram_base,
                                                       self.dram_block)
        return blocks

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

    def make_after(self, entry: _Entry, clock: list[int], need: dict[int, int]) -> None:
        """Ensure `entry` (not yet appended) starts after instruction need[p] of each queue p,
        with at most one token per side: from the neighbouring queue's latest instruction when
        that one already follows every requirement on its side, else from a relay SYNC placed
        there now, itself made to follow them (recursively, toward the far queues)."""
        q = entry.queue
        for side in (-1, 1):
            pending = {p: j for p, j in need.items() if (p - q) * side > 0 and clock[p] < j}
            if not pending:
                continue
            r = q + side
            if list(pending) == [r]:  # the neighbour alone: its producing instruction pushes
                self._token(pending[r], entry, clock)
                continue
            y = self.latest[r]
            if y < 0 or any(self.entries[y].clock[p] < j for p, j in pending.items()):
                sync = _Entry(isa.SYNC, {"queue": isa.QUEUES[r]}, entry.source, r)
                sync_clock = self.queue_clock(r)
                self.make_after(sync, sync_clock, {p: j for p, j in pending.items() if p != r})
                y = self.append(sync, sync_clock)
                self.syncs += 1
            self._token(y, entry, clock)

    def append(self, entry: _Entry, clock: list[int]) -> int:
        index = len(self.entries)
        clock[entry.queue] = index
        entry.clock = tuple(clock)
        self.entries.append(entry)
        self.latest[entry.queue] = index
        if entry.flags:  # most instructions take no token
            for flag, side in (("pop_prev", -1), ("pop_next", 1)):
                if flag in entry.flags:
                    self.pops.setdefault((entry.queue + side, entry.queue), []).append(index)
        return index

    def add(self, op: Op) -> None:
        q = _QUEUE_INDEX[op.row.queue]
        insn = op.insn
        entry = _Entry(op.row, op.args, op.source, q, insn=insn)
        j = self.latest[q]  # (queue_clock, inline: this runs once per instruction)
        clock = list(self.entries[j].clock) if j >= 0 else [-1] * NQ
        accesses = self._accesses.get(id(insn))
        if accesses is None:  # Insns are shared (`Op.insn`) and live as long as the program
            accesses = self._accesses[id(insn)] = op.row.access(self.arch, insn)
        need = self.needs(op, q, accesses)
        # (never true of its own queue: nothing recorded there is later than its latest)
        if any(map(int.__gt__, need, clock)):
            self.make_after(entry, clock, {p: j for p, j in enumerate(need)
                                           if p != q and j >= 0})
        index = self.append(entry, clock)
        self.record(op, q, index, accesses)


def _flagged(insn: isa.Insn, flags: set) -> isa.Insn:
    """A checked instruction with dependency flags added (the scheduler adds only flags toward
    a neighbouring queue, which `isa` accepts): no need to check every field again."""
    deps = insn.deps
    for flag in flags:
        deps |= _FLAG_BITS[flag]
    return isa.Insn(insn.op, insn.args, deps)


_FLAG_BITS = {"pop_prev": isa.POP_PREV, "pop_next": isa.POP_NEXT, "push_prev": isa.PUSH_PREV,
              "push_next": isa.PUSH_NEXT}


def schedule(layers: list[list[Step]], arch: Arch, double_buffer: bool = True,
             progress: Progress = quiet) -> Scheduled:
    """The instruction stream with its tokens, ending in END."""
    ops = order(layers, double_buffer, arch)
    spans = [(access[0], access[1]) for op in ops for access in op.dram]
    tokens = _Tokens(arch, (min(s for s, _ in spans), max(s for _, s in spans)) if spans
                     else (0, 0))
    for done, op in enumerate(ops):
        if done % _PROGRESS_EVERY == 0:
            progress("scheduling instructions", done, len(ops))
        if op.row.queue not in isa.QUEUES:
            raise CompileError(f"internal: {op.row.mnemonic} has no fixed queue")
        tokens.add(op)
    insns = [e.insn if e.insn is not None and not e.flags
             else e.row(**e.args, **{flag: True for flag in e.flags}) if e.insn is None
             else _flagged(e.insn, e.flags) for e in tokens.entries]
    source = [e.source for e in tokens.entries]
    return Scheduled(tuple(insns) + (isa.END(),), tuple(source) + ("",), tokens.syncs)
