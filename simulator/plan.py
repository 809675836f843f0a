"""The functional plan of a program: its instructions in the order they start (the order the
machine applies their effects in), with each chain of array passes into the same accumulator
rows fused into one product.

A convolution's output block is a chain of PRELOAD/COMPUTE pairs, one per kernel tap and input
channel block, accumulating into the same rows: 288 passes of k = 16 rows for a 3x3 kernel over
512 channels. Run one by one, each pass is a tiny product whose cost is numpy's overhead; fused
(`Chain`), the chain is one product over all its rows, k = 4,608. The integers are the same:
int32 wrapping addition is associative, and the products are exact (`numerics.array_pass`).

The fused chain reads what each member reads no later than the member would, and writes its
accumulator rows once, after its last member:

- **Reads** are captured (the input rows gathered, the weight tiles latched) in segments
  (`Capture` steps): a segment of members is captured just before the first instruction of
  another queue that writes a row one of them reads (the next weight tile loaded into the
  buffer this one came from), or at the end. Between a member and its capture nothing
  changes what it reads.
- **Writes**: the chain ends (`Finish`: the last capture, the product, the accumulator rows
  written) before any instruction of another queue that reads or writes its accumulator rows
  (the REQUANT of its results), and before a COMPUTE that does not continue it.

Both rules are checked from the instructions' fields (`InsnDef.access`) when the plan is built,
once per program. A PRELOAD or COMPUTE whose fields are out of range runs alone, so that its unit
reports what is wrong, as in a run without a plan.

The samples of a batch share what the program never writes (`dram_sharing`): a LOAD of such
bytes (weights, parameter blocks, tables) runs once from one DRAM image for all of them
(`ConstantLoad`), and a weight tile of rows only such LOADs wrote is latched once, for every
sample and every batch (`Chain.constant_tiles`).
"""

from __future__ import annotations

import bisect

import numpy as np

from simulator import isa, numerics
from simulator.program import Program
from simulator.units import ACCUMULATOR, SCRATCHPAD, shared
from simulator.units import array as array_unit

# A fused chain's product goes to BLAS in pieces of at least this many rows: it is long enough
# for BLAS's threads to pay (`array.shared_product`; ResNet-18 in batches of 16: 9.0 samples/s
# at 4,096 rows a piece, 7.6 at 1,024).
_PIECE_ROWS = 4096


