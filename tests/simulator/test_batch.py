"""Batched execution: a batch of samples runs every instruction once for all of them, and each
sample's result must be bit for bit what it gives alone; the functional plan (fused chains of
array passes, LOADs shared by the samples) must change no value."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backend.codegen.host import run_segment
from compiler.backend.program import BackendOptions
from compiler.pipeline import compile_int8
from quantizer.errors import QuantizeError
from simulator import isa, machine, plan
from simulator.arch import Arch
from simulator.errors import SimulatorError
from simulator.machine import State
from simulator.units.vector import ParamBlock, layernorm_table_rows
from tests.e2e.flow import quantized
from tests.e2e.test_random_graphs import random_model

ARCH = Arch.load("default")
L = ARCH.lanes
SAMPLES = 3


def _memories(rng: np.random.Generator) -> State:
    """A state of SAMPLES samples with different random memories: parameter blocks with valid
    shifts at accumulator row 40 (and a bias row), tables of each kind at their rows."""
    state = State(ARCH, SAMPLES)
    state.scratchpad[...] = rng.integers(-128, 128, state.scratchpad.shape)
    state.accumulator[...] = rng.integers(-(2**20), 2**20, state.accumulator.shape)
    for sample in range(SAMPLES):
        block = ParamBlock(rng.integers(2**30, 2**31, L), rng.integers(-4, 12, L),
                           rng.integers(-(2**20), 2**20, L))
        packed = np.frombuffer(block.pack(L), "<i4").reshape(-1, L)
        state.accumulator[sample, 40:43] = packed
        # softmax's exp table (decreasing, entry 0 = 2^20) at row 60, log entries after it
        exp = np.round(2**20 * np.exp(-0.05 * np.arange(256))).astype(np.int64)
        log = np.round(np.log1p(np.arange(257) / 256) / 0.05 * 2**7).astype(np.int64)
        flat = np.concatenate([exp, log])
        flat = np.concatenate([flat, np.zeros(-len(flat) % L, np.int64)])
        state.accumulator[sample, 60:60 + len(flat) // L] = flat.reshape(-1, L)
        # layernorm parameters for 20 channels at row 100: eps, multipliers, shifts, biases
        c = 20
        table = np.concatenate([[rng.integers(1, 100)], rng.integers(2**30, 2**31, c),
                                rng.integers(0, 8, c), rng.integers(-500, 500, c)])
        table = np.concatenate([table, np.zeros(-len(table) % L, np.int64)])
        state.accumulator[sample, 100:100 + layernorm_table_rows(L, c)] = table.reshape(-1, L)
        state.accumulator[sample, 130, :2] = [2**30 + sample, 3]  # an l2 rescale
    image = rng.integers(0, 256, 8192).astype(np.uint8)
    state.dram = np.tile(image, (SAMPLES, 1))
    state.dram[:, 100:116] = np.array([[1, 2, 0, 3]] * SAMPLES, "<i4").view(np.uint8) \
        + np.arange(SAMPLES, dtype=np.uint8)[:, None] * (np.arange(16) % 4 == 0)
    return state


INSTRUCTIONS = {
    "LOAD": isa.LOAD(mem="scratchpad", sram=500, dram=1000, y_size=3, x_size=4, elem_bytes=12,
                     x_stride=20, y_stride=100, pad_top=1, pad_left=2, pad_value=-7),
    "LOAD turned": isa.LOAD(mem="scratchpad", sram=500, dram=1003, y_size=L - 2, x_size=7,
                            elem_bytes=1, x_stride=1, y_stride=40, transpose=1),
    "STORE": isa.STORE(mem="accumulator", sram=7, dram=3000, y_size=2, x_size=3,
                       elem_bytes=4 * L, x_stride=4 * L, y_stride=400),
    "GATHER": isa.GATHER(index=100, count=4, table=2000, rows=7, row_bytes=5, table_stride=40,
                         dst=5000, dst_stride=8),
    "REQUANT": isa.REQUANT(acc=0, sp=600, rows=9, param=40, bias=1, out_offset=3),
    "REQUANT wide": isa.REQUANT(acc=0, sp=600, rows=9, param=40, wide=1),
    "ADD": isa.ADD(a=10, b=30, dst=600, rows=7, param=40, a_offset=3, b_offset=-5),
    "ADD max": isa.ADD(a=10, b=30, dst=600, rows=7, param=40, op="max", b_once=1),
    "ADD hypot": isa.ADD(a=10, b=30, dst=600, rows=7, param=40, op="hypot", a_wide=1, b_wide=1),
    "MUL": isa.MUL(a=10, b=30, dst=600, rows=7, param=40, b_step=0, b_splat=1),
    "MAXPOOL": isa.MAXPOOL(src=0, dst=600, in_h=6, in_w=5, kh=3, kw=2, sh=2, sw=1),
    "AVGPOOL": isa.AVGPOOL(src=0, dst=600, in_h=6, in_w=5, kh=3, kw=2, sh=1, sw=2, param=40,
                           in_offset=4),
    "LUT": isa.LUT(src=10, dst=600, rows=9, table=300),
    "LUT per lane": isa.LUT(src=10, dst=600, rows=9, table=300, per_lane=1),
    "SOFTMAX": isa.SOFTMAX(src=0, dst=600, rows=5, n=4, blocks=2, stride=20, table=60),
    "SOFTMAX log": isa.SOFTMAX(src=0, dst=600, rows=5, n=4, blocks=2, stride=20, table=60,
                               log=1, shift=7, out_offset=127),
    "LAYERNORM": isa.LAYERNORM(src=0, dst=600, rows=5, n=4, blocks=2, stride=20, table=100),
    "REDUCE l2": isa.REDUCE(src=0, dst=600, rows=5, n=4, blocks=2, stride=20, table=130,
                            op="l2", in_offset=2),
    "REDUCE max": isa.REDUCE(src=0, dst=600, rows=5, n=4, blocks=2, stride=20, op="max"),
}


@pytest.mark.parametrize("name", list(INSTRUCTIONS))
def test_every_instruction_on_a_batch_equals_it_on_each_sample_alone(name):
    """Samples with different memories (tables and parameter blocks included, so the units'
    per-sample paths run, not only the shared ones)."""
    insn = INSTRUCTIONS[name]
    batch = _memories(np.random.default_rng(5))
    alone = [batch.sample(n) for n in range(SAMPLES)]
    alone = [_copy(one) for one in alone]
    insn.op.run(batch, insn)
    for n, one in enumerate(alone):
        insn.op.run(one, insn)
        for got, want in ((batch.scratchpad[n], one.scratchpad[0]),
                          (batch.accumulator[n], one.accumulator[0]),
                          (batch.dram[n], one.dram[0])):
            np.testing.assert_array_equal(got, want, err_msg=f"sample {n}")


def test_array_passes_with_each_samples_own_weights():
    batch = _memories(np.random.default_rng(6))
    alone = [_copy(batch.sample(n)) for n in range(SAMPLES)]
    for insn in (isa.PRELOAD(sp=200, k=L, w_offset=3),
                 isa.COMPUTE(sp=5, acc=20, m_outer=3, m_inner=4, outer_stride=6, k=L, n=L - 2,
                             x_offset=-2),
                 isa.COMPUTE(sp=9, acc=20, m_inner=12, k=L - 1, n=L - 2, accumulate=1)):
        insn.op.run(batch, insn)
        for one in alone:
            insn.op.run(one, insn)
    assert batch.shared_weights is None  # the samples latched different tiles
    for n, one in enumerate(alone):
        np.testing.assert_array_equal(batch.accumulator[n], one.accumulator[0])


def test_a_bad_index_names_its_sample():
    """The indexed DMA's error in a batch says which sample held the index."""
    state = _memories(np.random.default_rng(7))
    state.dram[2, 104:108] = np.array([9], "<i4").view(np.uint8)
    with pytest.raises(SimulatorError, match="index 9 at DRAM 104") as error:
        INSTRUCTIONS["GATHER"].op.run(state, INSTRUCTIONS["GATHER"])
    assert error.value.sample == 2


