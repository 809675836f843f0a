"""Scheduling: program order and dependency tokens, derived from the hazards on buffers.

Codegen hands over each layer as a list of `Step`s (the loads of one tile, then the work on it).
With double buffering, the loads of the next step that loads are placed before the work of step t,
so the load queue fetches the next tile while the array computes this one (the buffers alternate, so
they do not collide); without it, steps run one after another in one buffer. A layer's first loads
of activations follow the previous layer's work in program order, but wait only for the stores of
the DRAM blocks they read (a DMA's access is the elements it touches,
`compiler.backend.codegen.emit.relocate`), so a layer may start on rows its predecessor has already
stored; its first loads of constants may come before the previous layer's last work (`order`).

Tokens are then derived, not written by hand, in two passes. First the hazards: every
instruction's local-memory accesses (`InsnDef.access`, the function the machine's race check
uses) and every activation DRAM access are compared with the last writer and readers of the same
rows or bytes on the other queues: read-after-write, write-after-read and write-after-write each
require the earlier instruction to finish first (`compiler.backend.hazards`, array operations
over the whole program). Then the tokens, walking the program in order: a vector clock per queue
(as in `simulator.hazards`) says which requirements already hold through earlier tokens and
in-order queues; each one that does not gets one token, from the producer itself when the queues
are neighbours, or relayed by a SYNC on each queue in between (load -> compute -> vector ->
store). An instruction pops at most one token per side: when it needs queues beyond its
neighbour, the token comes from the neighbour's latest instruction if that one already follows
all of them, else from a relay SYNC placed there just before the instruction and made to follow
them all (`_Tokens.make_after`). Only the instructions whose requirements some earlier
instruction of their queue did not already have are walked (`_may_wait`): a queue's clock covers
what its earlier instructions waited for. Because every dependency points backwards in program
order, and no token FIFO ever holds more than `arch.queues.token_depth` tokens when the program
runs in program order, program order is always a valid execution: no deadlock, and every pushed
token is popped.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from compiler.backend import hazards
from compiler.backend.progress import Progress, quiet
from compiler.backend.steps import Op, Step
from compiler.errors import CompileError
from simulator import isa
from simulator.arch import Arch

NQ = len(isa.QUEUES)
_PROGRESS_EVERY = 1024  # ops placed between progress reports: a report costs a lock


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


# Each op's place in the program is a key, (i << _SLOT_BITS) | _OP_SLOT for op i; the relay
# SYNCs placed just before op i take the slots below. Keys order the program as its indices
# would, without renumbering every later instruction when a SYNC is inserted.
_SLOT_BITS = 4
_OP_SLOT = (1 << _SLOT_BITS) - 1
_QUEUE_INDEX = {name: i for i, name in enumerate(isa.QUEUES)}


@dataclass
class _Entry:
    """An instruction being placed (an op that needs tokens, or a relay SYNC): its queue, the
    node it serves, and the pop flags it takes (`isa.POP_PREV`, `isa.POP_NEXT` bits)."""

    queue: int
    source: str
    deps: int = 0


class _Tokens:
    """Adds push/pop flags and relay SYNCs as the hazards (`compiler.backend.hazards.waits`)
    require, for the ops whose requirements their queue's clock may not meet yet.

    An instruction's clock says, per queue, the latest instruction known to finish before it
    starts (through earlier tokens and in-order queues). Only an op that pops a token or a
    SYNC changes its queue's clock beyond its own place, so each queue keeps its clock from
    each such instruction on (an epoch), and any instruction's clock is its queue's epoch."""

    def __init__(self, arch: Arch, queues: list[int]):
        self.depth = arch.queues.token_depth
        self.queues = queues  # each op's queue
        self.now = 0  # the op being placed
        self.slot = 0  # the slot of the next SYNC placed before it
        self.last_ops: list[int] = [-1] * NQ  # each queue's last op before it (its key)
        self.last_syncs = [-1] * NQ  # each queue's last SYNC (its key)
        self.epochs: list[tuple[list[int], list[tuple[int, ...]]]] = [([], []) for _ in range(NQ)]
        self.deps: dict[int, int] = {}  # key → its flags
        self.pops: dict[tuple[int, int], list[int]] = defaultdict(list)  # (from, to) queue →
        #                                                                   popper keys
        self.syncs: list[tuple[int, _Entry]] = []  # (key, entry), in program order
        self.sync_queues: dict[int, int] = {}

    def latest(self, q: int) -> int:
        """The key of queue q's latest instruction (-1: none yet)."""
        return max(self.last_ops[q], self.last_syncs[q])

    def queue_of(self, key: int) -> int:
        if key & _OP_SLOT == _OP_SLOT:
            return self.queues[key >> _SLOT_BITS]
        return self.sync_queues[key]

    def clock(self, key: int, q: int) -> list[int]:
        """The clock of the instruction at `key`, of queue q."""
        starts, clocks = self.epochs[q]
        epoch = bisect.bisect_right(starts, key) - 1
        clock = list(clocks[epoch]) if epoch >= 0 else [-1] * NQ
        clock[q] = key
        return clock

    def queue_clock(self, q: int) -> list[int]:
        """The clock of queue q's latest instruction: its epoch is the last."""
        clocks = self.epochs[q][1]
        clock = list(clocks[-1]) if clocks else [-1] * NQ
        clock[q] = self.latest(q)
        return clock

    def add(self, i: int, need: list[int], last_ops: list[int], source: str) -> None:
        """Place op i, which must follow instruction need[p] of each queue p (a key, or -1),
        after the ops before it: the key of each queue's last one in `last_ops`."""
        self.now, self.slot, self.last_ops = i, 0, last_ops
        q = self.queues[i]
        clock = self.queue_clock(q)
        unmet = [p for p in range(NQ) if need[p] > clock[p]]  # (never its own queue)
        if not unmet:
            return
        entry = _Entry(q, source)
        if len(unmet) == 1 and abs(unmet[0] - q) == 1:  # most often: a neighbour's producer
            self._token(need[unmet[0]], entry, clock)
        else:
            self.make_after(entry, clock, {p: need[p] for p in unmet})
        self.append(entry, clock, (i << _SLOT_BITS) | _OP_SLOT)

    def _token(self, pusher: int, entry: _Entry, clock: list[int]) -> None:
        """A token from `pusher` (or a later instruction of its queue) to `entry`, between
        neighbouring queues; merge the pusher's clock.

        The FIFO holds `arch.queues.token_depth` tokens. Executed in program order, the new
        token is outstanding from its push to `entry`; earlier tokens on the channel were all
        pushed before it, so the FIFO is fullest right at the push. If the tokens still
        unpopped there would overflow it, a later instruction of the same queue pushes
        instead (the latest, or a SYNC placed just before `entry`): the program order then
        never overflows a FIFO, so the machine can always follow it and never deadlocks."""
        p = self.queue_of(pusher)
        pops = self.pops[p, entry.queue]
        if not self._fits(pops, pusher):
            pusher = self.latest(p)
            if not self._fits(pops, pusher):
                pusher = self.append_sync(_Entry(p, entry.source), self.queue_clock(p))
        push, pop = ((isa.PUSH_NEXT, isa.POP_PREV) if entry.queue > p else
                     (isa.PUSH_PREV, isa.POP_NEXT))
        pusher_deps = self.deps.get(pusher, 0)
        if pusher_deps & push or entry.deps & pop:
            raise AssertionError(f"scheduler: token slot taken between instruction {pusher} and "
                                 f"a {isa.QUEUES[entry.queue]} instruction")
        self.deps[pusher] = pusher_deps | push
        entry.deps |= pop
        clock[:] = map(max, clock, self.clock(pusher, p))

    def _fits(self, pops: list[int], pusher: int) -> bool:
        """Whether a token pushed at `pusher` fits its channel's FIFO: fewer than `depth` of
        the channel's pops (keys, in program order) come after it."""
        return len(pops) < self.depth or pops[-self.depth] <= pusher

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
            if len(pending) == 1 and r in pending:  # the neighbour alone: its producer pushes
                self._token(pending[r], entry, clock)
                continue
            y = self.latest(r)
            if y < 0 or any(self.clock(y, r)[p] < j for p, j in pending.items()):
                sync = _Entry(r, entry.source)
                sync_clock = self.queue_clock(r)
                self.make_after(sync, sync_clock, {p: j for p, j in pending.items() if p != r})
                y = self.append_sync(sync, sync_clock)
            self._token(y, entry, clock)

    def append_sync(self, entry: _Entry, clock: list[int]) -> int:
        """Place a relay SYNC just before the op being placed; its key."""
        if self.slot == _OP_SLOT:
            raise AssertionError(f"scheduler: more than {_OP_SLOT} SYNCs before one instruction")
        key = (self.now << _SLOT_BITS) | self.slot
        self.slot += 1
        self.sync_queues[key] = entry.queue
        self.last_syncs[entry.queue] = key
        self.syncs.append((key, entry))
        self.append(entry, clock, key)
        return key

    def append(self, entry: _Entry, clock: list[int], key: int) -> None:
        q = entry.queue
        clock[q] = key
        starts, clocks = self.epochs[q]
        starts.append(key)
        clocks.append(tuple(clock))
        self.deps[key] = entry.deps
        if entry.deps & isa.POP_PREV:
            self.pops[q - 1, q].append(key)
        if entry.deps & isa.POP_NEXT:
            self.pops[q + 1, q].append(key)


