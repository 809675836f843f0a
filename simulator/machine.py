"""The machine: runs a Program bit-exactly and times it, in one event-driven pass.

**State.** DRAM is a byte array of `arch.dram.size_bytes`, initialised with the program's DRAM
image at address 0 and the inputs at their bindings. The scratchpad is (rows, lanes) int8, the
accumulator (rows, lanes) int32, both zero at reset; the array holds the last PRELOADed weight
tile. Local addresses count rows, DRAM addresses bytes (see `simulator.isa`).

**Order.** The instruction stream is split, in program order, into four in-order queues
(load, compute, vector, store). Each step starts, among the queue heads that may start, the one
that can start earliest, so instructions start in time order and the functional effect of an
instruction is applied when it starts. A program whose cross-queue accesses are all ordered by
tokens therefore computes the same result under any timing.

**Tokens.** Between neighbouring queues there is a FIFO per direction of depth
`arch.queues.token_depth`. An instruction starts only when every FIFO it pops from holds a token
pushed by an instruction that has ended (the token's arrival time) and every FIFO it pushes to has
room; it pops at its start and pushes at its end. A head that can never start is an error naming
the instruction: a pop whose producer queue has finished (token queue underflow), a push into a
FIFO whose consumer has finished (token queue overflow), or a circular wait (deadlock). Tokens
still queued at END are an error too. Tokens also order memory: each instruction carries a vector
clock, and a cross-queue conflict on a local row that no token chain orders is reported as a race
(`simulator.hazards`; `run(..., check_hazards=False)` skips the check).

**Timing.** An instruction occupies its queue's unit for `row.cycles(arch, insn)` cycles; its
tokens are pushed `row.latency(arch, insn)` cycles later (a pipelined unit's drain: the array's skew
with preload_overlap), and never before the tokens of the queue's earlier instructions. LOAD and
STORE also share one DRAM port: after the latency, a transfer waits for the port, so the sum of all
transfers (and hence the DRAM roofline) is a lower bound on the total. HOST (on the store queue)
moves its segment's bytes over the same port after the latency, then computes for its compute_cycles
with the port free. Gaps before an instruction starts are stalls, attributed to the constraint that
set its start: `token` (waiting for a producer), `token_full` (waiting for room to push); a wait for
the DRAM port is `dram_port`. Timing depends on the program alone, never on the data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from simulator import isa
from simulator.arch import Arch
from simulator.errors import IndexRangeError, SimulatorError, listing
from simulator.hazards import Hazards
from simulator.program import IOBinding, Program, segment_bindings
from simulator.stats import Stats, Timeline
from simulator.units import dram_view

NQ = len(isa.QUEUES)


class State:
    """The machine's memories; the units' `run` functions read and write these arrays."""

    def __init__(self, arch: Arch):
        self.arch = arch
        # HOST's view of the program: (segment, input bindings, output bindings) per segment,
        # and the runner; set by `run`.
        self.host_segments: tuple = ()
        self.host: HostRunner | None = None
        self.dram = np.zeros(arch.dram.size_bytes, np.uint8)
        self.scratchpad = np.zeros((arch.scratchpad.rows, arch.lanes), np.int8)
        self.accumulator = np.zeros((arch.accumulator.rows, arch.lanes), np.int32)
        self.memories = (self.scratchpad, self.accumulator)
        self.weights: np.ndarray | None = None

    def _tensor(self, binding: IOBinding) -> np.ndarray:
        item = np.dtype(binding.dtype).itemsize
        try:
            return dram_view(self.dram, binding.dram, binding.shape + (item,),
                             binding.byte_strides + (1,))
        except SimulatorError as err:
            raise SimulatorError(f"binding {binding.name!r}: {err}") from None

    def write(self, binding: IOBinding, value: np.ndarray) -> None:
        value = np.asarray(value)
        if value.shape != binding.shape or value.dtype != np.dtype(binding.dtype):
            raise SimulatorError(f"input {binding.name!r}: expected {binding.dtype} of shape "
                                 f"{binding.shape}, got {value.dtype} of shape {value.shape}")
        little = np.dtype(binding.dtype).newbyteorder("<")
        raw = np.ascontiguousarray(value, little).reshape(-1).view(np.uint8)
        if binding.dtype == "uint8":  # the machine holds int8 codes: q - 128 (`IOBinding`)
            raw = raw ^ np.uint8(0x80)
        self._tensor(binding)[...] = raw.reshape(binding.shape + (-1,))

    def read(self, binding: IOBinding) -> np.ndarray:
        little = np.dtype(binding.dtype).newbyteorder("<")
        raw = np.ascontiguousarray(self._tensor(binding))
        if binding.dtype == "uint8":
            raw = raw ^ np.uint8(0x80)
        raw = raw.view(little)
        return raw.reshape(binding.shape).astype(binding.dtype)


@dataclass(frozen=True)
class Result:
    outputs: dict[str, np.ndarray]
    stats: Stats
    timeline: Timeline
    state: State


# The host runner: (segment record, its inputs by value name) -> its outputs by value name.
HostRunner = Callable[[dict, dict[str, np.ndarray]], dict[str, np.ndarray]]


def run(program: Program, inputs: dict[str, np.ndarray] | None = None, *,
        check_hazards: bool = True, host: HostRunner | None = None) -> Result:
    """Run `program` on quantized `inputs` (keyed by input name): outputs, stats, timeline.

    With `check_hazards` (the default) a cross-queue access to a local memory that no token
    orders is an error (see `simulator.hazards`), however the timing happened to fall. `host`
    runs the program's host segments (see `simulator.units.host`); a program with HOST
    instructions needs one."""
    inputs = dict(inputs or {})
    state = State(program.arch)
    if program.host_segments:
        if host is None and any(insn.op is isa.HOST for insn in program.instructions):
            names = [segment["name"] for segment in program.host_segments]
            raise SimulatorError(f"program has host segment(s) {listing(names)}: run it with a "
                                 f"host runner (ember simulate supplies one)")
        state.host = host
        state.host_segments = tuple((segment, *segment_bindings(segment))
                                    for segment in program.host_segments)
    state.dram[:len(program.dram_image)] = np.frombuffer(program.dram_image, np.uint8)
    missing = [b.name for b in program.inputs if b.name not in inputs]
    unknown = sorted(set(inputs) - {b.name for b in program.inputs})
    if missing or unknown:
        raise SimulatorError(f"inputs: missing {listing(missing, quote=True) or 'none'}, unknown "
                             f"{listing(unknown, quote=True) or 'none'}; the program takes "
                             f"{listing([b.name for b in program.inputs], quote=True)}")
    for binding in program.inputs:
        state.write(binding, inputs[binding.name])
    timeline = _execute(program, state, check_hazards)
    outputs = {b.name: state.read(b) for b in program.outputs}
    return Result(outputs, Stats.collect(program, timeline), timeline, state)


def timing(program: Program) -> Timeline:
    """The timeline `run` would give, without running anything: timing depends on the program
    alone, never on the data, so no memories are needed (the compile summary's cycles)."""
    return _execute(program, None, False)


def _where(program: Program, i: int) -> str:
    node = f" of node {program.source[i]!r}" if program.source[i] else ""
    return f"instruction {i}{node} ({isa.disassemble(program.instructions[i])})"


def _index_error(program: Program, i: int, err: IndexRangeError) -> str:
    """The message for an index out of its table's range: by the input binding and element
    that held it, when an input did (the user's data), else by the instruction."""
    for b in program.inputs:
        offset = err.address - b.dram
        dense = IOBinding(b.name, b.dram, b.shape, b.scale, b.zero_point, b.dtype)
        if b.dtype == "int32" and b.byte_strides == dense.byte_strides and \
                0 <= offset < b.size_bytes:
            element = [int(k) for k in np.unravel_index(offset // 4, b.shape)]
            node = f"node {program.source[i]!r}" if program.source[i] else "the program"
            return (f"input {b.name!r}: index {err.index} at {element} is out of range "
                    f"[{-err.size}, {err.size}): {node} gathers from a table of {err.size} "
                    f"rows")
    return f"{_where(program, i)}: {err}"


def _channels():
    """Channel id for (from queue, to queue) of each neighbouring pair."""
    pairs = [(q, q + 1) for q in range(NQ - 1)] + [(q + 1, q) for q in range(NQ - 1)]
    return {pair: n for n, pair in enumerate(pairs)}


def _execute(program: Program, state: State | None, check_hazards: bool) -> Timeline:
    """Time every instruction and, with a `state`, apply its effect to it."""
    arch = program.arch
    insns = program.instructions
    n = len(insns) - 1  # END is not executed
    channel = _channels()
    name_of = {v: f"{isa.QUEUES[a]}->{isa.QUEUES[b]}" for (a, b), v in channel.items()}
    # transfer[i]: the cycles instruction i holds the DRAM port (`InsnDef.transfer`), or None
    queue_of, pops, pushes, wakes, cycles, transfer = [], [], [], [], [], []
    drain = []  # cycles after the unit frees until the results are visible (`InsnDef.latency`)
    # Timing is a function of the fields alone, and equal instructions often share one Insn
    # (codegen's and the decoder's caches): each is timed once.
    timings: dict[int, tuple] = {}
    for i in range(n):
        insn = insns[i]
        row, q, d = insn.op, isa.QUEUES.index(insn.queue), insn.deps
        if arch.vector_lacks(insn):
            raise SimulatorError(f"{_where(program, i)}: the {arch.name} vector unit does not "
                                 f"support {row.mnemonic} (it supports "
                                 f"{listing(arch.vector.ops)})")
        queue_of.append(q)
        pops.append(tuple(channel[(q + dq, q)] for bit, dq in
                          ((isa.POP_PREV, -1), (isa.POP_NEXT, 1)) if d & bit))
        pushes.append(tuple(channel[(q, q + dq)] for bit, dq in
                            ((isa.PUSH_PREV, -1), (isa.PUSH_NEXT, 1)) if d & bit))
        # the queue heads whose readiness this instruction can change: its own, and the
        # neighbours it exchanges tokens with
        wake = [q]
        if d & (isa.POP_PREV | isa.PUSH_PREV):
            wake.append(q - 1)
        if d & (isa.POP_NEXT | isa.PUSH_NEXT):
            wake.append(q + 1)
        wakes.append(tuple(wake))
        timing = timings.get(id(insn))
        if timing is None:
            timing = timings[id(insn)] = (
                row.cycles(arch, insn), row.latency(arch, insn),
                None if row.transfer is None else row.transfer(arch, insn))
        cycles.append(timing[0])
        drain.append(timing[1])
        transfer.append(timing[2])
    queues = [[i for i in range(n) if queue_of[i] == q] for q in range(NQ)]
    nchan = len(channel)
    push_times = [[] for _ in range(nchan)]
    push_by = [[] for _ in range(nchan)]
    pop_times = [[] for _ in range(nchan)]
    push_clocks = [[] for _ in range(nchan)]  # the pusher's vector clock, per token
    clocks = [[-1] * NQ for _ in range(NQ)]
    hazards = Hazards(tuple(memory.rows for memory in arch.memories), NQ,
                      lambda i: _where(program, i)) if check_hazards else None
    depth = arch.queues.token_depth
    latency = arch.dma.latency_cycles

    head = [0] * NQ
    free = [0] * NQ
    done = [0] * NQ  # when the queue's latest results are visible: in order, so a later
    #                  instruction's tokens (a relaying SYNC's too) never overtake them
    port_free = 0
    start = [0] * n
    end = [0] * n
    stall = {(q, cause): 0 for q in range(NQ) for cause in ("token", "token_full", "dram_port")}
    blocked = [None] * NQ  # why a head cannot start, for the deadlock message

    def earliest(q):
        """(start time, cause) of queue q's head, or None when it cannot start yet."""
        i = queues[q][head[q]]
        t, cause = free[q], None
        for ch in pops[i]:
            k = len(pop_times[ch])
            if k >= len(push_times[ch]):
                blocked[q] = ("pop", ch)
                return None
            if push_times[ch][k] > t:
                t, cause = push_times[ch][k], "token"
        for ch in pushes[i]:
            k = len(push_times[ch]) - depth
            if k >= 0:
                if k >= len(pop_times[ch]):
                    blocked[q] = ("push", ch)
                    return None
                if pop_times[ch][k] > t:
                    t, cause = pop_times[ch][k], "token_full"
        return t, cause

    live = [q for q in range(NQ) if queues[q]]
    ready = {q: earliest(q) for q in live}
    while live:
        best_q, best = None, None
        for q in live:
            r = ready[q]
            if r is not None and (best is None or r[0] < best[0]):
                best_q, best = q, r
        if best_q is None:
            raise SimulatorError(_deadlock(program, queues, head, blocked, live, name_of, depth))
        q = best_q
        s, cause = best
        i = queues[q][head[q]]
        if cause is not None:
            stall[(q, cause)] += s - free[q]
        clock = clocks[q]
        for ch in pops[i]:
            clock[:] = map(max, clock, push_clocks[ch][len(pop_times[ch])])
        clock[q] = i
        if hazards is not None:
            hazards.check(i, q, clock, insns[i].op.access(arch, insns[i]))
        if state is not None:
            try:
                insns[i].op.run(state, insns[i])
            except IndexRangeError as err:
                raise SimulatorError(_index_error(program, i, err)) from None
            except SimulatorError as err:
                raise SimulatorError(f"{_where(program, i)}: {err}") from None
        moving = transfer[i]
        if moving is not None:  # the latency, the transfer on the port, then the rest (HOST's
            #                     compute) with the port free
            begin = max(s + latency, port_free) if moving else s + latency
            stall[(q, "dram_port")] += begin - (s + latency)
            if moving:
                port_free = begin + moving
            e = begin + cycles[i] - latency
        else:
            e = s + cycles[i]
        for ch in pops[i]:
            pop_times[ch].append(s)
        done[q] = max(done[q], e + drain[i])
        for ch in pushes[i]:
            push_times[ch].append(done[q])
            push_by[ch].append(i)
            push_clocks[ch].append(tuple(clock))
        start[i], end[i] = s, e
        free[q] = e
        head[q] += 1
        if head[q] == len(queues[q]):
            live.remove(q)
            ready.pop(q)
        for r in wakes[i]:
            if r in ready:
                ready[r] = earliest(r)
    for ch in range(nchan):
        left = len(push_times[ch]) - len(pop_times[ch])
        if left:
            first = push_by[ch][len(pop_times[ch])]
            raise SimulatorError(f"program ended with {left} unconsumed token(s) on the "
                                 f"{name_of[ch]} queue, the first pushed by "
                                 f"{_where(program, first)}")
    return Timeline(start=np.array(start, np.int64), end=np.array(end, np.int64),
                    queue=np.array(queue_of, np.int8),
                    stall={f"{isa.QUEUES[q]}.{c}": v for (q, c), v in stall.items()})


def _deadlock(program, queues, head, blocked, live, name_of, depth) -> str:
    """Explain why no queue head can start, naming each blocked instruction."""
    reasons = []
    for q in live:
        i = queues[q][head[q]]
        kind, ch = blocked[q]
        other = name_of[ch].split("->")[0 if kind == "pop" else 1]
        other_done = isa.QUEUES.index(other) not in live
        if kind == "pop" and other_done:
            why = (f"pops a token from the {other} queue that is never pushed "
                   f"(token queue underflow)")
        elif kind == "push" and other_done:
            why = (f"pushes to the full {name_of[ch]} token queue ({depth} tokens) that is "
                   f"never popped again (token queue overflow)")
        else:
            verb = "waits for a token from" if kind == "pop" else "waits for room in"
            why = f"{verb} the {name_of[ch]} token queue (circular wait)"
        reasons.append(f"{_where(program, i)} on the {isa.QUEUES[q]} queue {why}")
    return "deadlock: " + "; ".join(reasons)
