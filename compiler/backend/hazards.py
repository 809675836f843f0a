"""The scheduler's first pass: for each instruction of the program order, the latest earlier
instruction of each other queue it must wait for, from the hazards on the local rows and the
activation DRAM it reads and writes (read after write, write after read, write after write).

An instruction's local accesses are `InsnDef.access` (the function the machine's race check
uses); its DRAM accesses are the byte intervals of `Op.dram` (`compiler.backend.codegen.emit.
relocate`). A read waits for the last writer on each other queue of any row it reads; a write
waits for the last access of any kind. Nothing here depends on tokens, so the whole program is
searched before any token is placed (`compiler.backend.schedule`), and the local memories, which
every instruction touches, as array operations over a few thousand instructions at a time: row
maxima taken one instruction at a time were half of the scheduler's 6.3 s for ResNet-18 on the
edge preset (783k instructions).
"""

from __future__ import annotations

import numpy as np

from simulator import isa
from simulator.arch import Arch

NQ = len(isa.QUEUES)
# Instructions searched at once: each pass builds (instructions × distinct accesses) arrays,
# of at most _MAX_CELLS elements (a chunk with more distinct accesses is split).
_CHUNK = 4096
_MAX_CELLS = 1 << 22
_DRAM_BLOCK_BYTES = 16  # the DRAM hazard table's granularity (activations are 64-B aligned)
_DRAM_MAX_BLOCKS = 1 << 22


def distinct(insns: list[isa.Insn]) -> tuple[list[isa.Insn], np.ndarray]:
    """The distinct instructions of a program order (ops share their Insns, `Op.insn`: a tiled
    layer repeats the same few) and each op's index among them."""
    ids = np.fromiter(map(id, insns), np.int64, len(insns))
    _, first, which = np.unique(ids, return_index=True, return_inverse=True)
    return [insns[i] for i in first.tolist()], which


def waits(unique: list[isa.Insn], which: np.ndarray, drams: list[tuple], queues: np.ndarray,
          arch: Arch) -> np.ndarray:
    """wait[i, p]: the index of the latest op of queue p before op i that op i must follow;
    -1 for none, and always for its own queue (a queue runs in order). Per op, in program
    order: its instruction without flags, unique[which[i]] (`distinct`), its DRAM accesses
    (`Op.dram`) and its queue's index."""
    wait = _local_waits(unique, which, queues, arch)
    _add_dram_waits(drams, queues, wait)
    wait[np.arange(len(which)), queues] = -1
    return wait


# -- local memories --

