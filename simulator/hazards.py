"""Race detection: every cross-queue access to a local memory must be ordered by tokens.

Timing can hide a missing token (the reader happens to start late), so the machine does not
trust it: each instruction carries a vector clock, one entry per queue, holding the index of the
latest instruction of that queue known to happen before it (its own queue in program order,
other queues through the tokens it and its queue's earlier instructions popped; a token carries
its pusher's clock). For every local row the checker remembers, per queue, the last instruction
that wrote it and the last that read it. An access races when a conflicting access from another
queue (write/write, write then read, read then write) is not covered by the clock. DRAM accesses
are not checked.
"""

from __future__ import annotations

import numpy as np

from simulator.errors import SimulatorError
from simulator.units import MEMORIES

_NONE = -1
_max_rows = np.maximum.reduce


class Hazards:
    """Per memory, a (2 * queues, rows) table: line q holds the last writer of each row on queue
    q, line queues + q the last reader (instruction indices, -1: none). One reduction over a
    contiguous slice per access keeps the check cheap enough to be on by default."""

    def __init__(self, memory_rows: tuple[int, ...], queues: int, describe):
        self.tables = [np.full((2 * queues, n), _NONE, np.int32) for n in memory_rows]
        self.queues = queues
        self.describe = describe  # instruction index -> text naming it

    def check(self, index: int, queue: int, clock: list[int], accesses) -> None:
        """Raise if instruction `index` on `queue`, with vector clock `clock`, races; then
        record its accesses."""
        nq = self.queues
        for mem, start, stop, write in accesses:
            table = self.tables[mem]
            if start >= min(stop, table.shape[1]):
                continue  # out of range: the unit reports it
            last = _max_rows(table[:, start:stop], axis=1).tolist()
            for other in range(nq):
                if other == queue:
                    continue
                if last[other] > clock[other]:
                    self._fail(index, mem, start, stop, write, last[other], "writes")
                if write and last[nq + other] > clock[other]:
                    self._fail(index, mem, start, stop, write, last[nq + other], "reads")
        for mem, start, stop, write in accesses:
            self.tables[mem][queue if write else nq + queue, start:stop] = index

    def _fail(self, index, mem, start, stop, write, other, verb):
        name = MEMORIES[mem]
        kind = {(False, "writes"): "read after write", (True, "writes"): "write after write",
                (True, "reads"): "write after read"}[(write, verb)]
        raise SimulatorError(
            f"race ({kind}): {self.describe(index)} {'writes' if write else 'reads'} {name} "
            f"rows in [{start}, {stop}) that {self.describe(other)} {verb}, and no dependency "
            f"token orders the two")
