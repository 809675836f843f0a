"""The instruction set: one table (`TABLE`) from which encoding, decoding, the assembler, the
disassembler, the machine's dispatch and its timing all derive. This docstring is the contract a
code generator needs; `simulator.machine` adds the timing rules.

**Word.** Every instruction is one 256-bit little-endian word. Bits [0, 5) hold the opcode,
bits 5-8 the dependency flags pop_prev, pop_next, push_prev, push_next (as VTA), and the row's
fields follow packed LSB-first in table order. Signed fields are two's complement. Build
instructions through the rows, e.g. `isa.LOAD(mem="scratchpad", sram=0, ..., push_next=True)`;
a value too wide for its field raises SimulatorError naming the instruction, field and range.

**Memory model.** DRAM is byte addressed (`dram` and every stride count bytes); the program's
DRAM image is placed at address 0 and the I/O tensors at their bindings. The local memories are
row addressed (`sram`, `sp`, `acc`, `src`, `dst`, `param`, `table` count rows). A row has
L = `arch.lanes` (= array columns) lanes: int8 in the scratchpad, int32 in the accumulator. Lane
j of a row is channel j of a channel block: a feature-map tile is stored one pixel per row,
row-major (pixel (y, x) of an H x W tile at row base + y * W + x), one region per channel block.

**Queues and tokens.** Instructions are dispatched in program order to four in-order queues,
chained load -> compute -> vector -> store; "prev"/"next" name the neighbouring queue in that
chain (LOAD, STORE, HOST, PRELOAD/COMPUTE and the vector instructions have fixed queues; SYNC names
its own). Each adjacent pair has two token FIFOs, one per direction, of depth
`arch.queues.token_depth`. An instruction starts only after popping one token from each queue
its pop flags name, and pushes one token to each queue its push flags name when it ends. Use
"next" tokens for read-after-write (the data you read is ready) and "prev" tokens for
write-after-read (the buffer you overwrite is free; double buffering starts with two free
buffers, so the first two writers pop nothing). SYNC is a no-op that relays a token across a
queue, e.g. load -> vector through compute. Every pushed token must be popped before END; a pop
that can never be satisfied is an error (see `simulator.machine`). So is an access to a local row
that conflicts with another queue's access (write/write, write/read, read/write) without a chain
of tokens ordering the two, even when the timing would have hidden it (`simulator.hazards`).
DRAM accesses are not checked: order a STORE before a LOAD of the same bytes with tokens relayed
store -> vector -> compute -> load.

**Instructions** (`mem` is "scratchpad" or "accumulator"; rows are local rows):

- LOAD: DRAM -> local. Reads y_size lines of x_size elements of elem_bytes bytes (element stride
  x_stride, line stride y_stride; stride 0 repeats, e.g. a bias broadcast to every row) into a
  block of (pad_top + y_size + pad_bottom) x (pad_left + x_size + pad_right) consecutive rows
  from `sram`: element (l, e) goes to row sram + (pad_top + l) * width + pad_left + e, its bytes
  to the row's first elem_bytes bytes (little-endian int32 in the accumulator). Pad rows and the
  lanes past elem_bytes are set to pad_value (the zero point for a convolution, -128 for
  max-pooling, the pad value's code for a Pad, lowered as a 1x1 MAXPOOL). elem_bytes must be
  a multiple of the lane size and at most a row. With transpose=1 (the scratchpad, elem_bytes
  1, no pads) the block is turned: element (l, e) goes to lane l of row sram + e, for y_size <= L
  lines, and lanes [y_size, L) of the x_size rows are set to pad_value. It reads Kᵀ's stationary
  tile from K stored [S, Dh] (a line per key, its Dh bytes a run); it costs what the same LOAD
  without transpose costs (the corner turn is a buffer of L x L bytes the bursts fill).
- STORE: local -> DRAM, the same addressing without pads: row sram + l * x_size + e goes to
  dram + l * y_stride + e * x_stride.
- PRELOAD: the array latches scratchpad rows [sp, sp + k) as the k x L weight tile W
  (k <= array rows; row r of W holds the weights of input channel r for the L output channels),
  minus w_offset: W = rows - w_offset, int9 (`numerics.centre`; 0 for constant weights, whose
  activations' zero points fold into the bias; an activation's zero point when the tile is an
  activation, the second operand of a MatMul of two activations).
- COMPUTE: for o < m_outer, i < m_inner, the input row X = scratchpad row
  sp + o * outer_stride + i * inner_stride (its first k lanes) passes through the array, and
  (X[:k] - x_offset) @ W[:k, :n] goes to lanes [0, n) of accumulator row acc + o * m_inner + i,
  replacing it or, with accumulate=1, adding to it (int32, wrapping; int9 x int9 products, exact
  as `numerics.int_matmul`). With shift=s the pass's product is multiplied by 2^s (wrapping)
  before it replaces or is added (`numerics.array_pass`): an int16 activation (`split_wide`)
  streams as two passes through the same tile into the same rows, its high plane with shift=8,
  its low plane with x_offset=-128 (the plane holds low byte - 128), each pass costing its
  own cycles; an int16 weight (`numerics.split_weight`) is two tiles, each PRELOADed and
  streamed in its own pass, its high part's with shift=7 and its low part's with shift=0;
  an int16 activation through int16 weights is four passes, the shifts added
  (`numerics.wide_passes`: 15, 7, 8 and 0); a MatMul of two int16 activations is four passes
  too, the stationary operand's planes PRELOADed with w_offset 0 and -128 as the streamed
  one's are with x_offset (`numerics.activation_passes`: 16, 8, 8 and 0).
  The strides let one COMPUTE apply one kernel tap of a strided convolution to a whole
  output tile. k <= the preloaded k, n <= L.
- REQUANT: accumulator rows [acc, acc + rows) -> scratchpad rows [sp, sp + rows) by
  `numerics.requantize` per lane, with the parameter block at `param`, then + out_offset and the
  clamp [qmin, qmax] (qmin = the zero point fuses a ReLU). With bias=1 the parameter block has a
  third row, per-lane int32 biases added (wrapping) to each accumulator row first, so a
  convolution's bias costs no DMA into every accumulator row (its integers are unchanged:
  int32 addition is associative). With wide=1 the result is int16, clamped to [qmin * 256,
  qmax * 256 + 255] (`numerics.wide_clamp`: the defaults are int16's range, qmin=0 a ReLU's,
  a narrower one a b-bit tensor's), written as two planes: high bytes to [sp, sp + rows), low
  bytes to [sp + rows, sp + 2 rows) (`numerics.split_wide`), in twice the cycles.
- ADD: scratchpad rows [a, a + rows) and [b, b + rows) -> [dst, dst + rows) by `numerics.add`
  with offsets a_offset, b_offset, out_offset, lanes 0, 1, 2 of the parameter block as the
  (a, b, out) rescales, and the clamp [qmin, qmax]. With op=max (op=min) the larger (smaller)
  of the two rescaled operands takes the sum's place (`numerics.extremum`: Max, Min, and Clip
  by bounds computed at run time); with op=hypot, sqrt((a - a_offset)^2 + (b - b_offset)^2)
  requantized by lane 2 (`numerics.hypot`: a spectrum's magnitude, its operands in one scale).
  The b rows are [b, b + rows), or the one row b for every row with b_once=1; with b_splat=1,
  lane 0 of each b row stands for every lane (as MUL's). With wide=1 (op add or hypot) the sum
  or magnitude is int16, clamped to [qmin * 256, qmax * 256 + 255] (`numerics.wide_clamp`, as
  REQUANT's), written as two planes (`numerics.split_wide`): the high bytes to [dst, dst +
  rows), the low bytes to [dst + rows, dst + 2 rows); it takes twice the cycles (a residual
  stream a LAYERNORM, an Add or the array reads; a spectrum's magnitude).
  With a_wide=1 (b_wide=1) operand a (b) is int16: its high plane's rows at a (b), its low
  plane's right after them; an add's sum then rounds once (`numerics.wide_add`: lanes 0
  and 1 the operands' multipliers at lane 2's shift, no alignment); op add or hypot only, and
  each wide operand takes one more pass.
- MUL: scratchpad rows [a, a + rows) times the b rows -> [dst, dst + rows) by `numerics.mul`
  with offsets a_offset, b_offset, out_offset, lane 0 of the parameter block as the rescale
  (s_a s_b / s_out), and the clamp [qmin, qmax]. The b rows are [b, b + rows) with b_step=1,
  or the one row b for every row with b_step=0 (a squeeze-and-excitation gate: one value per
  channel for all the pixels of a tile); with b_splat=1, lane 0 of each b row stands for every
  lane (one value per pixel, or per image with b_step=0, for all channels). With a_wide=1
  (b_wide=1) operand a (b) is int16 (a squeeze-and-excitation block's map or gate): its high
  plane's rows at a (b), its low plane's right after them (after the one gate row with
  b_step=0); with wide=1 the product is int16, clamped to [qmin * 256, qmax * 256 + 255]
  (`numerics.wide_clamp`, as REQUANT's) and written as two planes, high at dst, low after. The
  product of the whole codes is exact in int64 (`numerics.mul`); the lanes' 8 x 8 multipliers
  take one pass per pair of operand planes (four for int16 x int16) and a wide result one more
  (`vector.mul_cycles`).
- MAXPOOL: the in_h x in_w pixel rows at src (already padded) -> the out_h x out_w pixel rows at
  dst, out = (in - k) // s + 1, max over each kh x kw window with strides sh, sw, per lane
  (`numerics.window_max`). With wide=1 the codes are int16, in and out: the input's high
  plane's in_h x in_w rows at src and its low plane's right after them, the output's high
  plane's rows at dst and its low plane's after them (`numerics.split_wide`); the max
  compares whole values (`numerics.join_wide`), and reading both planes and writing the
  second costs what the passes over them do (`vector.pool_cycles`).
- AVGPOOL: the same windows; sums (x - in_offset) over each window, then requantizes per lane
  with the parameter block (fold the 1 / window-size divisor into the multipliers), out_offset,
  clamp [qmin, qmax]. With in_wide=1 the input is int16 (two planes, as MAXPOOL's wide); with
  wide=1 the result is int16, clamped to [qmin * 256, qmax * 256 + 255]
  (`numerics.wide_clamp`, as REQUANT's) and written as two planes.
- LUT: rows [src, src + rows) -> [dst, dst + rows), x -> table[x + 128], the 256-entry int8
  table stored in the ceil(256 / L) scratchpad rows from `table`. With per_lane=1 each lane has
  its own table (a channel's: PRelu with a slope per channel), in the 256 rows from `table`:
  lane j of row x + 128 is lane j's entry for x (`numerics.lookup_lanes`). With wide=1 or
  in_wide=1 the entries are 16-bit, stored as two blocks of rows from `table`: their high
  bytes, then their low bytes - 128 (`numerics.split_wide`), each block ceil(E / L) rows for
  E entries (`lut_table_rows`). wide=1 alone: E = 256 int16 codes, x -> table[x + 128]
  (`numerics.lookup_wide`), an int16 output written as two planes, the high bytes to
  [dst, dst + rows), the low bytes to [dst + rows, dst + 2 rows). in_wide=1: the input is
  int16, its high plane at [src, src + rows) and its low plane at [src + rows, src + 2 rows);
  E = 257 knots (`numerics.KNOTS`), entry k the function at code (k - 128) * 256, indexed by
  the high byte and weighed by the low byte (`numerics.interpolate`); the output is int8
  (the entries in Q7 of its codes) or, with wide=1 too, int16 (the entries its codes), two
  planes as above. With zoom=z (1..8, in_wide only) a window of 257 finer knots follows
  the coarse ones, 2^(8 - z) codes apart from code `origin`: a code inside [origin, origin +
  256 * 2^(8 - z)) interpolates between them, its low 8 - z bits weighing them
  (`numerics.interpolate`); the compiler puts the window where the function bends
  (`int8.knot_window`). Each of the int16 output's second plane, the int16 input's low plane and
  its second knot takes one more pass (`vector.lut_cycles`: int8 -> int16 two, int16 -> int8
  three, int16 -> int16 four). With per_lane=1 too, each lane has its own 16-bit entries, one
  row an entry in each block (a ChannelMap's knots per channel).
- SOFTMAX: for each r < rows, a row of C = (blocks - 1) * L + n int8 channels: lanes [0, L)
  of scratchpad rows src + b * stride + r for channel blocks b < blocks - 1 and lanes [0, n) of
  row src + (blocks - 1) * stride + r (the layout's one region per channel block; stride 0 with
  blocks = 1) -> the same lanes of the rows at dst, by `numerics.softmax` (+ out_offset, the
  output of scale 2^-8) or with log=1 `numerics.log_softmax` (in the input's scale, logarithm
  fraction bits `shift`). The table is int32 in the accumulator, flat in rows of L from
  `table`: the 256 exp entries (entry d for a code d below the row's maximum), and with log=1
  the 257 log-mantissa entries after them (`softmax_table_rows`); load it with a LOAD. Other
  lanes are left as they are. With wide=1 (softmax only) the input is int16, its low plane's
  `blocks` after the high plane's (as LAYERNORM's), and the table is 512 entries: exp by the
  distance's high byte, then by its low byte, multiplied (`numerics.wide_exps`); the first two
  passes read both planes and the second multiplies (five in all). With out_wide=1 the output
  is int16 codes of scale 2^-(8 + fine_bits) from out_offset 0, written as LAYERNORM's two planes
  (the last pass writes both: one more).
- LAYERNORM: rows of C = (blocks - 1) * L + n int8 channels addressed as SOFTMAX's (src, dst,
  rows, n, blocks, stride) -> the same lanes at dst, by `numerics.layer_norm`: integer mean and
  variance of each row, an integer square root, the normalized value in Q16 rescaled per
  channel, + out_offset. Its parameters are int32 in the accumulator, flat in rows of L from
  `table`: the epsilon term, then C multipliers, C shifts and C biases
  (`layernorm_table_rows`); load them with a LOAD. It takes three passes over the row's
  channel blocks and a root step per row. With wide=1 the input is int16: the high plane's
  blocks as above, the low plane's `blocks` more after them (block b at src + (blocks + b) *
  stride, `numerics.join_wide`), and the first two passes read both (five in all). With
  out_wide=1 the output is int16 (the clamp its range; out_offset 0), written as two planes:
  the high plane's blocks at dst as above, the low plane's `blocks` more after them
  (`numerics.split_wide`), and the last pass writes both (one more).
- REDUCE: for each r < rows, a row of C channels addressed as SOFTMAX's (src, rows, n,
  blocks, stride) -> one int8 value in lane 0 of scratchpad row dst + r (other lanes left as
  they are), by `numerics.reduce_rows`: with op=max (op=min) the row's largest (smallest) code,
  in the input's scale; with op=l2 the root of the sum of (x - in_offset)^2 in Q8, requantized
  by the int32 multiplier and shift at accumulator row `table` (lanes 0, 1), + out_offset. It
  takes one pass over the channel blocks, and with l2 a root step per row.
- GATHER: the indexed DMA, DRAM -> DRAM, on the load queue (an embedding lookup): reads `count`
  little-endian int32 indices from `index` and, for i < count, copies the row_bytes bytes of
  table row k (at table + k * table_stride) to dst + i * dst_stride, where k is index i, or
  index i + rows for a negative one (`numerics.gather_index`). An index outside [-rows, rows)
  is an error naming it (the machine names the input binding it came from), and nothing moves.
  It takes two DMA latencies (the rows' addresses wait for the indices) and the transfer: the
  indices' run, then each row's read and its write, each a run in bursts, on the DRAM port.
  Order it as a LOAD of its indices and a STORE of its rows: after the STOREs that write the
  indices, before the LOADs of its rows (the load queue is in order).
- SYNC: does nothing on queue `queue`; it carries dependency flags.
- HOST: runs host segment `segment` (an index into the program's `host_segments`) on the host
  CPU, on the store queue: reads each of the segment's input bindings from DRAM, calls the host
  runner given to `machine.run`, checks the returned arrays against the output bindings and
  writes them to DRAM (`simulator.units.host`). It takes dma latency + ceil((read_bytes +
  write_bytes) / dma bytes_per_cycle) + compute_cycles, the transfer on the shared DRAM port;
  compute_cycles is the compiler's price of the segment (`Arch.host_cycles`). Order it after the
  STOREs that write its inputs (same queue, in order) and before the LOADs of its outputs with
  tokens relayed store -> vector -> compute -> load, as for any STORE.
- END: the end of the program; exactly one, last.

A **parameter block** (`ParamBlock`, which packs and unpacks it) is two accumulator rows at
`param`: per-lane Q31 multipliers, then per-lane shifts (`numerics.quantize_multiplier`), and for
REQUANT with bias=1 a third row of per-lane int32 biases; every lane read must hold a shift in
[-31, 31]. Load it with a LOAD into the accumulator.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

from simulator import numerics
from simulator.errors import SimulatorError
from simulator.units import MEMORIES, Work, array, dma, host, vector

WORD_BITS = 256
WORD_BYTES = WORD_BITS // 8
OPCODE_BITS = 5
QUEUES = ("load", "compute", "vector", "store")
DEPS = ("pop_prev", "pop_next", "push_prev", "push_next")
POP_PREV, POP_NEXT, PUSH_PREV, PUSH_NEXT = 1, 2, 4, 8
_HEADER_BITS = OPCODE_BITS + len(DEPS)


@dataclass(frozen=True)
class F:
    """One field: its width, whether it is two's complement, names for its values, a default."""

    name: str
    bits: int
    signed: bool = False
    names: tuple[str, ...] = ()
    default: int | None = None

    @property
    def range(self) -> tuple[int, int]:
        if self.signed:
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1