class Chain:
    """The PRELOADs and COMPUTEs of one chain: COMPUTEs of k rows and n lanes into accumulator
    rows [acc, acc + m), the first replacing them unless `accumulate`, each streaming its
    scratchpad rows less its `x_offset` through the tile of one PRELOAD member (or, -1, the
    tile latched before the chain), its product times 2^`shift`. The computes of one
    (x_offset, shift) are one product per segment, shifted once (`numerics.shift_wrap`): an
    int16 operand's two planes, interleaved pass by pass through the same tiles, stay one
    chain of two products. Built by `build`; run by its `Capture` and `Finish` steps."""

    def __init__(self):
        self.members: list[int] = []
        # (sp, k, w_offset, constant): constant when only constant LOADs wrote its rows
        self.preloads: list[tuple[int, int, int, bool]] = []
        self.constant_tiles: dict[int, np.ndarray] = {}  # per PRELOAD, made once
        self.constant_weights: dict[int, np.ndarray] = {}  # per segment, made once
        # each COMPUTE's streamed rows, (m,), or the first of m consecutive ones
        self.inputs: list[np.ndarray | int] = []
        self.tile_of: list[int] = []  # each COMPUTE's PRELOAD member, -1: the entry tile
        self.passes: list[tuple[int, int]] = []  # each COMPUTE's (x_offset, shift)
        self.segments: list[tuple[int, int, int, int]] = []  # preloads [a, b), computes [c, d)
        self.acc = self.m = self.n = self.k = 0
        self.accumulate = True
        # per segment, per (x_offset, shift) of its computes: (x_offset, shift, the computes'
        # indices, their rows (m, count) less `low`, low, high: the span [low, high))
        self.rows: list[list[tuple]] = []

    @property
    def computes(self) -> int:
        return len(self.tile_of)

    def cut(self) -> int | None:
        """End the segment of members not yet captured; its index, or None when empty."""
        start_p, start_c = (self.segments[-1][1], self.segments[-1][3]) if self.segments \
            else (0, 0)
        if start_p == len(self.preloads) and start_c == self.computes:
            return None
        self.segments.append((start_p, len(self.preloads), start_c, self.computes))
        groups: dict[tuple[int, int], list[int]] = {}
        for c in range(start_c, self.computes):
            groups.setdefault(self.passes[c], []).append(c)
        self.rows.append([(x_offset, shift, members, *self._rows(members))
                          for (x_offset, shift), members in groups.items()])
        return len(self.segments) - 1

    def _rows(self, members: list[int]) -> tuple[np.ndarray, int, int]:
        """The rows (m, count) the computes `members` stream, less `low`; low; high."""
        streamed = [self.inputs[c] for c in members]
        if all(type(s) is int for s in streamed):  # each m consecutive rows from its start
            starts = np.array(streamed, np.intp)
            low = int(starts.min())
            rows = np.arange(self.m, dtype=np.intp)[:, None] + (starts - low)
            return rows, low, low + int(rows.max()) + 1
        rows = np.stack([np.arange(s, s + self.m) if type(s) is int else s
                         for s in streamed], axis=1).astype(np.intp)
        low, high = int(rows.min()), int(rows.max()) + 1
        return rows - low, low, high

    def capture(self, state, scratch: dict, segment: int) -> None:
        """Latch the segment's tiles, and add its computes' products to the chain's sum."""
        held = scratch.get(self)
        if held is None:  # the tile latched before the chain: one for all samples, or each's
            entry = state.shared_weights if state.shared_weights is not None else state.weights
            held = scratch[self] = {"entry": entry, "tiles": [], "sum": None}
        sp = state.scratchpad
        samples, m = len(sp), self.m
        first_p, end_p, first_c, end_c = self.segments[segment]
        for p in range(first_p, end_p):
            start, k, offset, constant = self.preloads[p]
            if not constant:
                held["tiles"].append(numerics.centre(sp[:, start:start + k], offset))
                continue
            # Rows only constant LOADs wrote: the same tile for every sample and every batch.
            tile = self.constant_tiles.get(p)
            if tile is None:
                tile = self.constant_tiles[p] = numerics.centre(sp[0, start:start + k], offset)
            held["tiles"].append(tile)
        for group, (x_offset, shift, members, rows, low, high) in \
                enumerate(self.rows[segment]):
            # The rows' span once in float32 (each row is streamed by several passes: the
            # taps), then the passes' rows gathered from it: (samples, m, passes, k).
            region = _buffer(scratch, "region", (samples, high - low, self.k))
            np.copyto(region, sp[:, low:high, :self.k])
            if x_offset:
                region -= x_offset
            x = _buffer(scratch, "x", (samples, *rows.shape, self.k))
            np.take(region, rows, axis=1, out=x)
            x = x.reshape(samples, m, -1)
            weights = self._weights(held, segment, group, members)
            if weights.ndim == 3:  # each sample its own tiles (a MatMul of activations)
                part = numerics.array_pass(None, x, weights, shift)
            else:  # one product of (samples x m) rows
                part = array_unit.shared_product(x.reshape(samples * m, -1), weights,
                                                 min_rows=_PIECE_ROWS, shift=shift
                                                 ).reshape(samples, m, self.n)
            held["sum"] = part if held["sum"] is None else \
                np.add(held["sum"], part, dtype=np.int32)  # wrapping, as the accumulator

    def _weights(self, held: dict, segment: int, group: int, members: list[int]) -> np.ndarray:
        """The weight rows of the computes `members` (group `group` of the segment), (count
        k, n) when every sample has the same, else (samples, count k, n). Tiles of constant
        rows come from the DRAM image, the same in every batch: their rows are made once
        (`constant_weights`)."""
        cached = self.constant_weights.get((segment, group))
        if cached is not None:
            return cached
        tiles = [self.tile_of[c] for c in members]
        parts = [(held["entry"] if t < 0 else held["tiles"][t])[..., :self.k, :self.n]
                 for t in tiles]
        if all(part.ndim == 2 for part in parts):
            weights = np.concatenate(parts, axis=0).astype(np.float32)
            if all(t >= 0 and self.preloads[t][3] for t in tiles):
                self.constant_weights[(segment, group)] = weights
            return weights
        samples = max(len(part) for part in parts if part.ndim == 3)
        weights = np.concatenate([np.broadcast_to(part, (samples, *part.shape[-2:]))
                                  for part in parts], axis=1)
        one = shared(weights)
        return weights if one is None else one

    def finish(self, state, scratch: dict, segment: int | None) -> None:
        """The last capture, then the sum into the accumulator rows; the array keeps the last
        tile latched."""
        if segment is not None:
            self.capture(state, scratch, segment)
        held = scratch.pop(self, None)
        if held is None:
            return
        if held["sum"] is not None:
            out = state.accumulator[:, self.acc:self.acc + self.m, :self.n]
            if self.accumulate:
                np.add(out, held["sum"], out=out, dtype=np.int32)
            else:
                out[...] = held["sum"]
        if held["tiles"]:
            tile = held["tiles"][-1]
            if tile.ndim == 2:  # the samples' one tile (`State.shared_weights`)
                state.weights, state.shared_weights = None, tile
            else:
                state.weights, state.shared_weights = tile, shared(tile)