def _signatures(unique: list[isa.Insn], arch: Arch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each instruction's signature (the id of its set of local accesses), each signature's
    access ids (padded with -1), and each access id's (mem, start, stop, write). An access is
    clipped to its memory's rows: the part past them is no row."""
    accesses: dict[tuple, int] = {}
    signatures: dict[tuple, int] = {}
    rows = [memory.rows for memory in arch.memories]
    signature = []
    for insn in unique:
        ids = []
        for mem, start, stop, write in insn.op.access(arch, insn):
            stop = min(stop, rows[mem])
            if start < stop:
                ids.append(accesses.setdefault((mem, start, stop, bool(write)), len(accesses)))
        signature.append(signatures.setdefault(tuple(ids), len(signatures)))
    width = max(map(len, signatures), default=0) or 1
    members = np.full((len(signatures), width), -1, np.int64)
    for ids, s in signatures.items():
        members[s, :len(ids)] = ids
    return (np.array(signature, np.int64), members,
            np.array(list(accesses) or [(0, 0, 0, 0)], np.int64))


def _local_waits(unique: list[isa.Insn], which: np.ndarray, queues: np.ndarray,
                 arch: Arch) -> np.ndarray:
    signature, members, accesses = _signatures(unique, arch)
    signature = signature[which]
    wait = np.full((len(which), NQ), -1, np.int64)
    # Per memory row, the last op of each queue that wrote it, then that accessed it at all:
    # what the chunks searched so far leave to the next. One more row, never written, lets a
    # reduction over an access end at the memory's last row (`_carried`).
    tables = [np.full((memory.rows + 1, 2 * NQ), -1, np.int64) for memory in arch.memories]
    for first in range(0, len(which), _CHUNK):
        chunk = slice(first, min(first + _CHUNK, len(which)))
        wait[chunk] = _chunk_waits(first, signature[chunk], queues[chunk], members, accesses,
                                   tables)
    return wait


def _chunk_waits(first: int, signature: np.ndarray, queues: np.ndarray, members: np.ndarray,
                 accesses: np.ndarray, tables: list[np.ndarray]) -> np.ndarray:
    """The waits of ops first, first + 1, ... (their signatures and queues given), on the
    local memories; then their accesses are added to `tables`.

    A column is one (access, queue) that occurs in the chunk. For each queue p, the ops of the
    other queues ask which of p's columns occurred last before them: a table of (asking op ×
    p's columns) receives each occurrence's index in the row of the first op to ask after it,
    and a running maximum down the table carries it to every later one. An op waits for the
    latest of the columns it conflicts with (same memory, overlapping rows, one of the two a
    write), and for what the tables say of the ops before the chunk."""
    present, of_op = np.unique(signature, return_inverse=True)  # the chunk's signatures
    slots = members[present]
    pair_op, pair_slot = np.nonzero(slots[of_op] >= 0)  # each (op, access) of the chunk
    pair_access = slots[of_op[pair_op], pair_slot]
    columns, pair_column = np.unique(pair_access * NQ + queues[pair_op], return_inverse=True)
    column_access, column_queue = columns // NQ, columns % NQ
    pair_index = first + pair_op
    used = np.unique(pair_access)
    count = len(signature)
    if max(count, len(used), slots.size) * len(columns) > _MAX_CELLS and count > 1:
        half = count // 2  # (the first half's accesses are in the tables before the second's)
        return np.concatenate([
            _chunk_waits(first, signature[:half], queues[:half], members, accesses, tables),
            _chunk_waits(first + half, signature[half:], queues[half:], members, accesses,
                         tables)])
    slot_used = np.searchsorted(used, slots)  # each slot's access among `used`; padding: past
    slot_used[slots < 0] = len(used)
    conflict = _conflicts(accesses[used], accesses[column_access])[slot_used].any(axis=1)
    wait = _carried(tables, accesses[used])[slot_used].max(axis=1)[of_op]
    for p in range(NQ):
        on_p = column_queue == p
        asking = np.flatnonzero(queues != p)
        if not on_p.any() or not len(asking):
            continue
        pairs = np.flatnonzero(on_p[pair_column])
        last = np.full((len(asking) + 1, int(on_p.sum())), -1, np.int64)
        np.maximum.at(last, (np.searchsorted(asking, pair_op[pairs]),
                             (np.cumsum(on_p) - 1)[pair_column[pairs]]), pair_index[pairs])
        np.maximum.accumulate(last, axis=0, out=last)
        hits = conflict[:, on_p][of_op[asking]]
        wait[asking, p] = np.maximum(wait[asking, p],
                                     np.where(hits, last[:-1], -1).max(axis=1))
    _record(tables, accesses, column_access, column_queue, pair_column, pair_index)
    return wait


def _conflicts(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """hazard[a, c]: whether access mine[a] and access theirs[c] (rows of (mem, start, stop,
    write)) are a hazard: the same memory, overlapping rows, one of them a write. One more row
    of False, for the padding slots."""
    a, c = mine.T[:, :, None], theirs.T
    hazard = (a[0] == c[0]) & (a[1] < c[2]) & (c[1] < a[2]) & ((a[3] | c[3]) != 0)
    return np.vstack([hazard, np.zeros((1, len(theirs)), bool)])


def _carried(tables: list[np.ndarray], used: np.ndarray) -> np.ndarray:
    """Per access (rows of (mem, start, stop, write)), the latest op of each queue before the
    chunk that it waits for: over the rows it touches, their last writers (a read) or last
    accesses of any kind (a write). One more row of -1, for the padding slots."""
    wait = np.full((len(used) + 1, NQ), -1, np.int64)
    for mem, table in enumerate(tables):
        mine = np.flatnonzero(used[:, 0] == mem)
        if not len(mine):
            continue
        start_stop = used[mine, 1:3].ravel()  # start < stop <= rows: a range each
        maxima = np.maximum.reduceat(table, start_stop, axis=0)[::2]
        wait[mine] = np.where(used[mine, 3:] != 0, maxima[:, NQ:], maxima[:, :NQ])
    return wait


def _record(tables: list[np.ndarray], accesses: np.ndarray, column_access: np.ndarray,
            column_queue: np.ndarray, pair_column: np.ndarray, pair_index: np.ndarray) -> None:
    """Write each column's last occurrence into the tables, the earliest first, so that a row
    several columns touch ends with the latest."""
    last = np.full(len(column_access), -1, np.int64)
    np.maximum.at(last, pair_column, pair_index)
    by_time = np.argsort(last)
    for (mem, start, stop, write), q, index in zip(accesses[column_access[by_time]].tolist(),
                                                   column_queue[by_time].tolist(),
                                                   last[by_time].tolist()):
        table = tables[mem]
        if write:
            table[start:stop, q] = index
        table[start:stop, NQ + q] = index


# -- DRAM --

def _add_dram_waits(drams: list[tuple], queues: np.ndarray, wait: np.ndarray) -> None:
    """Raise `wait` by the DRAM hazards. Only the DMAs of activations, and the few other
    instructions that name one, touch activation DRAM, and most of them only read it: a read
    waits only for writers, so the reads between two writing ops all see the same table and
    are searched together (`_DramTable.read`); each writing op is searched alone."""
    touching = [(i, dram) for i, dram in enumerate(drams) if dram]
    spans = [(access[0], access[1]) for _, dram in touching for access in dram]
    if not spans:
        return
    table = _DramTable(min(s for s, _ in spans), max(s for _, s in spans))
    reads: list[tuple[int, tuple]] = []  # the reading ops since the last writing one
    for i, dram in touching:
        if not any(access[2] for access in dram):
            reads.append((i, dram))
            continue
        table.read(reads, queues, wait)
        reads = []
        wait[i] = np.maximum(wait[i], table.needs(dram))
        table.record(dram, i, int(queues[i]))
    table.read(reads, queues, wait)


class _DramTable:
    """Per DRAM block of `block` bytes from `base`: the last writer of each queue, then the
    last reader (a block is conservative: accesses sharing one are ordered). Blocks grow past
    _DRAM_BLOCK_BYTES only for a span too large for the table."""

    def __init__(self, start: int, stop: int):
        self.base = start
        self.block = _DRAM_BLOCK_BYTES
        while (stop - start) // self.block > _DRAM_MAX_BLOCKS:
            self.block *= 2
        self.last = np.full((max(-(-(stop - start) // self.block), 1), 2 * NQ), -1, np.int64)
        self._strided: dict[tuple, np.ndarray] = {}  # a strided access → its blocks

    def needs(self, dram: tuple) -> list[int]:
        """What one op waits for: a read, the blocks' last writers; a write, their last
        accesses of any kind."""
        need = [-1] * NQ
        for start, stop, write, *pattern in dram:
            if stop <= start:
                continue
            last = np.maximum.reduce(self.last[self._blocks(start, stop, pattern)]).tolist()
            last = list(map(max, last[:NQ], last[NQ:])) if write else last[:NQ]
            need = list(map(max, need, last))
        return need

    def record(self, dram: tuple, index: int, queue: int) -> None:
        for start, stop, write, *pattern in dram:
            if stop > start:
                self.last[self._blocks(start, stop, pattern), queue if write else NQ + queue] = index

    def read(self, reads: list[tuple[int, tuple]], queues: np.ndarray,
             wait: np.ndarray) -> None:
        """Raise the waits of reading ops (index, accesses) that no write separates by their
        blocks' last writers, then record them as the blocks' last readers."""
        blocks, owner = [], []
        for i, dram in reads:
            for start, stop, _, *pattern in dram:
                if stop > start:
                    found = self._blocks(start, stop, pattern)
                    blocks.append(np.arange(found.start, found.stop)
                                  if isinstance(found, slice) else found)
                    owner.append(i)
        if not blocks:
            return
        sizes = np.array([len(b) for b in blocks])
        every = np.concatenate(blocks)
        owner = np.array(owner)
        last = np.maximum.reduceat(self.last[every, :NQ], np.cumsum(sizes) - sizes, axis=0)
        np.maximum.at(wait, owner, last)  # (an op's own queue: `waits` clears it)
        # Indices only grow, so a block read by several of them ends with the latest.
        columns = NQ + queues[np.repeat(owner, sizes)]
        np.maximum.at(self.last.reshape(-1), every * (2 * NQ) + columns,
                      np.repeat(owner, sizes))

    def _blocks(self, start: int, stop: int, pattern=()):
        if not pattern:
            return _dram_blocks(start, stop, pattern, self.base, self.block)
        # A strided tile's blocks: the same tile is loaded again for each block of outputs.
        key = (start, stop, *pattern)
        blocks = self._strided.get(key)
        if blocks is None:
            blocks = self._strided[key] = _dram_blocks(start, stop, pattern, self.base,
                                                       self.block)
        return blocks


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