@dataclass(frozen=True)
class Insn:
    """One decoded instruction: its table row, field values (ints) and dependency flags."""

    op: "InsnDef"
    args: dict
    deps: int = 0

    @property
    def queue(self) -> str:
        return QUEUES[self.args["queue"]] if self.op.queue == "field" else self.op.queue

    def __str__(self) -> str:
        return disassemble(self)


def _noop(state, insn) -> None:
    return None


def _free(arch, insn) -> int:
    return 0


def _no_work(arch, insn) -> Work:
    return Work()


def _no_access(arch, insn) -> tuple:
    return ()


@dataclass(frozen=True, eq=False)
class InsnDef:
    """A row of the table. `run(state, insn)` changes machine state; `cycles(arch, insn)`,
    `work(arch, insn)` and `access(arch, insn)` (the local rows it reads and writes) are pure
    functions of the fields, shared by the machine, its hazard check and the report. Rows compare
    by identity: there is one of each."""

    mnemonic: str
    opcode: int
    queue: str  # one of QUEUES, "field" (SYNC: taken from the `queue` field) or "end"
    fields: tuple[F, ...]
    run: Callable = _noop
    cycles: Callable = _free
    work: Callable = _no_work
    access: Callable = _no_access
    # Cycles after the unit is free again until the results are visible (tokens pushed): a
    # pipelined unit's drain. 0 for all but COMPUTE on a weight-stationary array with
    # preload_overlap (`simulator.units.array`).
    latency: Callable = _free
    # Cycles it holds the one DRAM port, which LOAD, STORE and HOST share (after the DMA
    # latency, within `cycles`); None for an instruction that does not use the port.
    transfer: Callable | None = None
    # `min_cycles(arch, count, nbytes)`: a lower bound of the cycles `count` such instructions
    # moving `nbytes` take, for a planner (the tiler's cost model); None where it has no use.
    min_cycles: Callable | None = None
    # `dram(arch, insn)`: the DRAM byte spans [lo, hi) it reads or writes, from its fields (a
    # batch's DRAM holds the program's extent, `machine.dram_extent`); None: it touches none.
    dram: Callable | None = None
    # Entries of the lookup table the instruction reads from the scratchpad (LUT: one int8
    # entry per int8 code; its int16 forms' in `lut_entries`); 0 for an instruction that reads
    # none.
    table_entries: int = 0

    def field(self, name: str) -> F:
        """The row's field `name`: the compiler and the arch check ask it for their limits."""
        for f in self.fields:
            if f.name == name:
                return f
        raise SimulatorError(f"{self.mnemonic}: no field {name!r}; fields are "
                             f"{', '.join(f.name for f in self.fields)}")

    def __call__(self, *, pop_prev=False, pop_next=False, push_prev=False, push_next=False,
                 **values) -> Insn:
        """Build an instruction, checking every field; missing fields take their defaults."""
        unknown = set(values) - {f.name for f in self.fields}
        if unknown:
            raise SimulatorError(f"{self.mnemonic}: unknown field {sorted(unknown)[0]!r}; fields "
                                 f"are {', '.join(f.name for f in self.fields)}")
        args = {}
        for f in self.fields:
            value = values.get(f.name, f.default)
            if value is None:
                raise SimulatorError(f"{self.mnemonic}: missing field {f.name!r}")
            args[f.name] = _check(self.mnemonic, f, value)
        deps = (POP_PREV * bool(pop_prev) | POP_NEXT * bool(pop_next)
                | PUSH_PREV * bool(push_prev) | PUSH_NEXT * bool(push_next))
        insn = Insn(self, args, deps)
        _check_deps(insn)
        return insn


