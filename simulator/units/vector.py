"""The vector unit: row-wise int32 -> int8 requantization, quantized add and multiply, pooling
windows, table lookup and softmax along a row's channels, all through `simulator.numerics`. It processes `arch.vector.lanes` elements per
cycle, so an instruction costs ceil(elements / lanes) cycles.

Parameter blocks (`ParamBlock`) live in the accumulator (int32) at `param`. REQUANT and AVGPOOL
read them per lane (per channel); ADD reads lanes 0, 1, 2 as the (a, b, out) rescales of
`numerics.add` (or of `numerics.extremum`, as Max or Min; with an int16 operand, lanes 0 and 1
as the operands' multipliers at lane 2's shift, `numerics.wide_add`), MUL lane 0 as the
rescale of `numerics.mul`. Every lane that is read must hold a valid shift (in [-31, 31]; zero-filled lanes
are valid), unused channels included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from simulator import numerics
from simulator.errors import SimulatorError
from simulator.units import ACCUMULATOR, SCRATCHPAD, Access, Work, ceil_div, rows, shared

# What ADD computes of its two operands (field op): their rescaled sum, the larger or smaller
# of them, or the root of their squares' sum (`numerics.hypot`, a spectrum's magnitude).
ADD_OPS = ("add", "max", "min", "hypot")
REDUCE_OPS = numerics.REDUCE_OPS  # what REDUCE computes of a row (field op)
LUT_ENTRIES = numerics.RANGES["int8"][1] - numerics.RANGES["int8"][0] + 1  # one per int8 code


@dataclass(frozen=True, eq=False)
class ParamBlock:
    """A parameter block, as the compiler packs it into the DRAM image and the vector unit reads
    it from the accumulator rows at `param`: per-lane Q31 multipliers, then per-lane shifts
    (`numerics.quantize_multiplier`), and for REQUANT with bias=1 a third row of per-lane int32
    biases, added (wrapping) to each accumulator row before rescaling. Unused lanes are zero."""

    multipliers: np.ndarray
    shifts: np.ndarray
    bias: np.ndarray | None = None

    @staticmethod
    def rows(bias: bool = False) -> int:
        """Accumulator rows a block takes, with or without the bias row."""
        return 3 if bias else 2

    def pack(self, lanes: int) -> bytes:
        """The block's accumulator rows, little-endian int32, `lanes` per row."""
        block = np.zeros((self.rows(self.bias is not None), lanes), "<i4")
        block[0, :len(self.multipliers)] = self.multipliers
        block[1, :len(self.shifts)] = self.shifts
        if self.bias is not None:
            block[2, :len(self.bias)] = self.bias
        return block.tobytes()

    @classmethod
    def unpack(cls, accumulator: np.ndarray, param: int, bias: bool = False) -> ParamBlock:
        """Each sample's block at accumulator row `param` (samples, lanes), shaped to broadcast
        against rows of lanes (samples, 1, lanes)."""
        block = accumulator[:, rows(accumulator, param, cls.rows(bias), "accumulator (params)")]
        block = block[:, :, None, :]
        return cls(block[:, 0], block[:, 1], block[:, 2] if bias else None)

    def lanes(self, count: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """(multipliers, shifts) of lanes [0, count), each per sample (samples, 1, 1): ADD's and
        MUL's rescales."""
        return (tuple(self.multipliers[..., j:j + 1] for j in range(count)),
                tuple(self.shifts[..., j:j + 1] for j in range(count)))


def requant(state, insn) -> None:
    a = insn.args
    src = state.accumulator[:, rows(state.accumulator, a["acc"], a["rows"], "accumulator")]
    params = ParamBlock.unpack(state.accumulator, a["param"], a["bias"])
    if a["bias"]:
        src = src + params.bias  # int32, wrapping, as the accumulator's own additions
    if a["wide"]:  # int16, clamped by the high byte: high plane at sp, low plane after it
        total = numerics.requantize(src, params.multipliers, params.shifts, a["out_offset"],
                                    *numerics.wide_clamp(a["qmin"], a["qmax"]), dtype="int16")
        state.scratchpad[:, rows(state.scratchpad, a["sp"], 2 * a["rows"], "scratchpad")] = \
            np.concatenate(numerics.split_wide(total), axis=1)
        return
    dst = rows(state.scratchpad, a["sp"], a["rows"], "scratchpad")
    state.scratchpad[:, dst] = numerics.requantize(src, params.multipliers, params.shifts,
                                                   a["out_offset"], a["qmin"], a["qmax"])


def add_b_rows(a: dict) -> int:
    """The b rows an ADD reads (per plane): one per row, or one broadcast to all (b_once=1)."""
    return min(a["rows"], 1) if a["b_once"] else a["rows"]


def _operand(sp, base: int, count: int, wide: int) -> np.ndarray:
    """`count` rows of an ADD or MUL operand at `base`: int8 codes, or (wide) an int16 value's high
    plane there and its low plane right after."""
    x = sp[:, rows(sp, base, count * (1 + wide), "scratchpad")]
    return numerics.join_wide(x[:, :count], x[:, count:]) if wide else x


def add(state, insn) -> None:
    a = insn.args
    sp = state.scratchpad
    x = _operand(sp, a["a"], a["rows"], a["a_wide"])
    y = _operand(sp, a["b"], add_b_rows(a), a["b_wide"])
    if a["b_splat"]:  # lane 0 of each b row stands for every lane
        y = y[:, :, :1]
    multipliers, shifts = ParamBlock.unpack(state.accumulator, a["param"]).lanes(3)
    wide_in = a["a_wide"] or a["b_wide"]
    if wide_in and ADD_OPS[a["op"]] not in ("add", "hypot"):
        raise SimulatorError(f"ADD: an int16 operand (a_wide, b_wide) adds or takes a "
                             f"magnitude; op {ADD_OPS[a['op']]!r} has no wide form")
    if a["wide"]:  # an int16 sum or magnitude, qmin and qmax its high byte's: high plane at
        # dst, low after
        if ADD_OPS[a["op"]] not in ("add", "hypot"):
            raise SimulatorError(f"ADD: wide=1 writes an int16 sum or magnitude; op "
                                 f"{ADD_OPS[a['op']]!r} has no wide form")
        clamp = numerics.wide_clamp(a["qmin"], a["qmax"])
        common = (x, y, a["a_offset"], a["b_offset"], multipliers, shifts, a["out_offset"])
        total = numerics.add(*common, *clamp, dtype="int16", wide=bool(wide_in)) \
            if ADD_OPS[a["op"]] == "add" else numerics.hypot(*common, *clamp, dtype="int16")
        sp[:, rows(sp, a["dst"], 2 * a["rows"], "scratchpad")] = np.concatenate(
            numerics.split_wide(total), axis=1)
        return
    common = (x, y, a["a_offset"], a["b_offset"], multipliers, shifts, a["out_offset"],
              a["qmin"], a["qmax"])
    op = ADD_OPS[a["op"]]
    sp[:, rows(sp, a["dst"], a["rows"], "scratchpad")] = (
        numerics.add(*common, wide=bool(wide_in)) if op == "add"
        else numerics.hypot(*common) if op == "hypot"
        else numerics.extremum(*common, op=op))


def mul_b_rows(a: dict) -> int:
    """The b rows a MUL reads: one per row, or one broadcast to all (b_step=0)."""
    return a["rows"] if a["b_step"] else min(a["rows"], 1)


def mul(state, insn) -> None:
    a = insn.args
    sp = state.scratchpad
    x = _operand(sp, a["a"], a["rows"], a["a_wide"])
    y = _operand(sp, a["b"], mul_b_rows(a), a["b_wide"])
    if a["b_splat"]:  # lane 0 of each b row stands for every lane
        y = y[:, :, :1]
    (multiplier,), (shift,) = ParamBlock.unpack(state.accumulator, a["param"]).lanes(1)
    if a["wide"]:  # an int16 product, qmin and qmax its high byte's: high plane at dst, low after
        total = numerics.mul(x, y, a["a_offset"], a["b_offset"], multiplier, shift,
                             a["out_offset"], *numerics.wide_clamp(a["qmin"], a["qmax"]),
                             dtype="int16")
        sp[:, rows(sp, a["dst"], 2 * a["rows"], "scratchpad")] = np.concatenate(
            numerics.split_wide(total), axis=1)
        return
    sp[:, rows(sp, a["dst"], a["rows"], "scratchpad")] = numerics.mul(
        x, y, a["a_offset"], a["b_offset"], multiplier, shift, a["out_offset"], a["qmin"],
        a["qmax"])


def _out_shape(a: dict) -> tuple[int, int]:
    if a["kh"] == 0 or a["kw"] == 0 or a["sh"] == 0 or a["sw"] == 0:
        raise SimulatorError("kh, kw, sh, sw: expected positive window sizes and strides")
    if a["kh"] > a["in_h"] or a["kw"] > a["in_w"]:
        raise SimulatorError(f"window {a['kh']}x{a['kw']} larger than the input "
                             f"{a['in_h']}x{a['in_w']}")
    return (a["in_h"] - a["kh"]) // a["sh"] + 1, (a["in_w"] - a["kw"]) // a["sw"] + 1


def pool_planes(a: dict) -> tuple[int, int]:
    """(input planes, output planes) of a MAXPOOL or AVGPOOL: 1 for int8 codes, 2 for int16
    ones (an int16 value's high plane's pixel rows, then its low plane's). MAXPOOL's wide=1
    is both (a max keeps the type); AVGPOOL's in_wide and wide are each its own."""
    wide = a.get("wide", 0)
    return 1 + a.get("in_wide", wide), 1 + wide


def _windows(state, a: dict) -> np.ndarray:
    """(samples, out_h, out_w, lanes, kh, kw) view of the pixel rows at `src` (row-major
    in_h x in_w); of int16 codes (`numerics.join_wide`) when the input is two planes, the low
    plane's in_h x in_w rows after the high plane's."""
    sp = state.scratchpad
    pixels = a["in_h"] * a["in_w"]
    image = sp[:, rows(sp, a["src"], pool_planes(a)[0] * pixels, "scratchpad")]
    if pool_planes(a)[0] == 2:
        image = numerics.join_wide(image[:, :pixels], image[:, pixels:])
    image = image.reshape(len(sp), a["in_h"], a["in_w"], -1)
    windows = sliding_window_view(image, (a["kh"], a["kw"]), axis=(1, 2))
    return windows[:, ::a["sh"], ::a["sw"]]


def _write_pixels(state, a: dict, out: np.ndarray) -> None:
    """The out_h x out_w pixel rows at dst: int8 codes, or int16 ones as two planes, the high
    plane's rows then the low plane's (`numerics.split_wide`)."""
    sp = state.scratchpad
    pixels = out.shape[1] * out.shape[2]
    planes = numerics.split_wide(out) if pool_planes(a)[1] == 2 else (out,)
    region = sp[:, rows(sp, a["dst"], len(planes) * pixels, "scratchpad")]
    for i, plane in enumerate(planes):
        region[:, i * pixels:(i + 1) * pixels] = plane.reshape(len(sp), -1, sp.shape[2])


def maxpool(state, insn) -> None:
    a = insn.args
    _out_shape(a)
    _write_pixels(state, a, numerics.window_max(_windows(state, a)))


def avgpool(state, insn) -> None:
    """Window sums of (x - in_offset) requantized per lane; an int16 result (wide=1) clamped
    to [qmin * 256, qmax * 256 + 255] (`numerics.wide_clamp`), as REQUANT's."""
    a = insn.args
    _out_shape(a)
    sums = numerics.window_sum(_windows(state, a), a["in_offset"])
    params = ParamBlock.unpack(state.accumulator, a["param"])
    wide = pool_planes(a)[1] == 2
    qmin, qmax = numerics.wide_clamp(a["qmin"], a["qmax"]) if wide else (a["qmin"], a["qmax"])
    _write_pixels(state, a, numerics.requantize(sums, params.multipliers[:, None],
                                                params.shifts[:, None], a["out_offset"],
                                                qmin, qmax, dtype="int16" if wide else "int8"))


def lut_entries(in_wide: int = 0, zoom: int = 0) -> int:
    """Entries of a LUT's table: one per int8 code, or with in_wide one per high byte of an
    int16 code and one past the last (`numerics.KNOTS`), and as many again for a window of
    finer knots (zoom > 0, `numerics.knot_entries`)."""
    return numerics.knot_entries(zoom) if in_wide else LUT_ENTRIES


def lut_table_rows(lanes: int, per_lane: int, wide: int = 0, in_wide: int = 0,
                   zoom: int = 0) -> int:
    """Scratchpad rows of a LUT's table: the 256 entries in rows of `lanes`, or with per_lane
    one row per entry (lane j of row i: entry i of lane j's table). A table of 16-bit entries
    (wide or in_wide: `lut_entries` of them) is two such blocks, the entries' high bytes and
    then their low bytes - 128 (`numerics.split_wide`)."""
    entries = lut_entries(in_wide, zoom)
    block = entries if per_lane else ceil_div(entries, lanes)
    return 2 * block if wide or in_wide else block


def _each_sample(state, insn, run) -> None:
    """Run the instruction on each sample alone: its samples hold different tables."""
    for sample in range(state.batch):
        run(state.sample(sample), insn)


def lut(state, insn) -> None:
    a = insn.args
    sp = state.scratchpad
    wide, in_wide = a["wide"], a["in_wide"]
    table = shared(sp[:, rows(sp, a["table"], lut_table_rows(sp.shape[2], a["per_lane"], wide,
                                                             in_wide, a["zoom"]),
                              "scratchpad (table)")])
    if table is None:
        return _each_sample(state, insn, lut)
    if a["zoom"] and not in_wide:
        raise SimulatorError(f"LUT: zoom={a['zoom']} is a window of an int16 input's knots; "
                             f"it needs in_wide=1")
    if not (wide or in_wide):
        src = sp[:, rows(sp, a["src"], a["rows"], "scratchpad")]
        dst = rows(sp, a["dst"], a["rows"], "scratchpad")
        if a["per_lane"]:
            sp[:, dst] = numerics.lookup_lanes(src, table)
        else:
            sp[:, dst] = numerics.lookup(src, table.ravel()[:LUT_ENTRIES])
        return
    # 16-bit entries: the high bytes' block, then the low bytes' (`lut_table_rows`); per lane,
    # an entry a row.
    half = len(table) // 2
    if a["per_lane"]:
        entries = numerics.join_wide(table[:half], table[half:])
    else:
        entries = numerics.join_wide(table[:half].ravel(), table[half:].ravel())
        entries = entries[:lut_entries(in_wide, a["zoom"])]
    src = sp[:, rows(sp, a["src"], (1 + in_wide) * a["rows"], "scratchpad")]
    if in_wide:  # an int16 input: its high plane at src, its low plane after it
        y = numerics.interpolate(numerics.join_wide(src[:, :a["rows"]], src[:, a["rows"]:]),
                                 entries, "int16" if wide else "int8", a["zoom"], a["origin"])
    else:
        y = numerics.lookup_wide(src, entries)
    dst = rows(sp, a["dst"], (1 + wide) * a["rows"], "scratchpad")
    sp[:, dst] = np.concatenate(numerics.split_wide(y), axis=1) if wide else y


def softmax_table_rows(lanes: int, log: int, wide: int = 0) -> int:
    """Accumulator rows of a SOFTMAX's table: the exp entries (an int16 input's two sets with
    wide=1; with log=1 the log entries after them), int32, `lanes` per row."""
    entries = (numerics.WIDE_EXP_ENTRIES if wide else numerics.EXP_ENTRIES) + \
        (numerics.LOG_ENTRIES if log else 0)
    return ceil_div(entries, lanes)


def _softmax_rows(a: dict, base: int, block: int) -> slice:
    return slice(base + block * a["stride"], base + block * a["stride"] + a["rows"])


def _channel_rows(state, a: dict, mnemonic: str, first: int = 0,
                  dst_blocks: bool = True) -> np.ndarray:
    """The rows of C channels a SOFTMAX, LAYERNORM or REDUCE reads: one region per channel
    block, from block `first` on (a wide LAYERNORM's low plane follows its high one); the
    destination's blocks are checked too unless `dst_blocks` is False (REDUCE writes one row
    each)."""
    sp, lanes = state.scratchpad, state.scratchpad.shape[2]
    if not 1 <= a["n"] <= lanes or a["blocks"] < 1:
        raise SimulatorError(f"{mnemonic}: n = {a['n']}, blocks = {a['blocks']}: expected n in "
                             f"[1, {lanes}] and at least one block")
    last = a["blocks"] - 1
    for base in (a["src"] + first * a["stride"], *([a["dst"]] if dst_blocks else [])):
        rows(sp, base + last * a["stride"], a["rows"], "scratchpad")
    return np.concatenate([sp[:, _softmax_rows(a, a["src"], first + b),
                              :lanes if b < last else a["n"]]
                           for b in range(a["blocks"])], axis=2)


def _write_channel_rows(state, a: dict, y: np.ndarray, first: int = 0) -> None:
    """The rows of C channels at dst, from block `first` on (a wide LAYERNORM's output: its
    low plane's blocks follow its high plane's)."""
    sp, lanes = state.scratchpad, state.scratchpad.shape[2]
    rows(sp, a["dst"] + (first + a["blocks"] - 1) * a["stride"], a["rows"], "scratchpad")
    for b in range(a["blocks"]):
        width = lanes if b < a["blocks"] - 1 else a["n"]
        sp[:, _softmax_rows(a, a["dst"], first + b), :width] = \
            y[:, :, b * lanes:b * lanes + width]


def softmax(state, insn) -> None:
    a = insn.args
    if a["log"] and (a["wide"] or a["out_wide"] or a["fine_bits"]):
        raise SimulatorError("SOFTMAX: log=1 reads and writes int8 codes; wide, out_wide and "
                             "fine_bits are softmax's")
    if a["fine_bits"] and not a["out_wide"]:
        raise SimulatorError(f"SOFTMAX: fine_bits={a['fine_bits']} refines an int16 output's "
                             f"steps; it needs out_wide=1")
    x = _row_codes(state, a, "SOFTMAX")
    lanes = state.scratchpad.shape[2]
    table = shared(state.accumulator[:, rows(state.accumulator, a["table"],
                                             softmax_table_rows(lanes, a["log"], a["wide"]),
                                             "accumulator (table)")])
    if table is None:
        return _each_sample(state, insn, softmax)
    table = table.ravel()
    if a["log"]:
        y = numerics.log_softmax(x, table[:numerics.EXP_ENTRIES],
                                 table[numerics.EXP_ENTRIES:][:numerics.LOG_ENTRIES], a["shift"],
                                 a["out_offset"])
    else:
        entries = numerics.WIDE_EXP_ENTRIES if a["wide"] else numerics.EXP_ENTRIES
        y = numerics.softmax(x, table[:entries], a["out_offset"],
                             dtype="int16" if a["out_wide"] else "int8",
                             in_dtype="int16" if a["wide"] else "int8",
                             out_bits=numerics.SOFTMAX_OUT_BITS + a["fine_bits"])
    _write_row_codes(state, a, y)


def _row_codes(state, a: dict, mnemonic: str) -> np.ndarray:
    """A SOFTMAX's or LAYERNORM's rows: int8 codes, or with wide=1 int16 ones, the low
    plane's blocks after the high plane's."""
    x = _channel_rows(state, a, mnemonic)
    if a["wide"]:
        x = numerics.join_wide(x, _channel_rows(state, a, mnemonic, a["blocks"]))
    return x


def _write_row_codes(state, a: dict, y: np.ndarray) -> None:
    """A SOFTMAX's or LAYERNORM's results: int8 codes, or with out_wide=1 int16 ones, the
    high plane's blocks, then the low plane's."""
    if a["out_wide"]:
        high, low = numerics.split_wide(y)
        _write_channel_rows(state, a, high)
        _write_channel_rows(state, a, low, a["blocks"])
    else:
        _write_channel_rows(state, a, y)


def layernorm_table_rows(lanes: int, channels: int) -> int:
    """Accumulator rows of a LAYERNORM's parameters, int32, `lanes` per row: the epsilon term,
    then the C multipliers, the C shifts and the C biases."""
    return ceil_div(1 + 3 * channels, lanes)


def _row_channels(a: dict, lanes: int) -> int:
    return (a["blocks"] - 1) * lanes + a["n"]


def layernorm(state, insn) -> None:
    a = insn.args
    x = _row_codes(state, a, "LAYERNORM")
    lanes = state.scratchpad.shape[2]
    c = _row_channels(a, lanes)
    table = shared(state.accumulator[:, rows(state.accumulator, a["table"],
                                             layernorm_table_rows(lanes, c),
                                             "accumulator (table)")])
    if table is None:
        return _each_sample(state, insn, layernorm)
    table = table.ravel().astype(np.int64)
    y = numerics.layer_norm(x, table[0], table[1:1 + c], table[1 + c:1 + 2 * c],
                            table[1 + 2 * c:1 + 3 * c], a["out_offset"],
                            dtype="int16" if a["out_wide"] else "int8",
                            in_dtype="int16" if a["wide"] else "int8")
    _write_row_codes(state, a, y)


def reduce(state, insn) -> None:
    """REDUCE: each row's C channels (SOFTMAX's addressing) → one int8 value, lane 0 of the
    row at dst (`numerics.reduce_rows`); the l2 rescale is the int32 pair at `table`."""
    a = insn.args
    x = _channel_rows(state, a, "REDUCE", dst_blocks=False)
    op = REDUCE_OPS[a["op"]]
    multiplier = shift = 0
    if op == "l2":
        pair = shared(state.accumulator[:, rows(state.accumulator, a["table"], 1,
                                                "accumulator (table)")])
        if pair is None:
            return _each_sample(state, insn, reduce)
        multiplier, shift = (int(v) for v in pair.ravel()[:2])
    y = numerics.reduce_rows(x, op, a["in_offset"], multiplier, shift, a["out_offset"])
    sp = state.scratchpad
    sp[:, rows(sp, a["dst"], a["rows"], "scratchpad"), 0] = y


def reduce_cycles(arch, insn) -> int:
    """One pass over the rows' channel blocks (the running maximum, minimum or sum of
    squares), and for l2 one square-root step per row."""
    a = insn.args
    once = ceil_div(a["rows"] * a["blocks"] * arch.lanes, arch.vector.lanes)
    return once + (a["rows"] if REDUCE_OPS[a["op"]] == "l2" else 0)


def reduce_work(arch, insn) -> Work:
    a = insn.args
    return Work(local_bytes=(a["blocks"] + 1) * a["rows"] * arch.scratchpad.row_bytes
                + arch.accumulator.row_bytes,
                scratchpad_end=a["dst"] + a["rows"] if a["rows"] else 0)


def reduce_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    table = (Access(ACCUMULATOR, a["table"], a["table"] + 1, False),) \
        if REDUCE_OPS[a["op"]] == "l2" else ()
    return table + tuple(
        Access(SCRATCHPAD, a["src"] + b * a["stride"], a["src"] + b * a["stride"] + a["rows"],
               False) for b in range(a["blocks"])) + \
        (Access(SCRATCHPAD, a["dst"], a["dst"] + a["rows"], True),)


def _pool_elements(arch, a: dict) -> tuple[int, int]:
    """(output pixels, elements read) of a pooling instruction, per plane."""
    out_h = (a["in_h"] - a["kh"]) // max(a["sh"], 1) + 1 if a["in_h"] >= a["kh"] else 0
    out_w = (a["in_w"] - a["kw"]) // max(a["sw"], 1) + 1 if a["in_w"] >= a["kw"] else 0
    return out_h * out_w, out_h * out_w * a["kh"] * a["kw"] * arch.lanes


def row_cycles(arch, insn) -> int:
    """REQUANT, ADD: one element per lane of each row; each int16 plane (a wide output's, a
    wide a's) one more pass over the rows, and a wide b's low plane one more pass over b's
    rows: all of them, or the one row an ADD broadcasts to every row (b_once), whose codes
    are joined once. No 16-bit mode of the vector unit is modelled."""
    a = insn.args
    planes = 1 + a.get("wide", 0) + a.get("a_wide", 0)
    b_rows = add_b_rows(a) if "b_once" in a else a["rows"]
    return planes * ceil_div(a["rows"] * arch.lanes, arch.vector.lanes) + \
        a.get("b_wide", 0) * ceil_div(b_rows * arch.lanes, arch.vector.lanes)


def mul_cycles(arch, insn) -> int:
    """One element per lane of each row for each pair of operand planes: the lanes' multipliers
    are 8 x 8 bits, so an int16 operand's two planes are two partial products (int16 x int16
    four), summed exactly before the one requantization; an int16 product's second plane one
    more pass (no 16-bit multiplier is modelled). int8 x int8: one pass, as before."""
    a = insn.args
    passes = (1 + a["a_wide"]) * (1 + a["b_wide"]) + a["wide"]
    return passes * ceil_div(a["rows"] * arch.lanes, arch.vector.lanes)


def pool_cycles(arch, insn) -> int:
    """One element per lane of each window's pixels; an int16 input's windows read twice the
    elements (both planes, joined before the compare or the sum) and an int16 result's second
    plane is one more pass over the output pixels: an int16 MAXPOOL costs what two int8 ones
    do, plus that pass (no 16-bit mode of the vector unit is modelled)."""
    a = insn.args
    pixels, elements = _pool_elements(arch, a)
    planes_in, planes_out = pool_planes(a)
    return ceil_div(planes_in * elements + (planes_out - 1) * pixels * arch.lanes,
                    arch.vector.lanes)


def softmax_cycles(arch, insn) -> int:
    """Three passes over the rows' channel blocks (the maximum; the table lookups and their
    sum; the division or the subtraction of the logarithm), and one step per row for its
    reciprocal or logarithm; a wide input's two planes make the first two passes read twice
    the blocks (the second's two lookups multiplied in the same pass), a wide output's two
    planes the last one write twice."""
    a = insn.args
    once = ceil_div(a["rows"] * a["blocks"] * arch.lanes, arch.vector.lanes)
    return (3 + 2 * a["wide"] + a["out_wide"]) * once + a["rows"]


def layernorm_cycles(arch, insn) -> int:
    """Three passes over the rows' channel blocks (the sums of codes and squares; the centred
    codes; the division and per-channel rescale), and one square-root step per row; a wide
    input's two planes make the first two passes read twice the blocks, a wide output's two
    planes the last one write twice."""
    a = insn.args
    once = ceil_div(a["rows"] * a["blocks"] * arch.lanes, arch.vector.lanes)
    return (3 + 2 * a["wide"] + a["out_wide"]) * once + a["rows"]


def requant_work(arch, insn) -> Work:
    a = insn.args
    acc_row, sp_row = arch.accumulator.row_bytes, arch.scratchpad.row_bytes
    written = (1 + a["wide"]) * a["rows"]
    return Work(local_bytes=(a["rows"] + ParamBlock.rows(a["bias"])) * acc_row
                + written * sp_row,
                scratchpad_end=a["sp"] + written if a["rows"] else 0)


def add_work(arch, insn) -> Work:
    a = insn.args
    written = (1 + a["wide"]) * a["rows"]
    read = (1 + a["a_wide"]) * a["rows"] + (1 + a["b_wide"]) * add_b_rows(a)
    return Work(local_bytes=(read + written) * arch.scratchpad.row_bytes
                + ParamBlock.rows() * arch.accumulator.row_bytes,
                scratchpad_end=a["dst"] + written if a["rows"] else 0)


def mul_work(arch, insn) -> Work:
    a = insn.args
    written = (1 + a["wide"]) * a["rows"]
    read = (1 + a["a_wide"]) * a["rows"] + (1 + a["b_wide"]) * mul_b_rows(a)
    return Work(local_bytes=(read + written) * arch.scratchpad.row_bytes
                + ParamBlock.rows() * arch.accumulator.row_bytes,
                scratchpad_end=a["dst"] + written if a["rows"] else 0)


def pool_work(arch, insn) -> Work:
    a = insn.args
    pixels, _ = _pool_elements(arch, a)
    planes_in, planes_out = pool_planes(a)
    params = ParamBlock.rows() * arch.accumulator.row_bytes if "param" in a else 0
    return Work(local_bytes=(planes_in * a["in_h"] * a["in_w"] + planes_out * pixels)
                * arch.scratchpad.row_bytes + params,
                scratchpad_end=a["dst"] + planes_out * pixels if pixels else 0)


def lut_cycles(arch, insn) -> int:
    """One element per lane of each row, a pass for each: the lookup (an int8 code's entry,
    or an int16 code's first knot), and one more for each of an int16 output's second plane
    (wide), an int16 input's low plane read with the weighing of the knots, and its second
    knot's lookup (in_wide, two): int8 -> int16 twice an int8 LUT's time, int16 -> int8
    three times, int16 -> int16 four. A window of finer knots (zoom) costs no pass: which
    knots a code takes is a compare of the code with the window's ends, beside the index."""
    a = insn.args
    passes = 1 + a["wide"] + 2 * a["in_wide"]
    return passes * ceil_div(a["rows"] * arch.lanes, arch.vector.lanes)


def lut_work(arch, insn) -> Work:
    a = insn.args
    wide, in_wide = a["wide"], a["in_wide"]
    written = (1 + wide) * a["rows"]
    entry_bytes = 2 if wide or in_wide else 1
    return Work(local_bytes=((1 + in_wide) * a["rows"] + written) * arch.scratchpad.row_bytes
                + lut_entries(in_wide, a["zoom"]) * entry_bytes
                * (arch.lanes if a["per_lane"] else 1),
                scratchpad_end=a["dst"] + written if a["rows"] else 0)


def softmax_work(arch, insn) -> Work:
    a = insn.args
    elements = a["rows"] * a["blocks"]
    written = (1 + a["out_wide"]) * a["blocks"]
    return Work(local_bytes=(3 + a["wide"] + a["out_wide"]) * elements
                * arch.scratchpad.row_bytes
                + softmax_table_rows(arch.lanes, a["log"], a["wide"])
                * arch.accumulator.row_bytes,
                scratchpad_end=(a["dst"] + (written - 1) * a["stride"] + a["rows"]
                                if elements else 0))


def layernorm_work(arch, insn) -> Work:
    a = insn.args
    elements = a["rows"] * a["blocks"]
    table = layernorm_table_rows(arch.lanes, _row_channels(a, arch.lanes))
    written = (1 + a["out_wide"]) * a["blocks"]
    return Work(local_bytes=(3 + a["wide"] + a["out_wide"]) * elements
                * arch.scratchpad.row_bytes + table * arch.accumulator.row_bytes,
                scratchpad_end=(a["dst"] + (written - 1) * a["stride"] + a["rows"]
                                if elements else 0))


def _param_access(a: dict) -> Access:
    return Access(ACCUMULATOR, a["param"], a["param"] + ParamBlock.rows(), False)


def requant_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    return (Access(ACCUMULATOR, a["acc"], a["acc"] + a["rows"], False),
            Access(ACCUMULATOR, a["param"], a["param"] + ParamBlock.rows(a["bias"]), False),
            Access(SCRATCHPAD, a["sp"], a["sp"] + (1 + a["wide"]) * a["rows"], True))


def add_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    return (Access(SCRATCHPAD, a["a"], a["a"] + (1 + a["a_wide"]) * a["rows"], False),
            Access(SCRATCHPAD, a["b"], a["b"] + (1 + a["b_wide"]) * add_b_rows(a), False),
            _param_access(a),
            Access(SCRATCHPAD, a["dst"], a["dst"] + (1 + a["wide"]) * a["rows"], True))


def mul_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    return (Access(SCRATCHPAD, a["a"], a["a"] + (1 + a["a_wide"]) * a["rows"], False),
            Access(SCRATCHPAD, a["b"], a["b"] + (1 + a["b_wide"]) * mul_b_rows(a), False),
            _param_access(a),
            Access(SCRATCHPAD, a["dst"], a["dst"] + (1 + a["wide"]) * a["rows"], True))


def pool_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    pixels, _ = _pool_elements(arch, a)
    planes_in, planes_out = pool_planes(a)
    out = (Access(SCRATCHPAD, a["src"], a["src"] + planes_in * a["in_h"] * a["in_w"], False),
           Access(SCRATCHPAD, a["dst"], a["dst"] + planes_out * pixels, True))
    return out + ((_param_access(a),) if "param" in a else ())


def lut_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    table = lut_table_rows(arch.lanes, a["per_lane"], a["wide"], a["in_wide"], a["zoom"])
    return (Access(SCRATCHPAD, a["src"], a["src"] + (1 + a["in_wide"]) * a["rows"], False),
            Access(SCRATCHPAD, a["table"], a["table"] + table, False),
            Access(SCRATCHPAD, a["dst"], a["dst"] + (1 + a["wide"]) * a["rows"], True))


def softmax_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    return _row_accesses(a, softmax_table_rows(arch.lanes, a["log"], a["wide"]))


def layernorm_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    return _row_accesses(a, layernorm_table_rows(arch.lanes, _row_channels(a, arch.lanes)))


def _row_accesses(a: dict, table_rows: int) -> tuple[Access, ...]:
    """A SOFTMAX's or LAYERNORM's: its table, and each channel block of the source and the
    destination (an int16 input's or output's low plane: `blocks` more after the high)."""
    table = (Access(ACCUMULATOR, a["table"], a["table"] + table_rows, False),)
    read = (1 + a["wide"]) * a["blocks"]
    return table + tuple(
        Access(SCRATCHPAD, base + b * a["stride"], base + b * a["stride"] + a["rows"], write)
        for base, write, blocks in ((a["src"], False, read),
                                    (a["dst"], True, (1 + a["out_wide"]) * a["blocks"]))
        for b in range(blocks))
