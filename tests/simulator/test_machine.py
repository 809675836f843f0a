"""Whole programs on the machine: bit-exact results, known cycle counts, and every illegal
program the machine must reject."""

import dataclasses

import numpy as np
import pytest

from simulator import isa, machine
from simulator.arch import Arch
from simulator.errors import SimulatorError
from simulator.program import Program
from tests.simulator.sim_programs import gemm_data, gemm_program, gemm_reference

ARCH = Arch.load("default")


def program(*insns, arch=ARCH, **kw):
    return Program(arch=arch, instructions=list(insns) + [isa.END()], **kw)


def load(sram=0, dram=0, rows=1, **kw):
    return isa.LOAD(mem="scratchpad", sram=sram, dram=dram, y_size=rows, x_size=1,
                    elem_bytes=16, x_stride=16, y_stride=16, **kw)


@pytest.mark.parametrize("shape", [(32, 16, 16), (1, 1, 1), (100, 7, 13)])
def test_gemm_program_is_bit_exact(shape):
    data = gemm_data(*shape, seed=sum(shape))
    result = machine.run(gemm_program(*data), {"x": data[0]})
    np.testing.assert_array_equal(result.outputs["y"], gemm_reference(*data))


def test_gemm_known_cycles():
    """Worked by hand from the default preset (latency 100, 16 B/cycle, 64 B bursts, 16x16):
    A 512 B: 100 + 32 = 132; W 256 B: 132 + 100 + 16 = 248; bias, 32 broadcast rows of 64 B:
    248 + 100 + 32 * 4 = 476; params 128 B: 476 + 100 + 8 = 584; PRELOAD overlapped: 0;
    COMPUTE, pipelined (preload_overlap): the array is busy max(32, 16) = 32 -> 616, and its
    results land after the skew, 32 + 16 + 16 - 2 = 62 -> 646; REQUANT 32 * 16 / 16 = 32 ->
    678; STORE 512 B: 678 + 100 + 32 = 810."""
    data = gemm_data()
    result = machine.run(gemm_program(*data), {"x": data[0]})
    assert result.timeline.end.tolist() == [132, 248, 476, 584, 584, 616, 678, 810]
    stats = result.stats
    assert stats.cycles == 810 and stats.macs == 32 * 16 * 16
    assert stats.dram_bytes_read == 512 + 256 + 32 * 64 + 128
    assert stats.dram_bytes_written == 512
    assert stats.busy["array"] == 32 and stats.busy["dram"] == 32 + 16 + 128 + 8 + 32
    assert stats.stall["compute.token"] == 584
    assert stats.bound_cycles <= stats.cycles
    assert [layer.name for layer in stats.layers] == ["fc"]


def test_preload_without_overlap_is_scalesim_fold():
    """PRELOAD + COMPUTE = 2R + C + T - 2 (SCALE-Sim's weight-stationary fold)."""
    arch = Arch.load("edge")  # preload_overlap = false, 8 x 8
    r, c, t = arch.array.rows, arch.array.cols, 20
    prog = program(isa.PRELOAD(sp=0, k=8), isa.COMPUTE(sp=0, acc=0, m_inner=t, k=8, n=8),
                   arch=arch)
    assert machine.run(prog).stats.cycles == 2 * r + c + t - 2


def test_queues_overlap_and_dram_port_is_shared():
    prog = program(load(rows=64), isa.STORE(mem="scratchpad", sram=100, dram=4096, y_size=64,
                                            x_size=1, elem_bytes=16, x_stride=16, y_stride=16))
    result = machine.run(prog)
    # both start at 0; the store's transfer waits for the load's on the one DRAM port
    assert result.timeline.start.tolist() == [0, 0]
    assert result.timeline.end.tolist() == [164, 228]
    assert result.stats.stall["store.dram_port"] == 64
    assert result.stats.busy["dram"] == 128 and result.stats.busy["store"] == 228


def test_sync_relays_a_token_from_load_to_vector():
    prog = program(load(rows=1, push_next=True),
                   isa.SYNC(queue="compute", pop_prev=True, push_next=True),
                   isa.LUT(src=0, dst=1, rows=1, table=0, pop_prev=True))
    result = machine.run(prog)
    assert result.timeline.start[2] == result.timeline.end[0] == 101


