"""The machine's units: each module holds the semantics (`run`) and costs (`cycles`, `work`)
that the rows of `simulator.isa` point to.

Every memory has a leading sample axis (`machine.State`): the units run one instruction on a
batch of samples at once, each sample's result the one a run of that sample alone gives. Where
an instruction reads parameters from memory (a weight tile, a parameter block, a table), the
samples almost always hold the same ones (the program's DRAM image): `shared` finds that case,
for one product or one lookup for the whole batch; otherwise each sample uses its own."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simulator.errors import SimulatorError


class Work(NamedTuple):
    """What one instruction does, known from its fields alone: the report's roofline and the
    energy model add these up. `*_end` is one past the last local row written (0: none)."""

    macs: int = 0
    dram_read: int = 0
    dram_written: int = 0
    local_bytes: int = 0
    scratchpad_end: int = 0
    accumulator_end: int = 0


# The local memories, in the order of their ids (the `mem` field, `Access.mem`).
MEMORIES = ("scratchpad", "accumulator")
SCRATCHPAD, ACCUMULATOR = range(len(MEMORIES))


class Access(NamedTuple):
    """Local rows [start, stop) of memory `mem` that an instruction reads or writes; the
    machine's hazard check compares these across queues."""

    mem: int
    start: int
    stop: int
    write: bool


def rows(memory: np.ndarray, start: int, count: int, name: str) -> slice:
    """The slice of rows [start, start + count) of a local memory (samples, rows, lanes), or an
    error naming it: index it as `memory[:, rows(...)]`."""
    if start + count > memory.shape[1]:
        raise SimulatorError(f"{name} rows [{start}, {start + count}) out of range "
                             f"[0, {memory.shape[1]})")
    return slice(start, start + count)


def shared(values: np.ndarray) -> np.ndarray | None:
    """values[0] when every sample (the leading axis) holds the same values, else None."""
    first = values[0]
    if len(values) == 1 or (values[1:] == first).all():
        return first
    return None


def dram_span(addr: int, shape: tuple[int, ...], strides: tuple[int, ...],
              item: int = 1) -> tuple[int, int]:
    """The bytes [lo, hi) a strided tensor of `item`-byte elements at `addr` touches ((addr,
    addr) when empty). Both ends: a negative stride reaches below `addr`."""
    if len(strides) != len(shape) or any(n < 0 for n in shape):
        raise SimulatorError(f"shape {list(shape)} with strides {list(strides)}: expected "
                             f"non-negative sizes and one stride per dimension")
    if 0 in shape:
        return addr, addr
    lo = addr + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = addr + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + item
    return lo, hi


def dram_view(dram: np.ndarray, addr: int, shape: tuple[int, ...], strides: tuple[int, ...],
              writeable: bool = True) -> np.ndarray:
    """A strided view (samples, *shape) of the samples' DRAM `dram` (samples, bytes), built only
    once every byte it reaches is inside (`as_strided` itself checks nothing: a view past either
    end reads or writes any memory)."""
    lo, hi = dram_span(addr, shape, strides)
    samples, size = dram.shape
    if 0 in shape:
        return np.zeros((samples, *shape), np.uint8)
    if lo < 0 or hi > size:
        raise SimulatorError(f"DRAM bytes [{lo}, {hi}) out of range [0, {size})")
    return np.lib.stride_tricks.as_strided(dram[:, addr:], (samples, *shape),
                                           (dram.strides[0], *strides), writeable=writeable)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