def _may_wait(need: np.ndarray, queues: np.ndarray) -> np.ndarray:
    """The ops whose requirements their queue may not meet yet: an op requiring no later
    instruction of any queue than some earlier op of its queue already followed needs no
    token (a queue's clock only grows, and after an op it covers the op's requirements)."""
    may = np.zeros(len(need), bool)
    for q in range(NQ):
        mine = np.flatnonzero(queues == q)
        if len(mine):
            rows = need[mine]
            may[mine[0]] = (rows[0] >= 0).any()
            may[mine[1:]] = (rows[1:] > np.maximum.accumulate(rows, axis=0)[:-1]).any(axis=1)
    return np.flatnonzero(may)


def schedule(layers: list[list[Step]], arch: Arch, double_buffer: bool = True,
             progress: Progress = quiet) -> Scheduled:
    """The instruction stream with its tokens, ending in END. Progress is reported as the
    tokens are placed, every _PROGRESS_EVERY ops, from the first."""
    ops = order(layers, double_buffer, arch)
    progress("scheduling instructions", 0, len(ops))
    insns = list(map(attrgetter("insn"), ops))
    sources = list(map(attrgetter("source"), ops))
    unique, which = hazards.distinct(insns)
    queues = np.array([_queue_index(insn.op) for insn in unique], np.int64)[which]
    wait = hazards.waits(unique, which, list(map(attrgetter("dram"), ops)), queues, arch)
    need = np.where(wait >= 0, (wait << _SLOT_BITS) | _OP_SLOT, -1)
    may_wait = _may_wait(need, queues)
    tokens = _Tokens(arch, queues.tolist())
    reported = 0
    for i, op_need, last_ops in zip(may_wait.tolist(), need[may_wait].tolist(),
                                    _last_ops(queues, may_wait).tolist()):
        if i - reported >= _PROGRESS_EVERY:
            reported = i - i % _PROGRESS_EVERY
            progress("scheduling instructions", reported, len(ops))
        tokens.add(i, op_need, last_ops, sources[i])
    return _program(insns, sources, tokens)