def test_token_full_backpressure():
    arch = dataclasses.replace(ARCH, queues=dataclasses.replace(ARCH.queues, token_depth=1))
    prog = program(load(push_next=True), load(sram=600, push_next=True),
                   isa.PRELOAD(sp=0, k=1, pop_prev=True),
                   isa.COMPUTE(sp=0, acc=0, m_inner=500, k=1, n=1),
                   isa.PRELOAD(sp=0, k=1, pop_prev=True), arch=arch)
    result = machine.run(prog)
    # the second load may start only once the first token has been popped
    assert result.timeline.start[1] == result.timeline.start[2] == 101
    assert result.stats.stall["load.token_full"] == 0  # the load queue was busy until 101


def expect_error(prog, *patterns):
    with pytest.raises(SimulatorError) as info:
        machine.run(prog)
    for pattern in patterns:
        assert pattern in str(info.value), str(info.value)


def test_scratchpad_address_out_of_range():
    expect_error(program(load(), load(sram=ARCH.scratchpad.rows - 1, rows=2)),
                 "instruction 1 (LOAD", "scratchpad rows [16383, 16385) out of range")


def test_dram_address_out_of_range():
    expect_error(program(load(dram=ARCH.dram.size_bytes - 8)), "instruction 0", "DRAM bytes")


def test_accumulator_out_of_range_names_the_node():
    prog = program(isa.REQUANT(acc=ARCH.accumulator.rows, sp=0, rows=1, param=0),
                   source=("conv7", ""))
    expect_error(prog, "instruction 0 of node 'conv7' (REQUANT", "accumulator rows")


def test_compute_before_any_preload():
    expect_error(program(isa.COMPUTE(sp=0, acc=0, m_inner=1, k=1, n=1)),
                 "only 0 rows")


def test_pop_with_no_push_is_token_underflow():
    expect_error(program(load(), isa.PRELOAD(sp=0, k=1, pop_prev=True)),
                 "instruction 1 (PRELOAD", "token queue underflow")


def test_push_into_full_fifo_never_popped_is_overflow():
    depth = ARCH.queues.token_depth
    loads = [load(sram=n, push_next=True) for n in range(depth + 2)]
    expect_error(program(*loads, isa.PRELOAD(sp=0, k=1, pop_prev=True)),
                 f"instruction {depth + 1} (LOAD", "token queue overflow")


def test_circular_wait_is_deadlock():
    expect_error(program(load(pop_next=True), isa.PRELOAD(sp=0, k=1, pop_prev=True,
                                                          push_prev=True)),
                 "deadlock", "circular wait", "instruction 0 (LOAD", "instruction 1 (PRELOAD")


def test_unconsumed_token_at_end():
    expect_error(program(load(push_next=True)), "1 unconsumed token", "load->compute",
                 "instruction 0 (LOAD")


def test_race_read_after_write_without_token():
    # the LOAD is long and the COMPUTE queue waits for nothing: it would read stale rows
    expect_error(program(load(rows=16), isa.PRELOAD(sp=0, k=16)),
                 "race (read after write)", "instruction 1 (PRELOAD", "instruction 0 (LOAD",
                 "scratchpad rows in [0, 16)")


def test_race_write_after_read_without_token():
    # the PRELOAD reads rows 0-15 at once; the second LOAD overwrites them later without
    # waiting for a "buffer free" token from the compute queue
    expect_error(program(load(sram=100, rows=16), load(rows=16), isa.PRELOAD(sp=0, k=16)),
                 "race (write after read)", "instruction 1 (LOAD", "instruction 2 (PRELOAD")


