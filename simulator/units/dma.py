"""The DMA engines: 2-D strided copies between DRAM (byte addressed) and a local memory
(row addressed), with padding on load, as VTA's load and store modules.

An element is one local row. LOAD reads `y_size` lines of `x_size` elements of `elem_bytes`
bytes from DRAM (element stride `x_stride`, line stride `y_stride`, in bytes) into a block of
(pad_top + y_size + pad_bottom) x (pad_left + x_size + pad_right) consecutive local rows; pad rows
and the lanes past `elem_bytes` are filled with `pad_value`; with `transpose` the block is turned
(byte e of line l to lane l of row e). STORE is the inverse without pads.

GATHER is the indexed DMA, DRAM to DRAM: it reads `count` int32 indices and copies the table
rows they pick (an embedding lookup), checking each index against the table's `rows`.
"""

from __future__ import annotations

import numpy as np

from simulator import numerics
from simulator.errors import IndexRangeError, SimulatorError
from simulator.units import (MEMORIES, SCRATCHPAD, Access, Work, ceil_div, dram_span,
                             dram_view, rows)


def _dram_view(dram: np.ndarray, addr: int, a: dict, writeable: bool) -> np.ndarray:
    return dram_view(dram, addr, (a["y_size"], a["x_size"], a["elem_bytes"]),
                     (a["y_stride"], a["x_stride"], 1), writeable)


def _local(state, a: dict) -> tuple[np.ndarray, str]:
    memory = state.memories[a["mem"]]
    name = MEMORIES[a["mem"]]
    row_bytes = memory.shape[2] * memory.itemsize
    if a["elem_bytes"] > row_bytes or a["elem_bytes"] % memory.itemsize:
        raise SimulatorError(f"elem_bytes = {a['elem_bytes']}: expected a multiple of "
                             f"{memory.itemsize} up to the {name} row of {row_bytes} bytes")
    return memory, name


def _block_shape(a: dict) -> tuple[int, int]:
    return (a["pad_top"] + a["y_size"] + a["pad_bottom"],
            a["pad_left"] + a["x_size"] + a["pad_right"])


def load(state, insn) -> None:
    a = insn.args
    if a["transpose"]:
        return _load_turned(state, a)
    memory, name = _local(state, a)
    height, width = _block_shape(a)
    if height * width == 0:
        return
    block = memory[:, rows(memory, a["sram"], height * width, name)]
    block = block.reshape(len(memory), height, width, -1)
    lanes = a["elem_bytes"] // memory.itemsize
    src = _dram_view(state.dram, a["dram"], a, writeable=False)
    if height * width > a["y_size"] * a["x_size"] or lanes < block.shape[3]:
        block[...] = a["pad_value"]
    data = np.ascontiguousarray(src).view(memory.dtype.newbyteorder("<"))
    block[:, a["pad_top"]:a["pad_top"] + a["y_size"],
          a["pad_left"]:a["pad_left"] + a["x_size"], :lanes] = data


_PADS = ("pad_top", "pad_bottom", "pad_left", "pad_right")


def _turn_check(a: dict, lanes: int) -> None:
    if a["mem"] != SCRATCHPAD or a["elem_bytes"] != 1 or any(a[p] for p in _PADS) or \
            a["y_size"] > lanes:
        raise SimulatorError(f"LOAD transpose=1: expected the scratchpad, elem_bytes 1, no pads "
                             f"and y_size <= {lanes} lanes; got mem {MEMORIES[a['mem']]}, "
                             f"elem_bytes {a['elem_bytes']}, pads "
                             f"{[a[p] for p in _PADS]}, y_size {a['y_size']}")


def _load_turned(state, a: dict) -> None:
    """transpose=1: element (l, e) to lane l of row sram + e (a corner turn)."""
    memory = state.scratchpad
    _turn_check(a, memory.shape[2])
    if a["y_size"] * a["x_size"] == 0:
        return
    block = memory[:, rows(memory, a["sram"], a["x_size"], "scratchpad")]
    src = _dram_view(state.dram, a["dram"], a, writeable=False)[..., 0]
    block[...] = a["pad_value"]
    block[:, :, :a["y_size"]] = src.transpose(0, 2, 1).view(np.int8)


def store(state, insn) -> None:
    a = insn.args
    memory, name = _local(state, a)
    count = a["y_size"] * a["x_size"]
    if count == 0:
        return
    block = memory[:, rows(memory, a["sram"], count, name)]
    block = block.reshape(len(memory), a["y_size"], a["x_size"], -1)
    lanes = a["elem_bytes"] // memory.itemsize
    data = np.ascontiguousarray(block[..., :lanes]).astype(memory.dtype.newbyteorder("<"))
    dst = _dram_view(state.dram, a["dram"], a, writeable=True)
    dst[...] = data.view(np.uint8).reshape(dst.shape)


