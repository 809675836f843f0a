"""int16 weights on the array: `numerics.split_weight` (w = high * 2^7 + low, both int8 codes as
they are), and two passes of the parts (COMPUTE shift=7 for the high one) equal to the int16
product, exactly, whatever the activations' zero point, fused by the plan or one by one."""

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
LIMIT = 1 << (numerics.WIDE_WEIGHT_BITS - 1)  # 15-bit codes: [-2^14, 2^14 - 1] split exactly


def test_every_15_bit_code_splits_into_two_int8_parts_and_back():
    w = np.arange(-LIMIT, LIMIT)
    high, low = numerics.split_weight(w)
    assert high.dtype == low.dtype == np.int8
    assert (high.min(), high.max(), low.min(), low.max()) == (-128, 127, 0, 127)
    np.testing.assert_array_equal(high.astype(np.int64) * 2**numerics.WEIGHT_HIGH_SHIFT + low, w)
    assert numerics.split_weight([-1, 127, 128, -16383])[0].tolist() == [-1, 0, 1, -128]
    assert numerics.split_weight([-1, 127, 128, -16383])[1].tolist() == [127, 127, 0, 1]


@pytest.mark.parametrize("code", [LIMIT, -LIMIT - 1, 2**15 - 1])
def test_a_code_whose_high_part_is_no_int8_is_refused(code):
    with pytest.raises(SimulatorError, match="split_weight: codes must lie in"):
        numerics.split_weight([0, code])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 700), st.integers(-128, 127))
def test_two_weight_passes_equal_the_int16_product(seed, k, zero):
    """high @ 2^7 + low, each an `array_pass` of int8 codes less a zero point: the integer
    reference's `int_matmul` of the int16 weights, for any K (the float32 pieces of
    `array_pass` included), wrapping alike."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (6, k)).astype(np.int8)
    w = rng.integers(-LIMIT, LIMIT, (k, 5)).astype(np.int16)
    high, low = numerics.split_weight(w)
    centred = numerics.centre(x, zero)
    acc = numerics.array_pass(None, centred, high, numerics.WEIGHT_HIGH_SHIFT)
    acc = numerics.array_pass(acc, centred, low)
    exact = (x.astype(np.int64) - zero) @ w.astype(np.int64)
    np.testing.assert_array_equal(acc, numerics.wrap32(exact))
    np.testing.assert_array_equal(numerics.int_matmul(centred, w), acc)


# x (4 x 16 int8) at DRAM 0, the weight's high tile (16 x 16) at 64 and its low tile at 320,
# the int32 product stored at 640: each tile preloaded and streamed in a pass of its own.
WIDE_WEIGHT_GEMM = """
LOAD mem=scratchpad sram=0 dram=0 y_size=4 x_size=1 elem_bytes=16 x_stride=16 y_stride=16
LOAD mem=scratchpad sram=4 dram=64 y_size=32 x_size=1 elem_bytes=16 x_stride=16 \
y_stride=16 push_next
PRELOAD sp=4 k=16 pop_prev
COMPUTE sp=0 acc=0 m_inner=4 k=16 n=16 shift=7
PRELOAD sp=20 k=16
COMPUTE sp=0 acc=0 m_inner=4 k=16 n=16 accumulate=1 push_next
SYNC queue=vector pop_prev push_next
STORE mem=accumulator sram=0 dram=640 y_size=4 x_size=1 elem_bytes=64 x_stride=64 \
y_stride=64 pop_prev
END
""".replace("\\\n", "")


def _program(w: np.ndarray) -> Program:
    high, low = numerics.split_weight(w)
    image = np.zeros(1024, np.uint8)
    image[64:576] = np.concatenate([high, low]).view(np.uint8).ravel()
    return Program(arch=ARCH, instructions=isa.assemble_program(WIDE_WEIGHT_GEMM),
                   dram_image=image.tobytes(), inputs=(IOBinding("x", 0, (4, 16), 1.0, 0),),
                   outputs=(IOBinding("acc", 640, (4, 16), 1.0, 0, dtype="int32"),))


def test_an_assembled_two_tile_gemm_of_int16_weights_batches_exactly():
    """Extreme codes (x = -128 against w = -16383: every product at its largest) through the
    machine: a batch equals each sample alone, the plan's fused chain (one product per shift)
    equals the passes one by one, and both the int16 product; twice an int8 pass's MACs."""
    rng = np.random.default_rng(7)
    w = rng.integers(-LIMIT + 1, LIMIT, (16, 16)).astype(np.int16)
    w[:, 0] = -(LIMIT - 1)
    xs = rng.integers(-128, 128, (3, 4, 16)).astype(np.int8)
    xs[0] = -128
    program = _program(w)
    ready = machine.Machine(program)
    chains = [step for step in ready.plan if type(step) is plan.Finish]
    assert len(chains) == 1 and chains[0].chain.computes == 2
    got = ready.outputs({"x": xs})["acc"]
    for n, x in enumerate(xs):
        want = x.astype(np.int64) @ w.astype(np.int64)
        np.testing.assert_array_equal(got[n], want)
        alone = machine.run(program, {"x": x})
        np.testing.assert_array_equal(alone.outputs["acc"], want)
        assert alone.stats.macs == 2 * 4 * 16 * 16
        plain = State(ARCH, 1, 1024)
        plain.dram[:, :1024] = np.frombuffer(program.dram_image, np.uint8)
        plain.write(program.inputs[0], x[None])
        for insn in program.instructions:
            insn.op.run(plain, insn)
        np.testing.assert_array_equal(plain.read(program.outputs[0])[0], want)
    assert got[0, 0, 0] == 16 * 128 * (LIMIT - 1)


