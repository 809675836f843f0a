"""The machine: runs a Program bit-exactly and times it: one event-driven pass times it (the
timing depends on the program alone), then the instructions' effects are applied in the order
they started, to one sample or to a batch of samples at once (`Machine`), through the
functional plan (`simulator.plan`: chains of array passes fused, constant LOADs shared), which
changes no value.

**State.** DRAM is a byte array (the program's extent of `arch.dram.size_bytes`, `dram_extent`),
initialised with the program's DRAM image at address 0 and the inputs at their bindings. The
scratchpad is (rows, lanes) int8, the accumulator (rows, lanes) int32, both zero at reset; the
array holds the last PRELOADed weight tile. Each has a leading axis of samples: a batch runs
every instruction once for all its samples. Local addresses count rows, DRAM addresses bytes
(see `simulator.isa`).

**Order.** The instruction stream is split, in program order, into four in-order queues
(load, compute, vector, store). Each step starts, among the queue heads that may start, the one
that can start earliest, so instructions start in time order and the functional effect of an
instruction is applied in that order, as if when it starts. A program whose cross-queue accesses
are all ordered by tokens therefore computes the same result under any timing.

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

import gc
from contextlib import contextmanager
from typing import Callable

import numpy as np

from simulator import isa, numerics, plan
from simulator.arch import Arch
from simulator.errors import IndexRangeError, SimulatorError, listing
from simulator.hazards import Hazards
from simulator.program import IOBinding, Program, segment_bindings
from simulator.stats import Stats, Timeline
from simulator.units import dram_view

NQ = len(isa.QUEUES)


class State:
    """The memories of `batch` samples, each array's leading axis the sample (`simulator.units`):
    the units' `run` functions read and write these arrays. DRAM holds `dram_bytes` (the
    program's extent, `dram_extent`; the architecture's whole DRAM by default)."""

    def __init__(self, arch: Arch, batch: int = 1, dram_bytes: int | None = None):
        self.arch = arch
        self.batch = batch
        # HOST's view of the program: (segment, input bindings, output bindings) per segment,
        # and the runner; set by `run`.
        self.host_segments: tuple = ()
        self.host: HostRunner | None = None
        self.dram = np.zeros((batch, arch.dram.size_bytes if dram_bytes is None else dram_bytes),
                             np.uint8)
        self.scratchpad = np.zeros((batch, arch.scratchpad.rows, arch.lanes), np.int8)
        self.accumulator = np.zeros((batch, arch.accumulator.rows, arch.lanes), np.int32)
        self.memories = (self.scratchpad, self.accumulator)
        # The latched tile: the samples' one tile (k, lanes) when they all latched the same,
        # else each sample's (samples, k, lanes) in `weights`.
        self.weights: np.ndarray | None = None
        self.shared_weights: np.ndarray | None = None
        self.image: np.ndarray | None = None  # the DRAM bytes the samples share (`Machine`)

    def image_view(self) -> State:
        """Sample 0 with the shared DRAM image as its DRAM: where a LOAD of bytes no
        instruction writes runs once for all samples (`plan.ConstantLoad`)."""
        view = self.sample(0)
        view.dram = self.image
        return view

    def sample(self, index: int) -> State:
        """Sample `index` alone, as a state of one sample whose memories are views of this
        one's: an instruction run on it changes this state."""
        one = State.__new__(State)
        one.__dict__.update(self.__dict__)
        one.batch = 1
        one.dram = self.dram[index:index + 1]
        one.scratchpad = self.scratchpad[index:index + 1]
        one.accumulator = self.accumulator[index:index + 1]
        one.memories = (one.scratchpad, one.accumulator)
        if self.weights is not None:
            one.weights = self.weights[index:index + 1]
        return one

    def _tensor(self, binding: IOBinding, address: int | None = None) -> np.ndarray:
        """The binding's bytes (of the plane at `address`, for an int16 value's)."""
        item = binding.item_bytes
        try:
            return dram_view(self.dram, binding.dram if address is None else address,
                             binding.shape + (item,), binding.byte_strides + (1,))
        except SimulatorError as err:
            raise SimulatorError(f"binding {binding.name!r}: {err}") from None

    def write(self, binding: IOBinding, values: np.ndarray, sample: int | None = None) -> None:
        """Write each sample's value (values: samples first), or sample `sample`'s alone."""
        values = np.asarray(values)
        shape = binding.shape if sample is not None else (self.batch, *binding.shape)
        if values.shape != shape or values.dtype != np.dtype(binding.dtype):
            given = values.shape if sample is not None else values.shape[1:]
            raise SimulatorError(f"input {binding.name!r}: expected {binding.dtype} of shape "
                                 f"{binding.shape}, got {values.dtype} of shape {given}")
        if binding.dtype == "int16":  # two planes of int8 codes (`numerics.split_wide`)
            for address, plane in zip(binding.planes(), numerics.split_wide(values)):
                target = self._tensor(binding, address)
                if sample is not None:
                    target = target[sample]
                target[...] = plane.view(np.uint8).reshape(target.shape)
            return
        little = np.dtype(binding.dtype).newbyteorder("<")
        raw = np.ascontiguousarray(values, little).view(np.uint8)
        if binding.dtype == "uint8":  # the machine holds int8 codes: q - 128 (`IOBinding`)
            raw = raw ^ np.uint8(0x80)
        target = self._tensor(binding)
        if sample is not None:
            target = target[sample]
        target[...] = raw.reshape(target.shape)

    def read(self, binding: IOBinding) -> np.ndarray:
        """Each sample's value, samples first."""
        if binding.dtype == "int16":
            high, low = (np.ascontiguousarray(self._tensor(binding, address)).view(np.int8)
                         .reshape((self.batch, *binding.shape)) for address in binding.planes())
            return numerics.join_wide(high, low).astype(np.int16)
        little = np.dtype(binding.dtype).newbyteorder("<")
        raw = np.ascontiguousarray(self._tensor(binding))
        if binding.dtype == "uint8":
            raw = raw ^ np.uint8(0x80)
        raw = raw.view(little)
        return raw.reshape((self.batch, *binding.shape)).astype(binding.dtype)


