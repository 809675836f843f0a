"""Scheduling (`compiler.backend.schedule.schedule`): a few Steps in, the program order and its
dependency tokens out. Each test writes the Steps codegen would hand over (Before) and the
instruction stream the scheduler must make of them (Expected), each instruction as its
mnemonic, the local row it works on and the token flags the hazards require."""

from __future__ import annotations

from compiler.backend.schedule import Scheduled, schedule
from compiler.backend.steps import Op, Step
from simulator import isa
from simulator.arch import Arch

EDGE = Arch.load("edge")  # 8 lanes: a scratchpad row is 8 bytes
ROW_BYTES = 8


def _load(sram: int, dram: int, rows: int, mem: str = "scratchpad",
          constant: bool = False) -> Op:
    """A LOAD of `rows` contiguous rows: of an activation, whose DRAM bytes the scheduler
    checks for hazards, or of a constant from the image, which nothing writes."""
    row_bytes = ROW_BYTES * (4 if mem == "accumulator" else 1)
    access = () if constant else ((dram, dram + rows * row_bytes, False),)
    return Op(isa.LOAD, dict(mem=mem, sram=sram, dram=dram, y_size=rows, x_size=1,
                             elem_bytes=row_bytes, x_stride=row_bytes, y_stride=row_bytes),
              "conv", access)


def _store(sram: int, dram: int, rows: int) -> Op:
    return Op(isa.STORE, dict(mem="scratchpad", sram=sram, dram=dram, y_size=rows, x_size=1,
                              elem_bytes=ROW_BYTES, x_stride=ROW_BYTES, y_stride=ROW_BYTES),
              "conv", ((dram, dram + rows * ROW_BYTES, True),))


def _tile(x_row: int, acc_row: int, out_row: int, dram: int) -> Step:
    """One 4-pixel tile of a 1x1 convolution: load its input, multiply by the weights in rows
    0-7, requantize with the parameters in accumulator rows 0-2, store."""
    return Step((_load(x_row, dram, 4),),
                (Op(isa.PRELOAD, dict(sp=0, k=8), "conv"),
                 Op(isa.COMPUTE, dict(sp=x_row, acc=acc_row, m_inner=4, k=8, n=8), "conv"),
                 Op(isa.REQUANT, dict(acc=acc_row, sp=out_row, rows=4, param=0), "conv"),
                 _store(out_row, dram + 4096, 4)))


def _stream(scheduled: Scheduled) -> list[str]:
    """Each instruction as 'MNEMONIC row flags...': the local row it reads or writes (the
    queue, for a SYNC) and its token flags."""
    lines = []
    for insn in scheduled.instructions:
        args = insn.args
        row = (f"queue={isa.QUEUES[args['queue']]}" if insn.op is isa.SYNC else
               next((f"{name}={args[name]}" for name in ("sram", "sp") if name in args), ""))
        flags = [name for name, bit in (("pop_prev", isa.POP_PREV), ("pop_next", isa.POP_NEXT),
                                        ("push_prev", isa.PUSH_PREV),
                                        ("push_next", isa.PUSH_NEXT)) if insn.deps & bit]
        lines.append(" ".join([insn.op.mnemonic, row, *flags]).strip())
    return lines


def _layer(x_rows: tuple[int, int]) -> list[Step]:
    """Weights, parameters and the first tile's input, then a second tile: x_rows are the two
    tiles' input rows (two buffers, or the same one twice)."""
    first = _tile(x_rows[0], 8, 16, 1024)
    constants = (_load(0, 0, 8, constant=True), _load(0, 64, 3, "accumulator", constant=True))
    return [Step(constants + first.loads, first.body), _tile(x_rows[1], 12, 20, 1056)]


def test_double_buffering_loads_the_next_tile_before_this_one_computes() -> None:
    """Two buffers: tile 1's LOAD moves ahead of tile 0's work. Each consumer pops one token
    from its neighbour's producer: PRELOAD waits for the weights, COMPUTE for its input,
    REQUANT for the accumulators, STORE for the requantized rows. The parameters need no
    token of their own: REQUANT already follows them through COMPUTE, which follows a later
    LOAD of the same in-order queue."""
    expected = [
        "LOAD sram=0 push_next",   # weights
        "LOAD sram=0",             # parameters (accumulator rows)
        "LOAD sram=8 push_next",   # tile 0's input
        "LOAD sram=12 push_next",  # tile 1's input, ahead of tile 0's work
        "PRELOAD sp=0 pop_prev",
        "COMPUTE sp=8 pop_prev push_next",
        "REQUANT sp=16 pop_prev push_next",
        "STORE sram=16 pop_prev",
        "PRELOAD sp=0",            # the weights are still there: no token
        "COMPUTE sp=12 pop_prev push_next",
        "REQUANT sp=20 pop_prev push_next",
        "STORE sram=20 pop_prev",
        "END",
    ]
    scheduled = schedule([_layer((8, 12))], EDGE, double_buffer=True)
    assert _stream(scheduled) == expected
    assert scheduled.syncs == 0


def test_one_buffer_makes_the_next_load_wait_for_the_compute_that_reads_it() -> None:
    """Both tiles in input rows 8-11 without double buffering: the steps run one after
    another, and tile 1's LOAD (write after read) waits for tile 0's COMPUTE, which pushes a
    token back to the load queue."""
    expected = [
        "LOAD sram=0 push_next",
        "LOAD sram=0",
        "LOAD sram=8 push_next",
        "PRELOAD sp=0 pop_prev",
        "COMPUTE sp=8 pop_prev push_prev push_next",  # frees rows 8-11 for the next LOAD
        "REQUANT sp=16 pop_prev push_next",
        "STORE sram=16 pop_prev",
        "LOAD sram=8 pop_next push_next",
        "PRELOAD sp=0",
        "COMPUTE sp=8 pop_prev push_next",
        "REQUANT sp=20 pop_prev push_next",
        "STORE sram=20 pop_prev",
        "END",
    ]
    assert _stream(schedule([_layer((8, 8))], EDGE, double_buffer=False)) == expected


def test_the_next_layer_waits_for_the_store_of_the_bytes_it_reads() -> None:
    """A second layer reads tile 0's output (DRAM 5120-5151): read after write on DRAM, from
    the store queue back to the load queue, two queues away, so the token is relayed by a
    SYNC on each queue in between. Tile 0's STORE pushes it; tile 1's STORE, of other bytes,
    pushes none."""
    second = [Step((_load(40, 4096 + 1024, 4),), ())]
    stream = _stream(schedule([_layer((8, 12)), second], EDGE, double_buffer=True))
    assert stream[7:] == [
        "STORE sram=16 pop_prev push_prev",
        "PRELOAD sp=0",
        "COMPUTE sp=12 pop_prev push_next",
        "REQUANT sp=20 pop_prev push_next",
        "STORE sram=20 pop_prev",
        "SYNC queue=vector pop_next push_prev",
        "SYNC queue=compute pop_next push_prev",
        "LOAD sram=40 pop_next",
        "END",
    ]