def _check(mnemonic: str, f: F, value) -> int:
    lo, hi = f.range
    if isinstance(value, str):
        if value in f.names:
            return f.names.index(value)
        expected = f"one of {', '.join(f.names)}" if f.names else f"an integer in [{lo}, {hi}]"
        raise SimulatorError(f"{mnemonic}: field {f.name} = {value!r}: expected {expected}")
    try:
        value = operator.index(value)
    except TypeError:
        raise SimulatorError(f"{mnemonic}: field {f.name} = {value!r}: expected an integer in "
                             f"[{lo}, {hi}]") from None
    if not lo <= value <= hi:
        raise SimulatorError(f"{mnemonic}: field {f.name} = {value} does not fit in {f.bits} "
                             f"bits: expected an integer in [{lo}, {hi}]")
    if f.names and value >= len(f.names):
        raise SimulatorError(f"{mnemonic}: field {f.name} = {value}: expected one of "
                             f"{', '.join(f.names)} (0 to {len(f.names) - 1})")
    return value


def _check_deps(insn: Insn) -> None:
    queue = insn.queue
    if queue == "end":
        if insn.deps:
            raise SimulatorError("END: takes no dependency flags")
        return
    index = QUEUES.index(queue)
    for bit, name in ((POP_PREV, "pop_prev"), (PUSH_PREV, "push_prev")):
        if insn.deps & bit and index == 0:
            raise SimulatorError(f"{insn.op.mnemonic}: {name} on the {queue} queue, which has no "
                                 f"previous queue")
    for bit, name in ((POP_NEXT, "pop_next"), (PUSH_NEXT, "push_next")):
        if insn.deps & bit and index == len(QUEUES) - 1:
            raise SimulatorError(f"{insn.op.mnemonic}: {name} on the {queue} queue, which has no "
                                 f"next queue")