# An int16 input times int16 weights: four passes (`numerics.wide_passes`).
PLANE_OFFSETS = (0, -numerics.WIDE_LOW_OFFSET)  # the low plane holds byte - 128


def test_the_four_passes_weigh_each_plane_and_part_by_their_shifts():
    """x w = 2^15 x_h w_h + 2^7 x_l w_h + 2^8 x_h w_l + x_l w_l for every int16 x (x_l the low
    byte) and 15-bit w; the shifts fit COMPUTE's field; the magnitudes of the four terms sum to
    pass_magnitude(x) * pass_magnitude(w), which bounds |x w|."""
    assert [s for _, _, s in numerics.wide_passes()] == [15, 7, 8, 0]
    assert max(s for _, _, s in numerics.wide_passes()) <= numerics.ARRAY_SHIFT_MAX
    x = np.arange(-2**15, 2**15, dtype=np.int64)[:, None]
    w = np.array([-LIMIT, -LIMIT + 1, -129, -128, -127, -1, 0, 1, 127, 128, LIMIT - 1])[None, :]
    planes = [np.asarray(p, np.int64) - offset
              for p, offset in zip(numerics.split_wide(x), PLANE_OFFSETS)]
    parts = [np.asarray(p, np.int64) for p in numerics.split_weight(w)]
    terms = [(planes[i] * parts[j]) << s for i, j, s in numerics.wide_passes()]
    np.testing.assert_array_equal(sum(terms), x * w)
    np.testing.assert_array_equal(sum(np.abs(t) for t in terms),
                                  numerics.pass_magnitude(x, weights=False) *
                                  numerics.pass_magnitude(w, weights=True))
    assert (numerics.pass_magnitude(x, weights=False) >= np.abs(x)).all()
    assert (numerics.pass_magnitude(w, weights=True) >= np.abs(w)).all()
    assert numerics.pass_magnitude(x, weights=False).max() == 2**15 + 255


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 700))
def test_four_passes_equal_the_int16_by_int16_product(seed, k):
    """Each plane (less its offset) through each weight part, `array_pass` by `wide_passes`:
    the integer reference's `int_matmul` of the int16 codes by the int16 weights, wrapping
    alike (full-range codes: the true sum may leave int32 here)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-2**15, 2**15, (6, k)).astype(np.int16)
    w = rng.integers(-LIMIT, LIMIT, (k, 5)).astype(np.int16)
    planes = [numerics.centre(p, offset) for p, offset in zip(numerics.split_wide(x),
                                                              PLANE_OFFSETS)]
    parts = numerics.split_weight(w)
    acc = None
    for plane, part, shift in numerics.wide_passes():
        acc = numerics.array_pass(acc, planes[plane], parts[part], shift)
    exact = x.astype(np.int64) @ w.astype(np.int64)
    np.testing.assert_array_equal(acc, numerics.wrap32(exact))
    np.testing.assert_array_equal(numerics.int_matmul(x, w), acc)


def test_int16_by_int16_products_are_exact_to_2_23_terms():
    with pytest.raises(SimulatorError, match="exceeds the exact bound 2\\^23"):
        numerics.int_matmul(np.zeros((1, 2**23 + 1), np.int16),
                            np.zeros((2**23 + 1, 1), np.int16))