def test_race_found_through_a_relay_is_ordered():
    # load -> compute -> vector through tokens orders the vector's read of the loaded params
    prog = program(isa.LOAD(mem="accumulator", sram=0, dram=0, y_size=2, x_size=1,
                            elem_bytes=64, x_stride=64, y_stride=64, push_next=True),
                   isa.SYNC(queue="compute", pop_prev=True, push_next=True),
                   isa.REQUANT(acc=2, sp=0, rows=1, param=0, pop_prev=True))
    machine.run(prog)
    unordered = program(prog.instructions[0], isa.SYNC(queue="compute", pop_prev=True),
                        isa.REQUANT(acc=2, sp=0, rows=1, param=0))
    expect_error(unordered, "race (read after write)", "accumulator rows in [0, 2)")
    machine.run(unordered, check_hazards=False)  # the check can be switched off


def test_vector_op_the_arch_lacks(tmp_path):
    text = (Arch.load("edge").to_dict())
    text["vector"]["ops"] = ["REQUANT"]
    arch = Arch.from_dict(text)
    expect_error(program(isa.LUT(src=0, dst=0, rows=1, table=0), arch=arch),
                 "does not support LUT")


def test_program_must_end_with_one_end():
    with pytest.raises(SimulatorError, match="exactly one END"):
        Program(arch=ARCH, instructions=[load()])
    with pytest.raises(SimulatorError, match="exactly one END"):
        Program(arch=ARCH, instructions=[isa.END(), load(), isa.END()])


def test_inputs_checked():
    data = gemm_data()
    prog = gemm_program(*data)
    with pytest.raises(SimulatorError, match="missing"):
        machine.run(prog, {})
    with pytest.raises(SimulatorError, match="expected int8 of shape"):
        machine.run(prog, {"x": data[0].astype(np.int32)})


@pytest.mark.slow
def test_resnet18_sized_program_runs():
    """The synthetic ResNet-18 that benchmarks/bench_sim_speed.py times: legal tokens, a
    layer per convolution. Its speed is the benchmark's to measure (a timed test failed under
    other jobs' load even in CPU seconds: 12-18 s against 8 on a quiet machine)."""
    from examples.synthetic_program import resnet18_program

    prog = resnet18_program(ARCH)
    assert 10**4 <= len(prog.instructions) <= 10**6
    stats = machine.run(prog).stats
    assert stats.bound_cycles <= stats.cycles
    assert len(stats.layers) == 22  # params + 20 convolutions + fc


POOL_ASM = """
; 4x4 pixels of 16 channels, padded with -128 to 6x6, 3x3/2 max-pooled to 2x2
LOAD mem=scratchpad sram=0 dram=0 y_size=4 x_size=4 elem_bytes=16 x_stride=16 y_stride=64 \
pad_top=1 pad_bottom=1 pad_left=1 pad_right=1 pad_value=-128 push_next
SYNC queue=compute pop_prev push_next
MAXPOOL src=0 dst=100 in_h=6 in_w=6 kh=3 kw=3 sh=2 sw=2 pop_prev push_next
STORE mem=scratchpad sram=100 dram=4096 y_size=2 x_size=2 elem_bytes=16 x_stride=16 \
y_stride=32 pop_prev
END
""".replace("\\\n", "")


def test_assembled_maxpool_program():
    """Cycles by hand: LOAD 256 contiguous bytes 100 + 16 = 116; SYNC 0; MAXPOOL 4 windows of
    9 x 16 lanes / 16 = 36 -> 152; STORE 64 contiguous bytes 100 + 4 -> 256."""
    x = np.random.default_rng(3).integers(-128, 128, (4, 4, 16), dtype=np.int8)
    prog = Program(arch=ARCH, instructions=isa.assemble_program(POOL_ASM),
                   dram_image=x.tobytes())
    result = machine.run(prog)
    padded = np.pad(x, ((1, 1), (1, 1), (0, 0)), constant_values=-128)
    want = np.array([[padded[y:y + 3, x0:x0 + 3].max(axis=(0, 1)) for x0 in (0, 2)]
                     for y in (0, 2)])
    got = result.state.dram[0][4096:4096 + want.size].view(np.int8).reshape(want.shape)
    np.testing.assert_array_equal(got, want)
    assert result.timeline.end.tolist() == [116, 116, 152, 256]
    assert result.stats.cycles == 256


def test_empty_program():
    result = machine.run(program(arch=Arch.load("edge")))
    assert result.stats.cycles == 0 and result.stats.to_report()["layers"] == []