_MEM = F("mem", 2, names=MEMORIES)
ParamBlock = vector.ParamBlock  # what REQUANT, ADD, MUL and AVGPOOL read at `param`
lut_table_rows = vector.lut_table_rows  # the rows a LUT's table takes (per_lane, 16-bit or not)
lut_entries = vector.lut_entries  # the entries of a LUT's table (257 knots with in_wide)
softmax_table_rows = vector.softmax_table_rows  # the accumulator rows a SOFTMAX's table takes
layernorm_table_rows = vector.layernorm_table_rows  # likewise a LAYERNORM's parameters
_ROW = 20  # local row addresses: up to 2^20 rows per memory
_STRIDED = (F("dram", 32), F("y_size", 16), F("x_size", 16), F("elem_bytes", 16),
            F("x_stride", 24), F("y_stride", 32))
_CLAMP = (F("out_offset", 8, signed=True, default=0), F("qmin", 8, signed=True, default=-128),
          F("qmax", 8, signed=True, default=127))
_WINDOW = (F("src", _ROW), F("dst", _ROW), F("in_h", 16), F("in_w", 16), F("kh", 8), F("kw", 8),
           F("sh", 8, default=1), F("sw", 8, default=1))

LOAD = InsnDef("LOAD", 0x01, "load",
               (_MEM, F("sram", _ROW), *_STRIDED,
                F("pad_top", 8, default=0), F("pad_bottom", 8, default=0),
                F("pad_left", 8, default=0), F("pad_right", 8, default=0),
                F("pad_value", 8, signed=True, default=0), F("transpose", 1, default=0)),
               run=dma.load, cycles=dma.cycles, work=dma.load_work, access=dma.load_access,
               transfer=dma.transfer_cycles, min_cycles=dma.min_cycles, dram=dma.dram_spans)
