"""int16 activations on the array: COMPUTE's `shift` field, the two passes of an int16 operand's
byte planes (`numerics.split_wide`) into the same accumulator rows, exact against int64
arithmetic, one by one, fused by the plan and in batches."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import isa, machine, numerics, plan
from simulator.arch import Arch
from simulator.errors import SimulatorError
from simulator.machine import State
from simulator.program import IOBinding, Program

ARCH = Arch.load("default")
L = ARCH.lanes


def test_the_shift_field_round_trips_and_defaults_to_the_old_word():
    insn = isa.COMPUTE(sp=7, acc=3, m_inner=5, k=9, n=11, accumulate=1, x_offset=-128, shift=8)
    assert isa.decode(isa.encode(insn)) == insn
    text = isa.disassemble(insn)
    assert "shift=8" in text and "x_offset=-128" in text
    assert isa.assemble(text) == insn
    plain = isa.COMPUTE(sp=7, acc=3, m_inner=5, k=9, n=11, accumulate=1, x_offset=-128)
    assert plain.args["shift"] == 0
    offset = isa._LAYOUT["COMPUTE"][-1][1]  # the shift is the row's last field
    assert isa.encode(plain) >> offset == 0
    assert isa.encode(insn) == isa.encode(plain) | 8 << offset
    # Two int16 activations' high planes: 2^16 (`numerics.activation_passes`), in 5 bits.
    top = isa.COMPUTE(sp=0, acc=0, m_inner=1, k=1, n=1, shift=numerics.ARRAY_SHIFT_MAX)
    assert isa.decode(isa.encode(top)).args["shift"] == 16
    with pytest.raises(SimulatorError, match="shift = 32 does not fit in 5 bits"):
        isa.COMPUTE(sp=0, acc=0, m_inner=1, k=1, n=1, shift=32)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, numerics.ARRAY_SHIFT_MAX))
def test_shift_wrap_is_the_product_times_2_to_the_shift_modulo_2_to_the_32(seed, shift):
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**31), 2**31, 50)
    want = ((x * 2**shift + 2**31) % 2**32) - 2**31
    np.testing.assert_array_equal(numerics.shift_wrap(x, shift), want)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 700))
def test_two_plane_passes_equal_the_int16_product(seed, k):
    """high @ w * 2^8 + (low + 128) @ w = x @ w for int16 x (wrapping alike): the array's two
    passes compute the integer reference's `int_matmul` of the int16 codes, for any K (the
    float32 pieces of `array_pass` included)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-(2**15), 2**15, (6, k)).astype(np.int16)
    w = rng.integers(-128, 128, (k, 5)).astype(np.int8)
    high, low = numerics.split_wide(x)
    acc = numerics.array_pass(None, numerics.centre(high, 0), w, numerics.WIDE_HIGH_SHIFT)
    acc = numerics.array_pass(acc, numerics.centre(low, -numerics.WIDE_LOW_OFFSET), w)
    exact = x.astype(np.int64) @ w.astype(np.int64)
    np.testing.assert_array_equal(acc, numerics.wrap32(exact))
    np.testing.assert_array_equal(numerics.int_matmul(x, w), acc)


def test_compute_with_shift_on_machine_state():
    rng = np.random.default_rng(3)
    state = State(ARCH)
    state.scratchpad[0][...] = rng.integers(-128, 128, state.scratchpad.shape)
    old = state.accumulator[0][20:24].copy()
    isa.PRELOAD.run(state, isa.PRELOAD(sp=100, k=L))
    weights = state.scratchpad[0][100:100 + L].astype(np.int64)
    insn = isa.COMPUTE(sp=5, acc=20, m_inner=4, k=L, n=L, accumulate=1, x_offset=3, shift=5)
    isa.COMPUTE.run(state, insn)
    product = (state.scratchpad[0][5:9].astype(np.int64) - 3) @ weights
    np.testing.assert_array_equal(state.accumulator[0][20:24],
                                  numerics.wrap32(old + product * 32))