def _copy(state: State) -> State:
    """A state of its own (not views of a batch's memories)."""
    copy = state.sample(0)
    copy.dram, copy.scratchpad = state.dram.copy(), state.scratchpad.copy()
    copy.accumulator = state.accumulator.copy()
    copy.memories = (copy.scratchpad, copy.accumulator)
    return copy


def _random_program(seed: int):
    """A compiled random graph (`tests.e2e.test_random_graphs`), or None when it draws one
    that cannot be quantized."""
    rng = np.random.default_rng(seed)
    pick = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    proto, calibration, _ = random_model(pick)
    if not proto.graph.node:
        return None
    try:
        qgraph = quantized(proto, calibration)
    except QuantizeError:
        return None
    preset = ("edge", "default", "large")[seed % 3]
    return compile_int8(qgraph, Arch.load(preset), BackendOptions(bool(seed % 2))).program


@pytest.fixture(scope="module")
def programs():
    found = [p for p in map(_random_program, range(24)) if p is not None]
    assert len(found) >= 12
    return found


@pytest.mark.parametrize("size", [1, 2, 5])
def test_random_programs_in_batches_equal_each_sample_alone(programs, size):
    """Five samples in batches of 1, 2 (the last batch short) and 5."""
    rng = np.random.default_rng(size)
    for program in programs:
        samples = [{b.name: _sample(rng, b) for b in program.inputs} for _ in range(5)]
        ready = machine.Machine(program, host=run_segment)
        for start in range(0, 5, size):
            group = samples[start:start + size]
            got = ready.outputs({b.name: np.stack([s[b.name] for s in group])
                                 for b in program.inputs}, first=start)
            for n, sample in enumerate(group):
                alone = machine.run(program, sample, host=run_segment).outputs
                for name, want in alone.items():
                    np.testing.assert_array_equal(got[name][n], want)