STORE = InsnDef("STORE", 0x02, "store", (_MEM, F("sram", _ROW), *_STRIDED),
                run=dma.store, cycles=dma.cycles, work=dma.store_work,
                access=dma.store_access, transfer=dma.transfer_cycles, min_cycles=dma.min_cycles,
                dram=dma.dram_spans)
PRELOAD = InsnDef("PRELOAD", 0x03, "compute",
                  (F("sp", _ROW), F("k", 16), F("w_offset", 8, signed=True, default=0)),
                  run=array.preload, cycles=array.preload_cycles, work=array.preload_work,
                  access=array.preload_access)
COMPUTE = InsnDef("COMPUTE", 0x04, "compute",
                  (F("sp", _ROW), F("acc", _ROW), F("m_outer", 16, default=1), F("m_inner", 16),
                   F("outer_stride", _ROW, default=0), F("inner_stride", 8, default=1),
                   F("k", 16), F("n", 16), F("accumulate", 1, default=0),
                   F("x_offset", 8, signed=True, default=0),
                   F("shift", numerics.ARRAY_SHIFT_MAX.bit_length(), default=0)),
                  run=array.compute, cycles=array.compute_cycles, work=array.compute_work,
                  access=array.compute_access, latency=array.compute_latency)
REQUANT = InsnDef("REQUANT", 0x05, "vector",
                  (F("acc", _ROW), F("sp", _ROW), F("rows", 16), F("param", _ROW), *_CLAMP,
                   F("bias", 1, default=0), F("wide", 1, default=0)),
                  run=vector.requant, cycles=vector.row_cycles, work=vector.requant_work,
                  access=vector.requant_access)