class Result:
    """A run's outputs, timeline and final state; its `stats` (the report's figures) are
    collected when first read."""

    def __init__(self, outputs: dict[str, np.ndarray], machine: "Machine", state: State):
        self.outputs, self.state, self._machine = outputs, state, machine

    @property
    def timeline(self) -> Timeline:
        return self._machine.timeline

    @property
    def stats(self) -> Stats:
        return self._machine.stats


# The host runner: (segment record, its inputs by value name) -> its outputs by value name.
HostRunner = Callable[[dict, dict[str, np.ndarray]], dict[str, np.ndarray]]


@contextmanager
def gc_paused():
    """Python's cycle collector, paused: it would traverse every live object (a large
    program's hundreds of thousands of instructions) again and again while the per-instruction
    tables are built, which makes no cycles (ResNet-18's synthetic program: 0.3 s of 2.2)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Machine:
    """A program made ready to run many samples: timed (and its races checked) once, since
    timing depends on the program alone, then run on batches of samples, each sample's outputs
    bit for bit those of a run of that sample alone (`run`).

    `check_hazards` and `host` as for `run`. A batch's memories take `sample_bytes` each."""

    def __init__(self, program: Program, *, check_hazards: bool = True,
                 host: HostRunner | None = None):
        with gc_paused():
            self._prepare(program, check_hazards, host)

    def _prepare(self, program: Program, check_hazards: bool, host: HostRunner | None) -> None:
        if program.host_segments and host is None and \
                any(insn.op is isa.HOST for insn in program.instructions):
            names = [segment["name"] for segment in program.host_segments]
            raise SimulatorError(f"program has host segment(s) {listing(names)}: run it with a "
                                 f"host runner (ember simulate supplies one)")
        self.program, self.host = program, host
        self.segments = tuple((segment, *segment_bindings(segment))
                              for segment in program.host_segments)
        # Each instruction's local accesses, for the race check and the plan alike (equal
        # instructions often share one Insn: codegen's and the decoder's caches).
        known: dict[int, tuple] = {}
        accesses = [known.get(id(insn)) or known.setdefault(id(insn), insn.op.access(
            program.arch, insn)) for insn in program.instructions[:-1]]
        self.timeline, order = _schedule(program, check_hazards, accesses)
        self.dram_bytes = dram_extent(program, self.segments)
        # The samples of a batch share the bytes no instruction writes (`plan.dram_sharing`):
        # the LOADs of such bytes run once, from this image, for all of them.
        constant, self.private, self.touched = plan.dram_sharing(program, self.segments,
                                                                 self.dram_bytes)
        self.image = np.zeros((1, self.dram_bytes), np.uint8)
        image = np.frombuffer(program.dram_image, np.uint8)[:self.dram_bytes]
        self.image[0, :len(image)] = image
        self.plan = plan.build(program, order, constant, accesses)
        self._stats: Stats | None = None
        self._buffers: dict = {}

    @property
    def stats(self) -> Stats:
        if self._stats is None:
            with gc_paused():
                self._stats = Stats.collect(self.program, self.timeline)
        return self._stats

    @property
    def batch(self) -> int:
        """The batch `auto_batch` picks for this program."""
        return auto_batch(self.sample_bytes, plan.chain_bytes(self.plan))

    @property
    def sample_bytes(self) -> int:
        """The memories one sample of a batch takes: the DRAM it touches beyond the shared
        image, and its local memories."""
        arch = self.program.arch
        return self.touched + arch.scratchpad.size_bytes + arch.accumulator.size_bytes

    def execute(self, inputs: dict[str, np.ndarray], first: int = 0) -> State:
        """Run a batch: `inputs` keyed by input name, each with the samples on a new leading
        axis. Returns the final state; `State.read` gives each output binding's values. An
        error the data causes names its sample, counting from `first`."""
        program = self.program
        missing = [b.name for b in program.inputs if b.name not in inputs]
        unknown = sorted(set(inputs) - {b.name for b in program.inputs})
        if missing or unknown:
            raise SimulatorError(f"inputs: missing {listing(missing, quote=True) or 'none'}, "
                                 f"unknown {listing(unknown, quote=True) or 'none'}; the "
                                 f"program takes "
                                 f"{listing([b.name for b in program.inputs], quote=True)}")
        batch = {len(np.asarray(inputs[b.name])) for b in program.inputs} or {1}
        if len(batch) > 1:
            raise SimulatorError(f"inputs: {sorted(batch)} samples: every input needs the "
                                 f"same number")
        state = State(program.arch, batch.pop(), self.dram_bytes)
        state.host, state.host_segments = self.host, self.segments
        state.image = self.image
        for lo, hi in self.private:  # the image bytes that instructions other than the shared
            state.dram[:, lo:hi] = self.image[0, lo:hi]  # LOADs read, per sample
        for binding in program.inputs:
            state.write(binding, inputs[binding.name])
        insns = program.instructions
        # the plan steps' working values (`simulator.plan`), and buffers kept across batches
        scratch: dict = {"buffers": self._buffers}
        for step in self.plan:
            try:
                if type(step) is int:
                    insns[step].op.run(state, insns[step])
                else:
                    step.run(state, scratch)
            except IndexRangeError as err:
                raise SimulatorError(_index_error(program, step, err, state.batch, first)) \
                    from None
            except SimulatorError as err:
                where = step if type(step) is int else step.index
                raise SimulatorError(f"{_where(program, where)}: {err}") from None
        return state

    def outputs(self, inputs: dict[str, np.ndarray], first: int = 0) -> dict[str, np.ndarray]:
        """Run a batch (as `execute`): each output's values, samples first."""
        state = self.execute(inputs, first)
        return {b.name: state.read(b) for b in self.program.outputs}