def test_the_plan_changes_no_value(programs):
    """Each program's plan (chains fused, their reads captured before what overwrites them,
    constant LOADs shared) against its instructions applied one by one in the order they
    start, every local row and every DRAM byte at the end; some plans must capture a chain's
    reads early, or the rule that does it goes untested."""
    early = chained = shared = 0
    rng = np.random.default_rng(11)
    for program in programs:
        ready = machine.Machine(program, host=run_segment)
        chained += any(type(step) is plan.Finish and step.chain.computes > 1
                       for step in ready.plan)
        early += sum(type(step) is plan.Capture for step in ready.plan)
        shared += any(type(step) is plan.ConstantLoad for step in ready.plan)
        inputs = {b.name: np.stack([_sample(rng, b) for _ in range(2)]) for b in program.inputs}
        fused = ready.execute(inputs)
        plain = State(program.arch, 2, ready.dram_bytes)
        plain.host, plain.host_segments = run_segment, ready.segments
        plain.dram[:, :len(program.dram_image)] = np.frombuffer(program.dram_image, np.uint8)
        for b in program.inputs:
            plain.write(b, inputs[b.name])
        for i in machine._schedule(program, False)[1]:
            program.instructions[i].op.run(plain, program.instructions[i])
        np.testing.assert_array_equal(fused.scratchpad, plain.scratchpad)
        np.testing.assert_array_equal(fused.accumulator, plain.accumulator)
        # DRAM: the bytes the samples do not share (the shared image is never written)
        for lo, hi in [*ready.private]:
            np.testing.assert_array_equal(fused.dram[:, lo:hi], plain.dram[:, lo:hi])
        for b in program.outputs:
            np.testing.assert_array_equal(fused.read(b), plain.read(b))
    assert early > 0 and chained > len(programs) // 2 and shared > len(programs) // 2, \
        (early, chained, shared)


def _sample(rng: np.random.Generator, binding) -> np.ndarray:
    if binding.dtype == "int32":
        return rng.integers(0, 4, binding.shape).astype(np.int32)
    if binding.dtype == "float32":
        return rng.standard_normal(binding.shape).astype(np.float32)
    lo, hi = (0, 256) if binding.dtype == "uint8" else (-128, 128)
    return rng.integers(lo, hi, binding.shape).astype(binding.dtype)


def test_the_cycle_collector_is_paused_only_while_the_tables_are_built(programs):
    """`machine.gc_paused` around the timing, race check and plan: enabled again afterwards,
    after an error too, and left off when the caller had it off."""
    import gc

    ready = machine.Machine(programs[0], host=run_segment)
    assert gc.isenabled()
    with pytest.raises(SimulatorError, match="race"):
        machine.Machine(_racy_program())
    assert gc.isenabled()
    gc.disable()
    try:
        ready.stats
        machine.Machine(programs[0], host=run_segment)
        assert not gc.isenabled()
    finally:
        gc.enable()


def _racy_program():
    from simulator.program import IOBinding, Program
    load = isa.LOAD(mem="scratchpad", sram=0, dram=0, y_size=1, x_size=1, elem_bytes=16,
                    x_stride=16, y_stride=16)
    return Program(arch=ARCH, instructions=[load, isa.PRELOAD(sp=0, k=1), isa.END()],
                   inputs=(IOBinding("x", 0, (16,), 1.0, 0),))