ADD = InsnDef("ADD", 0x06, "vector",
              (F("a", _ROW), F("b", _ROW), F("dst", _ROW), F("rows", 16), F("param", _ROW),
               F("a_offset", 8, signed=True, default=0), F("b_offset", 8, signed=True, default=0),
               *_CLAMP, F("op", 2, names=vector.ADD_OPS, default=0), F("b_once", 1, default=0),
               F("b_splat", 1, default=0), F("wide", 1, default=0), F("a_wide", 1, default=0),
               F("b_wide", 1, default=0)),
              run=vector.add, cycles=vector.row_cycles, work=vector.add_work,
              access=vector.add_access)
MUL = InsnDef("MUL", 0x0C, "vector",
              (F("a", _ROW), F("b", _ROW), F("dst", _ROW), F("rows", 16), F("param", _ROW),
               F("a_offset", 8, signed=True, default=0), F("b_offset", 8, signed=True, default=0),
               *_CLAMP, F("b_step", 1, default=1), F("b_splat", 1, default=0),
               F("wide", 1, default=0), F("a_wide", 1, default=0), F("b_wide", 1, default=0)),
              run=vector.mul, cycles=vector.mul_cycles, work=vector.mul_work,
              access=vector.mul_access)
MAXPOOL = InsnDef("MAXPOOL", 0x07, "vector", (*_WINDOW, F("wide", 1, default=0)),
                  run=vector.maxpool, cycles=vector.pool_cycles, work=vector.pool_work,
                  access=vector.pool_access)