# The memory a batch may take by default; the most samples in one; and the working set of a
# typical array chain (`plan.chain_bytes`) past which a batch runs no faster per sample:
# its rows fall out of the caches (ResNet-18, 188 KB a sample: 9.6 samples/s at 8, 9.2 at
# 16, 8.6 at 32; the unrolled CRNN, 82 KB a sample: 13.3 at 32, 14.3 at 64, 9.7 at 128).
AUTO_BATCH_BYTES = 256 << 20
AUTO_BATCH_MAX = 256
AUTO_BATCH_CHAIN_BYTES = 2 << 20


def auto_batch(sample_bytes: int, chain_bytes: int = 0) -> int:
    """Samples per batch for a program whose batch takes `sample_bytes` of memory per sample
    and whose typical array chain gathers `chain_bytes` of rows per sample."""
    return max(1, min(AUTO_BATCH_MAX, AUTO_BATCH_BYTES // max(1, sample_bytes),
                      AUTO_BATCH_CHAIN_BYTES // max(1, chain_bytes)))


def run(program: Program, inputs: dict[str, np.ndarray] | None = None, *,
        check_hazards: bool = True, host: HostRunner | None = None) -> Result:
    """Run `program` on quantized `inputs` (keyed by input name): outputs, stats, timeline.

    With `check_hazards` (the default) a cross-queue access to a local memory that no token
    orders is an error (see `simulator.hazards`), however the timing happened to fall. `host`
    runs the program's host segments (see `simulator.units.host`); a program with HOST
    instructions needs one. Many samples: `Machine`."""
    inputs = dict(inputs or {})
    for binding in program.inputs:
        value = inputs.get(binding.name)
        if value is not None:
            value = np.asarray(value)
            if value.shape != binding.shape or value.dtype != np.dtype(binding.dtype):
                raise SimulatorError(f"input {binding.name!r}: expected {binding.dtype} of "
                                     f"shape {binding.shape}, got {value.dtype} of shape "
                                     f"{value.shape}")
            inputs[binding.name] = value[None]
    ready = Machine(program, check_hazards=check_hazards, host=host)
    state = ready.execute(inputs)
    outputs = {b.name: state.read(b)[0] for b in program.outputs}
    return Result(outputs, ready, state)


def timing(program: Program) -> Timeline:
    """The timeline `run` would give, without running anything: timing depends on the program
    alone, never on the data, so no memories are needed (the compile summary's cycles)."""
    with gc_paused():
        return _schedule(program, False)[0]


def dram_extent(program: Program, segments: tuple = ()) -> int:
    """One past the last DRAM byte the program can touch (its image, its bindings, its
    instructions' DMA and its host segments' bindings): a batch's DRAM needs no more per
    sample. An instruction reaching past the architecture's DRAM is an error naming it."""
    size = program.arch.dram.size_bytes
    end = len(program.dram_image)
    bindings = [*program.inputs, *program.outputs,
                *(b for _, ins, outs in segments for b in (*ins, *outs))]
    for b in bindings:
        lo, hi = b.span()
        end = max(end, min(hi, size))
    for i, insn in enumerate(program.instructions):
        if insn.op.dram is None:
            continue
        for lo, hi in insn.op.dram(program.arch, insn):
            if lo < 0 or hi > size:
                raise SimulatorError(f"{_where(program, i)}: DRAM bytes [{lo}, {hi}) out of "
                                     f"range [0, {size})")
            end = max(end, hi)
    return end


def _where(program: Program, i: int) -> str:
    node = f" of node {program.source[i]!r}" if program.source[i] else ""
    return f"instruction {i}{node} ({isa.disassemble(program.instructions[i])})"


def _index_error(program: Program, i: int, err: IndexRangeError, batch: int = 1,
                 first: int = 0) -> str:
    """The message for an index out of its table's range: by the input binding and element
    that held it, when an input did (the user's data), else by the instruction; among many
    samples, by the sample too (counting from `first`)."""
    sample = f"sample {first + err.sample}: " if batch > 1 or first else ""
    for b in program.inputs:
        offset = err.address - b.dram
        dense = IOBinding(b.name, b.dram, b.shape, b.scale, b.zero_point, b.dtype)
        if b.dtype == "int32" and b.byte_strides == dense.byte_strides and \
                0 <= offset < b.size_bytes:
            element = [int(k) for k in np.unravel_index(offset // 4, b.shape)]
            node = f"node {program.source[i]!r}" if program.source[i] else "the program"
            return (f"{sample}input {b.name!r}: index {err.index} at {element} is out of range "
                    f"[{-err.size}, {err.size}): {node} gathers from a table of {err.size} "
                    f"rows")
    return f"{sample}{_where(program, i)}: {err}"


def _channels():
    """Channel id for (from queue, to queue) of each neighbouring pair."""
    pairs = [(q, q + 1) for q in range(NQ - 1)] + [(q + 1, q) for q in range(NQ - 1)]
    return {pair: n for n, pair in enumerate(pairs)}


def _schedule(program: Program, check_hazards: bool, accesses: list | None = None
              ) -> tuple[Timeline, list[int]]:
    """Time every instruction: the timeline, and the instructions in the order they start, in
    which `Machine.execute` applies their effects. The race check reads `accesses` (each
    instruction's `InsnDef.access`) when given."""
    arch = program.arch
    insns = program.instructions
    n = len(insns) - 1  # END is not executed
    channel = _channels()
    name_of = {v: f"{isa.QUEUES[a]}->{isa.QUEUES[b]}" for (a, b), v in channel.items()}
    # transfer[i]: the cycles instruction i holds the DRAM port (`InsnDef.transfer`), or None
    queue_of, pops, pushes, wakes, cycles, transfer = [], [], [], [], [], []
    drain = []  # cycles after the unit frees until the results are visible (`InsnDef.latency`)
    # Timing is a function of the fields alone, and equal instructions often share one Insn, or
    # at least its fields (codegen's and the decoder's caches; the scheduler's flagged copies):
    # each is timed once. The tokens are a function of the queue and the flags alone.
    timings: dict[int, tuple] = {}
    tokens: dict[tuple[int, int], tuple] = {}
    lacking = {row: arch.vector_lacks(isa.Insn(row, {})) for row in isa.TABLE
               if row.queue == "vector"}
    for i in range(n):
        insn = insns[i]
        row, q, d = insn.op, isa.QUEUES.index(insn.queue), insn.deps
        if lacking.get(row):
            raise SimulatorError(f"{_where(program, i)}: the {arch.name} vector unit does not "
                                 f"support {row.mnemonic} (it supports "
                                 f"{listing(arch.vector.ops)})")
        queue_of.append(q)
        known = tokens.get((q, d))
        if known is None:
            # the queue heads whose readiness this instruction can change: its own, and the
            # neighbours it exchanges tokens with
            wake = [q]
            if d & (isa.POP_PREV | isa.PUSH_PREV):
                wake.append(q - 1)
            if d & (isa.POP_NEXT | isa.PUSH_NEXT):
                wake.append(q + 1)
            known = tokens[(q, d)] = (
                tuple(channel[(q + dq, q)] for bit, dq in
                      ((isa.POP_PREV, -1), (isa.POP_NEXT, 1)) if d & bit),
                tuple(channel[(q, q + dq)] for bit, dq in
                      ((isa.PUSH_PREV, -1), (isa.PUSH_NEXT, 1)) if d & bit),
                tuple(wake))
        pops.append(known[0])
        pushes.append(known[1])
        wakes.append(known[2])
        timing = timings.get(id(insn.args))
        if timing is None:
            timing = timings[id(insn.args)] = (
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
    order = []
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
            hazards.check(i, q, clock, accesses[i] if accesses is not None
                          else insns[i].op.access(arch, insns[i]))
        order.append(i)
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
                    stall={f"{isa.QUEUES[q]}.{c}": v for (q, c), v in stall.items()}), order


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