# x (4 x 16 int16) as two planes at DRAM 0 (high) and 64 (low), w (16 x 16 int8) at 128, the
# int32 product stored at 512. The tile is preloaded once and both planes stream through it.
WIDE_GEMM = """
LOAD mem=scratchpad sram=0 dram=0 y_size=4 x_size=1 elem_bytes=16 x_stride=16 y_stride=16
LOAD mem=scratchpad sram=4 dram=64 y_size=4 x_size=1 elem_bytes=16 x_stride=16 y_stride=16
LOAD mem=scratchpad sram=8 dram=128 y_size=16 x_size=1 elem_bytes=16 x_stride=16 \
y_stride=16 push_next
PRELOAD sp=8 k=16 pop_prev
COMPUTE sp=0 acc=0 m_inner=4 k=16 n=16 shift=8
COMPUTE sp=4 acc=0 m_inner=4 k=16 n=16 accumulate=1 x_offset=-128 push_next
SYNC queue=vector pop_prev push_next
STORE mem=accumulator sram=0 dram=512 y_size=4 x_size=1 elem_bytes=64 x_stride=64 \
y_stride=64 pop_prev
END
""".replace("\\\n", "")


def _wide_gemm_program(w: np.ndarray) -> Program:
    image = np.zeros(768, np.uint8)
    image[128:384] = w.view(np.uint8).ravel()
    return Program(arch=ARCH, instructions=isa.assemble_program(WIDE_GEMM),
                   dram_image=image.tobytes(),
                   inputs=(IOBinding("high", 0, (4, 16), 1.0, 0),
                           IOBinding("low", 64, (4, 16), 1.0, 0)),
                   outputs=(IOBinding("acc", 512, (4, 16), 1.0, 0, dtype="int32"),))


def test_an_assembled_two_pass_gemm_of_int16_codes():
    """By hand: a row of x = [1000, -1, 32767, -32768, 0 ...] against w = the identity times 2
    plus 1 in row 2: high(1000) = 3, low = 1000 - 768 - 128 = 104; 3 * 256 + (104 + 128) = 1000,
    and so on; the accumulator holds 2x, plus 32767 in every column from row 2."""
    x = np.zeros((4, 16), np.int16)
    x[0, :4] = [1000, -1, 32767, -32768]
    x[1:] = np.random.default_rng(5).integers(-(2**15), 2**15, (3, 16))
    w = (2 * np.eye(16)).astype(np.int8)
    w[2] += 1
    high, low = numerics.split_wide(x)
    assert (high[0, :4].tolist(), low[0, :4].tolist()) == ([3, -1, 127, -128],
                                                           [104, 127, 127, -128])
    program = _wide_gemm_program(w)
    result = machine.run(program, {"high": high, "low": low})
    got = result.outputs["acc"]
    assert got[0, :5].tolist() == [2000 + 32767, -2 + 32767, 65534 + 32767, -65536 + 32767,
                                   32767]
    np.testing.assert_array_equal(got, x.astype(np.int64) @ w.astype(np.int64))
    # Each plane is a pass of its own: twice an int8 pass's array time (and MACs).
    compute = [i for i in program.instructions if i.op is isa.COMPUTE]
    assert result.stats.macs == 2 * 4 * 16 * 16
    busy = sum(isa.COMPUTE.cycles(ARCH, i) for i in compute)
    assert busy == 2 * isa.COMPUTE.cycles(ARCH, compute[0])


def test_the_two_passes_fuse_into_one_chain_and_batch_exactly():
    """The plan fuses the interleaved passes (different x_offset and shift) into one chain of
    two products; a batch of samples equals each sample alone and the passes one by one."""
    rng = np.random.default_rng(9)
    w = rng.integers(-128, 128, (16, 16)).astype(np.int8)
    program = _wide_gemm_program(w)
    xs = rng.integers(-(2**15), 2**15, (3, 4, 16)).astype(np.int16)
    planes = [numerics.split_wide(x) for x in xs]
    ready = machine.Machine(program)
    chains = [step for step in ready.plan if type(step) is plan.Finish]
    assert len(chains) == 1 and chains[0].chain.computes == 2
    got = ready.outputs({"high": np.stack([p[0] for p in planes]),
                         "low": np.stack([p[1] for p in planes])})["acc"]
    for n, x in enumerate(xs):
        np.testing.assert_array_equal(got[n], x.astype(np.int64) @ w.astype(np.int64))
        alone = machine.run(program, {"high": planes[n][0], "low": planes[n][1]}).outputs
        np.testing.assert_array_equal(got[n], alone["acc"])
        plain = State(ARCH, 1, 768)
        plain.dram[:, :768] = np.frombuffer(program.dram_image, np.uint8)
        plain.write(program.inputs[0], planes[n][0][None])
        plain.write(program.inputs[1], planes[n][1][None])
        for insn in program.instructions:
            insn.op.run(plain, insn)
        np.testing.assert_array_equal(plain.read(program.outputs[0])[0], got[n])