AVGPOOL = InsnDef("AVGPOOL", 0x08, "vector",
                  (*_WINDOW, F("param", _ROW), F("in_offset", 8, signed=True, default=0), *_CLAMP,
                   F("in_wide", 1, default=0), F("wide", 1, default=0)),
                  run=vector.avgpool, cycles=vector.pool_cycles, work=vector.pool_work,
                  access=vector.pool_access)
LUT = InsnDef("LUT", 0x09, "vector",
              (F("src", _ROW), F("dst", _ROW), F("rows", 16), F("table", _ROW),
               F("per_lane", 1, default=0), F("wide", 1, default=0),
               F("in_wide", 1, default=0), F("zoom", 4, default=0),
               F("origin", 16, signed=True, default=0)),
              run=vector.lut, cycles=vector.lut_cycles, work=vector.lut_work,
              access=vector.lut_access, table_entries=vector.LUT_ENTRIES)
SOFTMAX = InsnDef("SOFTMAX", 0x0D, "vector",
                  (F("src", _ROW), F("dst", _ROW), F("rows", 16), F("n", 16),
                   F("blocks", 16, default=1), F("stride", _ROW, default=0), F("table", _ROW),
                   F("log", 1, default=0), F("shift", 5, default=0),
                   F("out_offset", 8, signed=True, default=0),
                   F("wide", 1, default=0), F("out_wide", 1, default=0),
                   F("fine_bits", 3, default=0)),
                  run=vector.softmax, cycles=vector.softmax_cycles, work=vector.softmax_work,
                  access=vector.softmax_access)
REDUCE = InsnDef("REDUCE", 0x0F, "vector",
                 (F("src", _ROW), F("dst", _ROW), F("rows", 16), F("n", 16),
                  F("blocks", 16, default=1), F("stride", _ROW, default=0),
                  F("table", _ROW, default=0),
                  F("op", 2, names=vector.REDUCE_OPS, default=0),
                  F("in_offset", 8, signed=True, default=0),
                  F("out_offset", 8, signed=True, default=0)),
                 run=vector.reduce, cycles=vector.reduce_cycles, work=vector.reduce_work,
                 access=vector.reduce_access)
LAYERNORM = InsnDef("LAYERNORM", 0x0E, "vector",
                    (F("src", _ROW), F("dst", _ROW), F("rows", 16), F("n", 16),
                     F("blocks", 16, default=1), F("stride", _ROW, default=0),
                     F("table", _ROW), F("out_offset", 8, signed=True, default=0),
                     F("wide", 1, default=0), F("out_wide", 1, default=0)),
                    run=vector.layernorm, cycles=vector.layernorm_cycles,
                    work=vector.layernorm_work, access=vector.layernorm_access)
GATHER = InsnDef("GATHER", 0x10, "load",
                 (F("index", 32), F("count", 24), F("table", 32), F("rows", 24),
                  F("row_bytes", 16), F("table_stride", 24), F("dst", 32),
                  F("dst_stride", 24)),
                 run=dma.gather, cycles=dma.gather_cycles, work=dma.gather_work,
                 transfer=dma.gather_transfer_cycles, dram=dma.gather_dram_spans)