def _last_ops(queues: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per op index in `at`, the key of each queue's last op before it (-1: none)."""
    last = np.full((len(at), NQ), -1, np.int64)
    for q in range(NQ):
        mine = np.flatnonzero(queues == q)
        before = np.searchsorted(mine, at) - 1
        found = before >= 0
        last[found, q] = (mine[before[found]] << _SLOT_BITS) | _OP_SLOT
    return last


def _queue_index(row: isa.InsnDef) -> int:
    if row.queue not in isa.QUEUES:
        raise CompileError(f"internal: {row.mnemonic} has no fixed queue")
    return _QUEUE_INDEX[row.queue]


def _program(insns: list[isa.Insn], sources: list[str], tokens: _Tokens) -> Scheduled:
    """The ops' instructions with their flags, the relay SYNCs before the ops they precede,
    and END. Equal instructions with equal flags share one Insn, as without flags."""
    flagged: dict[tuple[int, int], isa.Insn] = {}
    for key, deps in tokens.deps.items():
        if deps and key & _OP_SLOT == _OP_SLOT:
            insn = insns[key >> _SLOT_BITS]
            shared = flagged.get((id(insn), deps))
            if shared is None:
                # (only flags toward a neighbouring queue, which `isa` accepts: the fields
                # are checked already)
                shared = flagged[id(insn), deps] = isa.Insn(insn.op, insn.args, insn.deps | deps)
            insns[key >> _SLOT_BITS] = shared
    program, source, placed = [], [], 0
    for key, entry in tokens.syncs:
        i = key >> _SLOT_BITS
        program += insns[placed:i]
        source += sources[placed:i]
        deps = tokens.deps[key]
        program.append(isa.SYNC(queue=isa.QUEUES[entry.queue],
                                **{flag: True for flag, bit in _FLAG_BITS.items() if deps & bit}))
        source.append(entry.source)
        placed = i
    program += insns[placed:]
    source += sources[placed:]
    return Scheduled(tuple(program) + (isa.END(),), tuple(source) + ("",), len(tokens.syncs))


_FLAG_BITS = {"pop_prev": isa.POP_PREV, "pop_next": isa.POP_NEXT, "push_prev": isa.PUSH_PREV,
              "push_next": isa.PUSH_NEXT}