def _buffer(scratch: dict, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array of `shape` in a buffer kept across steps and batches (`scratch`'s
    "buffers"): a fresh array this large would be new pages, faulted in on every write."""
    buffers = scratch.setdefault("buffers", {})
    size = int(np.prod(shape))
    buffer = buffers.get(name)
    if buffer is None or buffer.size < size:
        buffer = buffers[name] = np.empty(size, np.float32)
    return buffer[:size].reshape(shape)


class Capture:
    """Plan step: capture a chain's segment of members (`Chain.capture`)."""

    __slots__ = ("chain", "segment")

    def __init__(self, chain: Chain, segment: int):
        self.chain, self.segment = chain, segment

    @property
    def index(self) -> int:
        """The chain's first instruction, for messages."""
        return self.chain.members[0]

    def run(self, state, scratch: dict) -> None:
        self.chain.capture(state, scratch, self.segment)


class Finish(Capture):
    """Plan step: the chain's last capture and its product (`Chain.finish`)."""

    __slots__ = ()

    def run(self, state, scratch: dict) -> None:
        self.chain.finish(state, scratch, self.segment)


class _Spans:
    """Row intervals per memory, merged as they are added, for the overlap test."""

    def __init__(self):
        self.spans: dict[int, list[list[int]]] = {}

    def add(self, mem: int, start: int, stop: int) -> None:
        if start >= stop:
            return
        spans = self.spans.setdefault(mem, [])
        for span in spans:
            if start <= span[1] and span[0] <= stop:  # overlapping or touching: merge
                span[0], span[1] = min(span[0], start), max(span[1], stop)
                return
        spans.append([start, stop])

    def overlaps(self, mem: int, start: int, stop: int) -> bool:
        return any(start < hi and lo < stop for lo, hi in self.spans.get(mem, ()))


def build(program: Program, order: list[int], constant_loads: set[int] = frozenset(),
          accesses: list | None = None) -> list:
    """The plan: each step an instruction index, a `Capture`, a `Finish` or a `ConstantLoad`
    (the LOADs in `constant_loads`, `dram_sharing`), in an order whose effects equal those of
    running `order`'s instructions one by one. `accesses`: each instruction's
    `InsnDef.access`, when already known."""
    insns, arch = program.instructions, program.arch
    known = accesses
    steps: list = []
    chain = Chain()
    pending = _Spans()  # the rows read by members not yet captured
    uncaptured: list[int] = []  # those members, PRELOADs first moved on at a split
    latched_k = None  # rows of the tile the array holds when the open chain began
    # Whether each scratchpad row was last written by a constant LOAD: the same in every
    # sample, and in every batch (`ConstantLoad`).
    constant_rows = np.zeros(arch.scratchpad.rows, bool)

    def close() -> None:
        """End the open chain (its Finish step) and begin another."""
        nonlocal chain, pending, uncaptured, latched_k
        if chain.members:
            steps.append(Finish(chain, chain.cut()))
            if chain.preloads:
                latched_k = chain.preloads[-1][1]
        chain, pending, uncaptured = Chain(), _Spans(), []

    def add_preload(i: int) -> None:
        a = insns[i].args
        chain.members.append(i)
        chain.preloads.append((a["sp"], a["k"], a["w_offset"],
                               bool(constant_rows[a["sp"]:a["sp"] + a["k"]].all())))
        pending.add(SCRATCHPAD, a["sp"], a["sp"] + a["k"])
        uncaptured.append(i)

    for i in order:
        insn = insns[i]
        op = insn.op
        if op is isa.PRELOAD:
            if not _preload_fits(arch, insn):
                close()
                steps.append(i)  # it runs alone: the unit reports what is wrong with it
                latched_k = None
                continue
            add_preload(i)
            continue
        if op is isa.COMPUTE:
            a = insn.args
            if not _compute_fits(arch, insn):
                close()
                steps.append(i)
                continue
            if chain.computes and not _continues(chain, a):
                # PRELOADs since the last capture that follow the chain's last COMPUTE belong
                # to the next chain: they latch its tiles.
                moved = [(chain.members.pop(), chain.preloads.pop())
                         for _ in _trailing_preloads(chain, insns)][::-1]
                close()
                for p, preload in moved:
                    chain.members.append(p)
                    chain.preloads.append(preload)
                    pending.add(SCRATCHPAD, preload[0], preload[0] + preload[1])
                    uncaptured.append(p)
            tile = len(chain.preloads) - 1
            k_have = chain.preloads[-1][1] if chain.preloads else latched_k
            if k_have is None or k_have < a["k"]:
                close()
                steps.append(i)  # its tile is missing or too small: the unit says so
                continue
            if not chain.computes:
                chain.acc, chain.m, chain.n, chain.k = a["acc"], _m(a), a["n"], a["k"]
                chain.accumulate = bool(a["accumulate"])
            chain.members.append(i)
            chain.passes.append((a["x_offset"], a["shift"]))
            streamed = array_unit.input_rows(a)  # consecutive rows: their first, for `cut`
            chain.inputs.append(streamed.start if isinstance(streamed, slice) else streamed)
            chain.tile_of.append(tile)
            pending.add(SCRATCHPAD, a["sp"], array_unit._last_row(a) + 1)
            uncaptured.append(i)
            continue
        if op is isa.SYNC and insn.queue == "compute":
            continue  # no effect, and nothing on the array moves past it
        accesses = known[i] if known is not None else op.access(arch, insn)
        if chain.computes and any(mem == ACCUMULATOR and start < chain.acc + chain.m and
                                  chain.acc < stop for mem, start, stop, _ in accesses):
            close()  # it reads or writes the chain's results
        elif uncaptured and any(write and pending.overlaps(mem, start, stop)
                                for mem, start, stop, write in accesses):
            steps.append(Capture(chain, chain.cut()))  # it overwrites what they read
            pending, uncaptured = _Spans(), []
        steps.append(ConstantLoad(i, insn, accesses[0]) if i in constant_loads and accesses
                     else i)
        for mem, start, stop, write in accesses:
            if write and mem == SCRATCHPAD:
                constant_rows[start:stop] = i in constant_loads
    close()
    return steps


def _trailing_preloads(chain: Chain, insns) -> list[int]:
    """The PRELOAD members after the chain's last COMPUTE that are not yet captured."""
    captured_p = chain.segments[-1][1] if chain.segments else 0
    trailing = []
    for i in reversed(chain.members):
        if insns[i].op is not isa.PRELOAD or len(chain.preloads) - len(trailing) <= captured_p:
            break
        trailing.append(i)
    return trailing[::-1]


def _m(a: dict) -> int:
    return a["m_outer"] * a["m_inner"]


def _continues(chain: Chain, a: dict) -> bool:
    """Whether a COMPUTE continues the chain: it accumulates into the same rows, with the same
    k and n (its x_offset and shift may differ: `Chain`)."""
    return bool(a["accumulate"]) and a["acc"] == chain.acc and _m(a) == chain.m and \
        a["k"] == chain.k and a["n"] == chain.n


def _preload_fits(arch, insn) -> bool:
    a = insn.args
    return a["k"] <= arch.array.rows and a["sp"] + a["k"] <= arch.scratchpad.rows


def _compute_fits(arch, insn) -> bool:
    """Whether every row a COMPUTE streams and writes is in range, and it streams some."""
    a = insn.args
    m = _m(a)
    return m > 0 and a["n"] <= arch.array.cols and a["k"] <= arch.array.rows and \
        array_unit._last_row(a) < arch.scratchpad.rows and \
        a["acc"] + m <= arch.accumulator.rows


class ConstantLoad:
    """Plan step: a LOAD of bytes no instruction writes (weights, parameter blocks, tables):
    the same for every sample, so it runs once, from the shared DRAM image, for sample 0,
    and its rows are copied to the other samples."""

    __slots__ = ("index", "insn", "mem", "start", "stop")

    def __init__(self, index: int, insn, access):
        self.index, self.insn = index, insn
        self.mem, self.start, self.stop = access.mem, access.start, access.stop

    def run(self, state, scratch: dict) -> None:
        view = scratch.get("image view")
        if view is None:  # sample 0's memories, the shared image as its DRAM
            view = scratch["image view"] = state.image_view()
        self.insn.op.run(view, self.insn)
        memory = state.memories[self.mem]
        if len(memory) > 1:
            memory[1:, self.start:self.stop] = memory[0, self.start:self.stop]


class _Intervals:
    """Sorted, merged byte intervals [lo, hi) of DRAM."""

    def __init__(self, spans):
        merged: list[list[int]] = []
        for lo, hi in sorted(span for span in spans if span[0] < span[1]):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.spans = merged
        self.starts = [lo for lo, _ in merged]

    def overlaps(self, lo: int, hi: int) -> bool:
        k = bisect.bisect_right(self.starts, lo) - 1
        for span in self.spans[max(k, 0):]:
            if span[0] >= hi:
                return False
            if span[1] > lo:
                return True
        return False

    def total(self) -> int:
        return sum(hi - lo for lo, hi in self.spans)


def dram_sharing(program: Program, segments: tuple, extent: int
                 ) -> tuple[set[int], list[tuple[int, int]], int]:
    """What of DRAM the samples of a batch can share: (the LOADs that read only bytes no
    instruction writes and no input holds, which run once for all samples from the shared
    image; the image's byte ranges that other readers may see, which each sample needs a copy
    of; the bytes each sample touches beyond the shared image)."""
    arch, insns = program.arch, program.instructions

    def binding_span(b) -> tuple[int, int]:
        return b.span()

    written, readers = [binding_span(b) for b in program.inputs], []
    readers += [binding_span(b) for b in program.outputs]
    for _, inputs, outputs in segments:
        readers += [binding_span(b) for b in inputs]
        written += [binding_span(b) for b in outputs]
    loads = []
    for i, insn in enumerate(insns):
        if insn.op.dram is None:
            continue
        spans = insn.op.dram(arch, insn)
        if insn.op is isa.STORE:
            written += spans
        elif insn.op is isa.GATHER:
            readers += spans[:2]
            written += spans[2:]
        elif insn.op is isa.LOAD:
            loads.append((i, spans[0]))
    mutable = _Intervals(written)
    constant = set()
    for i, span in loads:
        if mutable.overlaps(*span):
            readers.append(span)
        else:
            constant.add(i)
    image = len(program.dram_image)
    private = _Intervals((lo, min(hi, image)) for lo, hi in readers if lo < image)
    touched = _Intervals([*private.spans, *mutable.spans])
    return constant, [tuple(span) for span in private.spans], min(touched.total(), extent)


def chain_bytes(steps: list) -> int:
    """The rows a typical capture gathers per sample, in bytes (the 90th percentile over the
    plan's captures; 0 without any): what a batch multiplies, and the caches must hold."""
    sizes = sorted(4 * step.chain.k * sum(group[3].size for group in
                                          step.chain.rows[step.segment])
                   for step in steps if isinstance(step, Capture) and step.segment is not None
                   and step.chain.rows[step.segment])
    return sizes[int(0.9 * (len(sizes) - 1))] if sizes else 0