SYNC = InsnDef("SYNC", 0x0A, "field", (F("queue", 2, names=QUEUES),))
# On the store queue: it reads DRAM that earlier STOREs wrote, and that queue is in order.
HOST = InsnDef("HOST", 0x0B, "store",
               (F("segment", 16), F("compute_cycles", 32), F("read_bytes", 32),
                F("write_bytes", 32)),
               run=host.run, cycles=host.cycles, work=host.work, transfer=host.transfer_cycles)
END = InsnDef("END", 0x1F, "end", ())

TABLE = (LOAD, STORE, PRELOAD, COMPUTE, REQUANT, ADD, MUL, MAXPOOL, AVGPOOL, LUT, SOFTMAX,
         LAYERNORM, REDUCE, GATHER, SYNC,
         HOST, END)
BY_OPCODE = {row.opcode: row for row in TABLE}
BY_MNEMONIC = {row.mnemonic: row for row in TABLE}


def _layout(row: InsnDef) -> tuple[tuple[F, int, int], ...]:
    """(field, bit offset, mask) for each field of a row, LSB-first after the header."""
    out, offset = [], _HEADER_BITS
    for f in row.fields:
        out.append((f, offset, (1 << f.bits) - 1))
        offset += f.bits
    if offset > WORD_BITS:
        raise AssertionError(f"{row.mnemonic} needs {offset} bits, more than {WORD_BITS}")
    return tuple(out)


_LAYOUT = {row.mnemonic: _layout(row) for row in TABLE}


def encode(insn: Insn) -> int:
    word = insn.op.opcode | insn.deps << OPCODE_BITS
    for f, offset, mask in _LAYOUT[insn.op.mnemonic]:
        word |= (insn.args[f.name] & mask) << offset
    return word


def decode(word: int) -> Insn:
    row = BY_OPCODE.get(word & ((1 << OPCODE_BITS) - 1))
    if row is None:
        raise SimulatorError(f"unknown opcode {word & ((1 << OPCODE_BITS) - 1):#x}")
    args = {}
    for f, offset, mask in _LAYOUT[row.mnemonic]:
        value = (word >> offset) & mask
        if f.signed and value >> (f.bits - 1):
            value -= 1 << f.bits
        elif f.names and value >= len(f.names):
            _check(row.mnemonic, f, value)  # raises, naming the field
        args[f.name] = value
    insn = Insn(row, args, (word >> OPCODE_BITS) & 0xF)
    _check_deps(insn)
    return insn


def encode_words(insns) -> bytes:
    return b"".join(encode(i).to_bytes(WORD_BYTES, "little") for i in insns)


def decode_words(data: bytes) -> list[Insn]:
    """Decode a stream of words; equal words share one (immutable) Insn, since tiled programs
    repeat many instructions."""
    cache: dict[bytes, Insn] = {}
    out = []
    for i in range(0, len(data), WORD_BYTES):
        word = data[i:i + WORD_BYTES]
        insn = cache.get(word)
        if insn is None:
            insn = cache[word] = decode(int.from_bytes(word, "little"))
        out.append(insn)
    return out


def disassemble(insn: Insn) -> str:
    """`MNEMONIC field=value ... flag ...`, the form `assemble` reads back."""
    parts = [insn.op.mnemonic]
    for f in insn.op.fields:
        value = insn.args[f.name]
        parts.append(f"{f.name}={f.names[value] if f.names and value < len(f.names) else value}")
    parts += [name for bit, name in zip((POP_PREV, POP_NEXT, PUSH_PREV, PUSH_NEXT), DEPS)
              if insn.deps & bit]
    return " ".join(parts)


def assemble(text: str) -> Insn:
    """Parse one line of assembly; `;` starts a comment; missing fields take their defaults."""
    words = text.split(";")[0].split()
    if not words:
        raise SimulatorError("assemble: empty line")
    row = BY_MNEMONIC.get(words[0].upper())
    if row is None:
        raise SimulatorError(f"assemble: unknown mnemonic {words[0]!r}; expected one of "
                             f"{', '.join(BY_MNEMONIC)}")
    values, flags = {}, {}
    for word in words[1:]:
        if "=" in word:
            key, _, value = word.partition("=")
            try:
                values[key] = int(value, 0)
            except ValueError:
                values[key] = value
        elif word in DEPS:
            flags[word] = True
        else:
            raise SimulatorError(f"assemble: {row.mnemonic}: unexpected {word!r}; expected "
                                 f"field=value or one of {', '.join(DEPS)}")
    return row(**values, **flags)


def assemble_program(text: str) -> list[Insn]:
    """One instruction per non-blank line; `;` comments are skipped."""
    return [assemble(line) for line in text.splitlines() if line.split(";")[0].strip()]