def gather(state, insn) -> None:
    """Row i of the destination = the table row that index i picks (`numerics.gather_index`:
    a negative index counts from the end); an index outside [-rows, rows) raises
    IndexRangeError naming it, and the DRAM address it was read from, before anything moves."""
    a = insn.args
    count, width = a["count"], a["row_bytes"]
    if count * width == 0:
        return
    raw = dram_view(state.dram, a["index"], (count, 4), (4, 1), writeable=False)
    indices = np.ascontiguousarray(raw).view("<i4").reshape(len(raw), count)
    try:
        positions = numerics.gather_index(indices, a["rows"])
    except SimulatorError:
        sample, i = (int(v) for v in np.argwhere((indices < -a["rows"]) |
                                                  (indices >= a["rows"]))[0])
        raise IndexRangeError(f"index {int(indices[sample, i])} at DRAM {a['index'] + 4 * i} "
                              f"is out of range [{-a['rows']}, {a['rows']})",
                              a["index"] + 4 * i, int(indices[sample, i]), a["rows"],
                              sample) from None
    table = dram_view(state.dram, a["table"], (a["rows"], width), (a["table_stride"], 1),
                      writeable=False)
    dst = dram_view(state.dram, a["dst"], (count, width), (a["dst_stride"], 1))
    dst[...] = np.take_along_axis(table, positions[:, :, None], axis=1)


def dram_spans(arch, insn) -> tuple[tuple[int, int], ...]:
    """LOAD's and STORE's DRAM bytes [lo, hi)."""
    a = insn.args
    return (dram_span(a["dram"], (a["y_size"], a["x_size"], a["elem_bytes"]),
                      (a["y_stride"], a["x_stride"], 1)),)


def gather_dram_spans(arch, insn) -> tuple[tuple[int, int], ...]:
    """GATHER's indices, table and destination bytes."""
    a = insn.args
    count, width = a["count"], a["row_bytes"]
    if count * width == 0:
        return ()
    return (dram_span(a["index"], (count, 4), (4, 1)),
            dram_span(a["table"], (a["rows"], width), (a["table_stride"], 1)),
            dram_span(a["dst"], (count, width), (a["dst_stride"], 1)))


def _run_cycles(arch, nbytes: int) -> int:
    """Cycles one contiguous run of `nbytes` occupies the DRAM port, in bursts of at most
    max_burst_bytes (`transfer_cycles`' rule)."""
    bw, burst = arch.dma.bytes_per_cycle, arch.dma.max_burst_bytes
    full, rest = divmod(nbytes, burst)
    return full * ceil_div(burst, bw) + ceil_div(rest, bw)


def gather_transfer_cycles(arch, insn) -> int:
    """The indices' one run, then each row read and written, a run each way."""
    a = insn.args
    if a["count"] * a["row_bytes"] == 0:
        return 0
    return _run_cycles(arch, 4 * a["count"]) + 2 * a["count"] * _run_cycles(arch, a["row_bytes"])


def gather_cycles(arch, insn) -> int:
    """Two latencies (the rows' addresses wait for the indices), then the transfer."""
    return 2 * arch.dma.latency_cycles + gather_transfer_cycles(arch, insn)


def gather_work(arch, insn) -> Work:
    a = insn.args
    moved = a["count"] * a["row_bytes"]
    return Work(dram_read=4 * a["count"] + moved, dram_written=moved)


def transfer_cycles(arch, insn) -> int:
    """Cycles the bytes occupy the DRAM port: each contiguous DRAM run is split into bursts of at
    most max_burst_bytes, and a burst occupies ceil(bytes / bytes_per_cycle) cycles, so narrow
    strided elements waste bandwidth as they do on a real bus."""
    a = insn.args
    y, x, eb = a["y_size"], a["x_size"], a["elem_bytes"]
    if x * y * eb == 0:
        return 0
    if a["x_stride"] == eb and a["y_stride"] == x * eb:
        run, runs = y * x * eb, 1
    elif a["x_stride"] == eb:
        run, runs = x * eb, y
    else:
        run, runs = eb, y * x
    return runs * _run_cycles(arch, run)


def cycles(arch, insn) -> int:
    """latency + transfer: the latency is paid once per instruction (requests pipeline)."""
    return arch.dma.latency_cycles + transfer_cycles(arch, insn)


def min_cycles(arch, count: int, nbytes: int) -> float:
    """A lower bound of the cycles `count` LOADs or STOREs moving `nbytes` in all take, for a
    planner that has not built them yet: each pays the latency, and the bytes move at the full
    bandwidth, as `cycles` with its bursts' rounding relaxed."""
    return nbytes / arch.dma.bytes_per_cycle + count * arch.dma.latency_cycles


def load_work(arch, insn) -> Work:
    a = insn.args
    height, width = _block_shape(a) if not a["transpose"] else (1, a["x_size"])
    row_bytes = arch.memories[a["mem"]].row_bytes
    end = a["sram"] + height * width
    return Work(dram_read=a["y_size"] * a["x_size"] * a["elem_bytes"],
                local_bytes=height * width * row_bytes,
                scratchpad_end=end if a["mem"] == 0 else 0,
                accumulator_end=end if a["mem"] == 1 else 0)


def store_work(arch, insn) -> Work:
    a = insn.args
    row_bytes = arch.memories[a["mem"]].row_bytes
    return Work(dram_written=a["y_size"] * a["x_size"] * a["elem_bytes"],
                local_bytes=a["y_size"] * a["x_size"] * row_bytes)


def load_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    height, width = _block_shape(a) if not a["transpose"] else (1, a["x_size"])
    return (Access(a["mem"], a["sram"], a["sram"] + height * width, True),)


def store_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    return (Access(a["mem"], a["sram"], a["sram"] + a["y_size"] * a["x_size"], False),)
