"""One bit-exact semantic test per instruction, run directly on machine state, plus the cost
functions' formulas."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import isa, numerics
from simulator.arch import Arch
from simulator.machine import State
from simulator.errors import SimulatorError
from simulator.units.vector import ParamBlock

ARCH = Arch.load("default")
L = ARCH.lanes
rng = np.random.default_rng(7)


def fresh():
    state = State(ARCH)
    state.scratchpad[0][...] = rng.integers(-128, 128, state.scratchpad.shape)
    state.accumulator[0][...] = rng.integers(-(2**31), 2**31, state.accumulator.shape)
    return state


def run(state, insn):
    insn.op.run(state, insn)


def test_load_strided_padded_scratchpad():
    state = fresh()
    image = rng.integers(0, 256, 4096).astype(np.uint8)
    state.dram[0][1000:1000 + image.size] = image
    run(state, isa.LOAD(mem="scratchpad", sram=10, dram=1000, y_size=3, x_size=4, elem_bytes=5,
                        x_stride=7, y_stride=100, pad_top=1, pad_bottom=2, pad_left=1,
                        pad_right=0, pad_value=-9))
    block = state.scratchpad[0][10:10 + 6 * 5].reshape(6, 5, L)
    want = np.full((6, 5, L), -9, np.int8)
    for y in range(3):
        for x in range(4):
            start = y * 100 + x * 7
            want[1 + y, 1 + x, :5] = image[start:start + 5].view(np.int8)
    np.testing.assert_array_equal(block, want)


@settings(max_examples=60)
@given(y=st.integers(0, 4), x=st.integers(0, 4), eb=st.integers(1, 16),
       xs=st.integers(0, 40), ys=st.integers(0, 200), pads=st.lists(st.integers(0, 2), min_size=4,
                                                                 max_size=4),
       value=st.integers(-128, 127), mem=st.sampled_from(["scratchpad", "accumulator"]))
def test_load_matches_loop_reference(y, x, eb, xs, ys, pads, value, mem):
    state = fresh()
    item = 1 if mem == "scratchpad" else 4
    eb *= item
    image = np.arange(2000, dtype=np.uint32).astype(np.uint8)
    state.dram[0][:image.size] = image
    memory = state.memories[mem == "accumulator"][0]
    top, bottom, left, right = pads
    run(state, isa.LOAD(mem=mem, sram=3, dram=7, y_size=y, x_size=x, elem_bytes=eb, x_stride=xs,
                        y_stride=ys, pad_top=top, pad_bottom=bottom, pad_left=left,
                        pad_right=right, pad_value=value))
    width = left + x + right
    want = np.full(((top + y + bottom) * width, L), value, memory.dtype)
    for line in range(y):
        for e in range(x):
            start = 7 + line * ys + e * xs
            row = (top + line) * width + left + e
            want[row, :eb // item] = image[start:start + eb].view(f"<{memory.dtype.str[1:]}")
    np.testing.assert_array_equal(memory[3:3 + len(want)], want)


@settings(max_examples=60)
@given(y=st.integers(0, 4), x=st.integers(0, 4), eb=st.integers(1, 16), gap=st.integers(0, 9),
       line_gap=st.integers(0, 50), mem=st.sampled_from(["scratchpad", "accumulator"]))
def test_store_matches_loop_reference(y, x, eb, gap, line_gap, mem):
    state = fresh()
    item = 1 if mem == "scratchpad" else 4
    eb *= item
    xs = eb + gap
    ys = x * xs + line_gap
    memory = state.memories[mem == "accumulator"][0]
    before = state.dram[0][:3000].copy()
    run(state, isa.STORE(mem=mem, sram=5, dram=11, y_size=y, x_size=x, elem_bytes=eb,
                         x_stride=xs, y_stride=ys))
    want = before.copy()
    for line in range(y):
        for e in range(x):
            start = 11 + line * ys + e * xs
            lanes = memory[5 + line * x + e, :eb // item].astype(f"<{memory.dtype.str[1:]}")
            want[start:start + eb] = lanes.view(np.uint8)
    np.testing.assert_array_equal(state.dram[0][:3000], want)


def test_load_accumulator_little_endian_broadcast():
    state = fresh()
    bias = np.arange(-8, 8, dtype="<i4") * 100000
    state.dram[0][64:64 + bias.nbytes] = bias.view(np.uint8)
    run(state, isa.LOAD(mem="accumulator", sram=3, dram=64, y_size=5, x_size=1,
                        elem_bytes=bias.nbytes, x_stride=bias.nbytes, y_stride=0))
    np.testing.assert_array_equal(state.accumulator[0][3:8], np.tile(bias, (5, 1)))


def test_store_round_trips_load_and_scatters():
    state = fresh()
    before = state.scratchpad[0][0:6].copy()
    run(state, isa.STORE(mem="scratchpad", sram=0, dram=500, y_size=2, x_size=3, elem_bytes=L,
                         x_stride=L, y_stride=200))
    for y in range(2):
        row = state.dram[0][500 + 200 * y:500 + 200 * y + 3 * L].view(np.int8).reshape(3, L)
        np.testing.assert_array_equal(row, before[3 * y:3 * y + 3])
    acc = state.accumulator[0][7:9].copy()
    run(state, isa.STORE(mem="accumulator", sram=7, dram=8000, y_size=2, x_size=1,
                         elem_bytes=4 * L, x_stride=4 * L, y_stride=4 * L))
    np.testing.assert_array_equal(state.dram[0][8000:8000 + 8 * L].view("<i4").reshape(2, L), acc)


@pytest.mark.parametrize("accumulate", [0, 1])
def test_preload_compute_strided_rows(accumulate):
    state = fresh()
    run(state, isa.PRELOAD(sp=100, k=L))
    weights = state.scratchpad[0][100:100 + L].copy()
    old = state.accumulator[0][20:26].copy()
    run(state, isa.COMPUTE(sp=5, acc=20, m_outer=2, m_inner=3, outer_stride=40, inner_stride=2,
                           k=11, n=13, accumulate=accumulate))
    rows = [5 + o * 40 + i * 2 for o in range(2) for i in range(3)]
    product = state.scratchpad[0][rows, :11].astype(np.int64) @ weights[:11, :13].astype(np.int64)
    want = (old[:, :13].astype(np.int64) * accumulate + product + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(state.accumulator[0][20:26, :13], want)
    np.testing.assert_array_equal(state.accumulator[0][20:26, 13:], old[:, 13:])


def _params(state, row, mult, shift):
    state.accumulator[0][row, :len(mult)] = mult
    state.accumulator[0][row + 1, :len(shift)] = shift


def test_param_block_round_trip_through_the_accumulator_rows():
    """The compiler packs a block into the DRAM image; the vector unit reads the same rows back:
    multipliers, shifts, then (REQUANT bias=1) biases, unused lanes zero."""
    state = fresh()
    mult, shift, bias = [2**30, 2**31 - 1, 5], [-31, 31, 0], [-(2**31), 7, 2**31 - 1]
    for with_bias in (False, True):
        block = ParamBlock(mult, shift, bias if with_bias else None)
        packed = np.frombuffer(block.pack(L), "<i4").reshape(-1, L)
        assert packed.shape[0] == ParamBlock.rows(with_bias)
        state.accumulator[0][40:40 + len(packed)] = packed
        got = ParamBlock.unpack(state.accumulator, 40, with_bias)
        # one block per sample, shaped to broadcast against rows: (samples, 1, lanes)
        assert got.multipliers.shape == (1, 1, L)
        np.testing.assert_array_equal(got.multipliers[0, 0], mult + [0] * (L - 3))
        np.testing.assert_array_equal(got.shifts[0, 0], shift + [0] * (L - 3))
        if with_bias:
            np.testing.assert_array_equal(got.bias[0, 0], bias + [0] * (L - 3))
        else:
            assert got.bias is None


def test_requant_per_lane():
    state = fresh()
    mult = rng.integers(2**30, 2**31, L)
    shift = rng.integers(-2, 12, L)
    _params(state, 500, mult, shift)
    acc = state.accumulator[0][0:9].copy()
    run(state, isa.REQUANT(acc=0, sp=50, rows=9, param=500, out_offset=-5, qmin=-5, qmax=100))
    want = numerics.requantize(acc, mult, shift, -5, -5, 100, axis=1)
    np.testing.assert_array_equal(state.scratchpad[0][50:59], want)


def test_requant_adds_the_bias_row_wrapping():
    state = fresh()
    mult = rng.integers(2**30, 2**31, L)
    shift = rng.integers(-2, 12, L)
    _params(state, 500, mult, shift)
    bias = rng.integers(-2**31, 2**31, L).astype(np.int32)
    state.accumulator[0][502] = bias
    acc = state.accumulator[0][0:9].copy()
    run(state, isa.REQUANT(acc=0, sp=50, rows=9, param=500, qmin=-100, qmax=100, bias=1))
    summed = (acc.astype(np.int64) + bias + 2**31) % 2**32 - 2**31  # int32, wrapping
    want = numerics.requantize(summed, mult, shift, 0, -100, 100, axis=1)
    np.testing.assert_array_equal(state.scratchpad[0][50:59], want)
    np.testing.assert_array_equal(state.accumulator[0][0:9], acc)  # the accumulator is unchanged
    assert isa.REQUANT.access(ARCH, isa.REQUANT(acc=0, sp=50, rows=9, param=500, bias=1))[1] \
        == (1, 500, 503, False)  # the bias row is read: the race check and the scheduler see it


def test_add_matches_numerics():
    state = fresh()
    m = [numerics.quantize_multiplier(v) for v in (0.4, 0.5, 1 / (2**20 * 0.6))]
    _params(state, 10, [x for x, _ in m], [s for _, s in m])
    a, b = state.scratchpad[0][0:4].copy(), state.scratchpad[0][4:8].copy()
    run(state, isa.ADD(a=0, b=4, dst=8, rows=4, param=10, a_offset=3, b_offset=-7,
                       out_offset=1))
    want = numerics.add(a, b, 3, -7, [x for x, _ in m], [s for _, s in m], 1)
    np.testing.assert_array_equal(state.scratchpad[0][8:12], want)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("b_once, b_splat", [(0, 0), (1, 0), (1, 1), (0, 1)])
def test_add_op_max_min_matches_numerics_with_b_broadcast(op, b_once, b_splat):
    state = fresh()
    m = [numerics.quantize_multiplier(v) for v in (0.4, 1.0, 1 / (2**20 * 0.6))]
    _params(state, 10, [x for x, _ in m], [s for _, s in m])
    a, b = state.scratchpad[0][0:5].copy(), state.scratchpad[0][20:25].copy()
    insn = isa.ADD(a=0, b=20, dst=40, rows=5, param=10, a_offset=3, b_offset=-7, out_offset=1,
                   qmin=-100, qmax=90, op=op, b_once=b_once, b_splat=b_splat)
    run(state, insn)
    b = np.broadcast_to(b[:1], b.shape) if b_once else b
    b = np.broadcast_to(b[:, :1], b.shape) if b_splat else b
    want = numerics.extremum(a, b, 3, -7, [x for x, _ in m], [s for _, s in m], 1, -100, 90,
                             op=op)
    np.testing.assert_array_equal(state.scratchpad[0][40:45], want)
    b_rows = 1 if b_once else 5  # the hazard check and the scheduler see only the rows read
    assert isa.ADD.access(ARCH, insn)[1] == (0, 20, 20 + b_rows, False)
    # op and the broadcast fields are new last fields: an add encodes as before them.
    plain = dict(a=0, b=4, dst=8, rows=4, param=10)
    assert isa.encode(isa.ADD(**plain, op="add")) == isa.encode(isa.ADD(**plain))
    assert isa.decode(isa.encode(insn)).args == insn.args


def test_add_op_hypot_matches_numerics():
    """ADD op=hypot: numerics.hypot of the two operands' rows, lane 2 the output rescale."""
    state = fresh()
    m, s = numerics.quantize_multiplier(0.9 / 2**numerics.HYPOT_FRACTION_BITS)
    _params(state, 10, [0, 0, m], [0, 0, s])
    a, b = state.scratchpad[0][0:5].copy(), state.scratchpad[0][20:25].copy()
    insn = isa.ADD(a=0, b=20, dst=40, rows=5, param=10, a_offset=3, b_offset=3, out_offset=-128,
                   op="hypot")
    run(state, insn)
    want = numerics.hypot(a, b, 3, 3, [0, 0, m], [0, 0, s], -128, -128, 127)
    np.testing.assert_array_equal(state.scratchpad[0][40:45], want)
    assert isa.decode(isa.encode(insn)).args == insn.args
    # int16 operands (a spectrum's parts): each a high plane, its low plane after it.
    m16, s16 = numerics.quantize_multiplier(0.9 / 2**(numerics.HYPOT_FRACTION_BITS + 8))
    _params(state, 10, [0, 0, m16], [0, 0, s16])
    a16, b16 = rng.integers(-30000, 30000, (2, 4, L))
    state.scratchpad[0][60:64], state.scratchpad[0][64:68] = numerics.split_wide(a16)
    state.scratchpad[0][70:74], state.scratchpad[0][74:78] = numerics.split_wide(b16)
    run(state, isa.ADD(a=60, b=70, dst=90, rows=4, param=10, out_offset=-128, op="hypot",
                       a_wide=1, b_wide=1))
    np.testing.assert_array_equal(state.scratchpad[0][90:94], numerics.hypot(
        a16, b16, 0, 0, [0, 0, m16], [0, 0, s16], -128, -128, 127))


def test_a_wide_hypot_writes_its_int16_magnitude_as_two_planes():
    """ADD op=hypot wide=1 (a speech model's spectrum magnitude, int16 for the encoder that
    reads it): numerics.hypot's int16 codes, high bytes at dst, low bytes after them, in one
    pass more than the int8 magnitude."""
    state = fresh()
    m, s = numerics.quantize_multiplier(200 / 2**numerics.HYPOT_FRACTION_BITS)
    _params(state, 10, [0, 0, m], [0, 0, s])
    a16, b16 = rng.integers(-30000, 30000, (2, 4, L))
    state.scratchpad[0][60:64], state.scratchpad[0][64:68] = numerics.split_wide(a16)
    state.scratchpad[0][70:74], state.scratchpad[0][74:78] = numerics.split_wide(b16)
    insn = isa.ADD(a=60, b=70, dst=90, rows=4, param=10, op="hypot", a_wide=1, b_wide=1, wide=1)
    run(state, insn)
    want = numerics.hypot(a16, b16, 0, 0, [0, 0, m], [0, 0, s], 0, *numerics.RANGES["int16"],
                          dtype="int16")
    assert want.max() > 127 * 256  # the magnitude needs the 16 bits
    got = numerics.join_wide(state.scratchpad[0][90:94], state.scratchpad[0][94:98])
    np.testing.assert_array_equal(got, want)
    assert isa.ADD.access(ARCH, insn)[-1] == (0, 90, 98, True)
    assert isa.ADD.cycles(ARCH, insn) == isa.ADD.cycles(ARCH, isa.ADD(**{
        **insn.args, "wide": 0})) + isa.ADD.cycles(ARCH, isa.ADD(**{
            **insn.args, "wide": 0, "a_wide": 0, "b_wide": 0}))

@pytest.mark.parametrize("b_step, b_splat", [(1, 0), (0, 0), (0, 1), (1, 1)])
def test_mul_matches_numerics_with_b_broadcast(b_step, b_splat):
    state = fresh()
    m, s = numerics.quantize_multiplier(0.004)
    _params(state, 10, [m], [s])
    a, b = state.scratchpad[0][0:5].copy(), state.scratchpad[0][20:25].copy()
    insn = isa.MUL(a=0, b=20, dst=40, rows=5, param=10, a_offset=3, b_offset=-7, out_offset=1,
                   qmin=-100, qmax=90, b_step=b_step, b_splat=b_splat)
    run(state, insn)
    b = b if b_step else np.broadcast_to(b[:1], b.shape)
    b = np.broadcast_to(b[:, :1], b.shape) if b_splat else b
    want = numerics.requantize((a.astype(np.int64) - 3) * (b.astype(np.int64) + 7), m, s, 1,
                               -100, 90)
    np.testing.assert_array_equal(state.scratchpad[0][40:45], want)
    b_rows = 5 if b_step else 1  # the hazard check and the scheduler see only the rows read
    assert isa.MUL.access(ARCH, insn)[1] == (0, 20, 20 + b_rows, False)
    assert isa.MUL.cycles(ARCH, insn) == isa.ADD.cycles(ARCH, isa.ADD(a=0, b=20, dst=40, rows=5,
                                                                      param=10))


def _windows_ref(image, kh, kw, sh, sw):
    in_h, in_w, _ = image.shape
    out = []
    for oy in range(0, in_h - kh + 1, sh):
        for ox in range(0, in_w - kw + 1, sw):
            out.append(image[oy:oy + kh, ox:ox + kw].reshape(kh * kw, -1))
    return out


def test_maxpool_windows():
    state = fresh()
    image = state.scratchpad[0][0:7 * 6].reshape(7, 6, L).copy()
    run(state, isa.MAXPOOL(src=0, dst=200, in_h=7, in_w=6, kh=3, kw=2, sh=2, sw=2))
    want = [w.max(axis=0) for w in _windows_ref(image, 3, 2, 2, 2)]
    np.testing.assert_array_equal(state.scratchpad[0][200:200 + len(want)], np.array(want))


def test_avgpool_windows_requantize():
    state = fresh()
    mult, shift = numerics.quantize_multiplier(1 / 9)
    _params(state, 30, [mult] * L, [shift] * L)
    image = state.scratchpad[0][0:25].reshape(5, 5, L).copy()
    run(state, isa.AVGPOOL(src=0, dst=300, in_h=5, in_w=5, kh=3, kw=3, sh=1, sw=1, param=30,
                           in_offset=4, out_offset=4, qmin=-128, qmax=127))
    sums = [(w.astype(np.int64) - 4).sum(axis=0) for w in _windows_ref(image, 3, 3, 1, 1)]
    want = numerics.requantize(np.array(sums), mult, shift, 4)
    np.testing.assert_array_equal(state.scratchpad[0][300:309], want)


def _wide_image(state, pixels: int) -> np.ndarray:
    """int16 codes at scratchpad rows [0, 2 pixels): the high plane's rows, then the low's."""
    v = rng.integers(-(2**15), 2**15, (pixels, L))
    high, low = numerics.split_wide(v)
    state.scratchpad[0][0:pixels], state.scratchpad[0][pixels:2 * pixels] = high, low
    return v


def test_maxpool_wide_compares_whole_int16_values():
    """MAXPOOL wide=1: both planes in, the max of the joined codes out as two planes."""
    state = fresh()
    v = _wide_image(state, 7 * 6).reshape(7, 6, L)
    run(state, isa.MAXPOOL(src=0, dst=200, in_h=7, in_w=6, kh=3, kw=2, sh=2, sw=2, wide=1))
    want = np.array([w.max(axis=0) for w in _windows_ref(v, 3, 2, 2, 2)])
    got = numerics.join_wide(state.scratchpad[0][200:200 + len(want)],
                             state.scratchpad[0][200 + len(want):200 + 2 * len(want)])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("wide", [0, 1])
def test_avgpool_of_int16_codes_into_int8_or_int16(wide):
    """AVGPOOL in_wide=1: sums of whole int16 codes, requantized once to int8 codes, or with
    wide=1 to int16 codes clamped by the high byte (`numerics.wide_clamp`) in two planes."""
    state = fresh()
    ratio = 1 / 9 if wide else 1 / (9 * 256)
    mult, shift = numerics.quantize_multiplier(ratio)
    _params(state, 30, [mult] * L, [shift] * L)
    v = _wide_image(state, 25).reshape(5, 5, L)
    run(state, isa.AVGPOOL(src=0, dst=300, in_h=5, in_w=5, kh=3, kw=3, param=30, in_wide=1,
                           wide=wide, qmin=-100, qmax=90))
    sums = np.array([w.astype(np.int64).sum(axis=0) for w in _windows_ref(v, 3, 3, 1, 1)])
    lo, hi = numerics.wide_clamp(-100, 90) if wide else (-100, 90)
    want = numerics.requantize(sums, mult, shift, 0, lo, hi, dtype="int16" if wide else "int8")
    got = state.scratchpad[0][300:309]
    if wide:
        got = numerics.join_wide(got, state.scratchpad[0][309:318])
    np.testing.assert_array_equal(got, want)


def test_lut():
    state = fresh()
    table = rng.integers(-128, 128, 256).astype(np.int8)
    state.scratchpad[0][1000:1000 + 256 // L] = table.reshape(-1, L)
    src = state.scratchpad[0][0:3].copy()
    run(state, isa.LUT(src=0, dst=40, rows=3, table=1000))
    np.testing.assert_array_equal(state.scratchpad[0][40:43], table[src.astype(np.int64) + 128])


def test_cycle_formulas():
    def load(**kw):
        base = dict(mem="scratchpad", sram=0, dram=0, y_size=4, x_size=1, elem_bytes=16,
                    x_stride=16, y_stride=16)
        return isa.LOAD(**{**base, **kw})
    lat = ARCH.dma.latency_cycles
    assert isa.LOAD.cycles(ARCH, load()) == lat + 64 // 16          # one contiguous run
    assert isa.LOAD.cycles(ARCH, load(y_stride=100)) == lat + 4     # four runs of one beat
    assert isa.LOAD.cycles(ARCH, load(elem_bytes=3, x_stride=3, y_stride=50)) == lat + 4
    assert isa.LOAD.cycles(ARCH, load(y_size=1, elem_bytes=200, x_stride=200, y_stride=200)) \
        == lat + 3 * 4 + 1                                             # bursts of 64 B
    r, c = ARCH.array.rows, ARCH.array.cols
    compute = isa.COMPUTE(sp=0, acc=0, m_outer=3, m_inner=10, k=16, n=16)
    # default (preload_overlap): busy for the 30 rows, the skew drains behind the next COMPUTE
    assert isa.COMPUTE.cycles(ARCH, compute) == 30
    assert isa.COMPUTE.latency(ARCH, compute) == r + c - 2
    few = isa.COMPUTE(sp=0, acc=0, m_inner=5, k=16, n=16)  # the next weights take r to shift in
    assert isa.COMPUTE.cycles(ARCH, few) == r
    assert isa.COMPUTE.cycles(ARCH, few) + isa.COMPUTE.latency(ARCH, few) == 5 + r + c - 2
    assert isa.PRELOAD.cycles(ARCH, isa.PRELOAD(sp=0, k=16)) == 0    # overlapped in default
    edge = Arch.load("edge")
    assert isa.PRELOAD.cycles(edge, isa.PRELOAD(sp=0, k=8)) == edge.array.rows
    re, ce = edge.array.rows, edge.array.cols  # no overlap: SCALE-Sim's fold, no latency
    assert isa.COMPUTE.cycles(edge, compute) == 30 + re + ce - 2
    assert isa.COMPUTE.latency(edge, compute) == 0
    assert isa.REQUANT.cycles(ARCH, isa.REQUANT(acc=0, sp=0, rows=5, param=0)) == 5 * L // 16
    pool = isa.MAXPOOL(src=0, dst=0, in_h=5, in_w=5, kh=3, kw=3)
    assert isa.MAXPOOL.cycles(ARCH, pool) == 9 * 9 * L // ARCH.vector.lanes
    # int16: both planes' windows read, and the second plane of the result written
    wide = isa.MAXPOOL(src=0, dst=0, in_h=5, in_w=5, kh=3, kw=3, wide=1)
    assert isa.MAXPOOL.cycles(ARCH, wide) == (2 * 9 * 9 + 9) * L // ARCH.vector.lanes
    average = dict(src=0, dst=0, in_h=5, in_w=5, kh=3, kw=3, param=0)
    assert isa.AVGPOOL.cycles(ARCH, isa.AVGPOOL(**average, in_wide=1)) == \
        2 * isa.AVGPOOL.cycles(ARCH, isa.AVGPOOL(**average))
    assert isa.AVGPOOL.cycles(ARCH, isa.AVGPOOL(**average, in_wide=1, wide=1)) == \
        isa.MAXPOOL.cycles(ARCH, wide)


def test_output_stationary_cycles():
    data = Arch.load("default").to_dict()
    data["array"]["dataflow"] = "output_stationary"
    arch = Arch.from_dict(data)
    r, c = arch.array.rows, arch.array.cols
    compute = isa.COMPUTE(sp=0, acc=0, m_inner=40, k=10, n=16, accumulate=1)
    assert isa.COMPUTE.cycles(arch, compute) == 3 * (r + c + 10 - 2)
    first = isa.COMPUTE(sp=0, acc=0, m_inner=r, k=16, n=16)
    chained = isa.COMPUTE(sp=0, acc=0, m_inner=r, k=10, n=16, accumulate=1)
    assert isa.COMPUTE.cycles(arch, first) + isa.COMPUTE.cycles(arch, chained) \
        == r + c + 26 - 2  # one SCALE-Sim fold with K = 26
    assert isa.PRELOAD.cycles(arch, isa.PRELOAD(sp=0, k=16)) == 0


def test_lut_per_lane_tables():
    state = fresh()
    run(state, isa.LUT(src=0, dst=300, rows=6, table=1000, per_lane=1))
    tables = state.scratchpad[0][1000:1256]
    src = state.scratchpad[0][0:6].astype(np.int64)
    want = np.array([[tables[v + 128, j] for j, v in enumerate(row)] for row in src])
    np.testing.assert_array_equal(state.scratchpad[0][300:306], want)
    insn = isa.LUT(src=0, dst=300, rows=6, table=1000, per_lane=1)
    assert isa.LUT.access(ARCH, insn)[1] == (0, 1000, 1256, False)  # all 256 table rows


def _wide_table(state, entries: np.ndarray, at: int) -> None:
    """A 16-bit table as LUT wide/in_wide read it: the high bytes' rows, then the low bytes'."""
    block = -(-entries.size // L)
    for plane, values in enumerate(numerics.split_wide(entries)):
        rows = np.zeros(block * L, np.int8)
        rows[:entries.size] = values
        state.scratchpad[0][at + plane * block:at + (plane + 1) * block] = rows.reshape(-1, L)


def test_lut_wide_writes_int16_entries_as_two_planes():
    state = fresh()
    table = rng.integers(-(2**15), 2**15, 256).astype(np.int16)
    _wide_table(state, table, 1000)
    src = state.scratchpad[0][0:3].astype(np.int64)
    insn = isa.LUT(src=0, dst=40, rows=3, table=1000, wide=1)
    run(state, insn)
    high, low = numerics.split_wide(table[src + 128])
    np.testing.assert_array_equal(state.scratchpad[0][40:43], high)
    np.testing.assert_array_equal(state.scratchpad[0][43:46], low)
    assert isa.LUT.access(ARCH, insn) == ((0, 0, 3, False), (0, 1000, 1000 + 2 * 256 // L, False),
                                          (0, 40, 46, True))


@pytest.mark.parametrize("wide", [0, 1])
def test_lut_in_wide_interpolates_an_int16_input(wide):
    state = fresh()
    knots = rng.integers(-(2**15), 2**15, numerics.KNOTS).astype(np.int16)
    _wide_table(state, knots, 1000)
    codes = numerics.join_wide(state.scratchpad[0][0:4], state.scratchpad[0][4:8])
    insn = isa.LUT(src=0, dst=40, rows=4, table=1000, in_wide=1, wide=wide)
    run(state, insn)
    want = numerics.interpolate(codes, knots, "int16" if wide else "int8")
    got = numerics.join_wide(state.scratchpad[0][40:44], state.scratchpad[0][44:48]) if wide \
        else state.scratchpad[0][40:44]
    np.testing.assert_array_equal(got, want)
    block = -(-numerics.KNOTS // L)
    assert isa.LUT.access(ARCH, insn) == ((0, 0, 8, False), (0, 1000, 1000 + 2 * block, False),
                                          (0, 40, 44 + 4 * wide, True))


def test_lut_passes():
    """int8 -> int8 one pass, int8 -> int16 two, int16 -> int8 three, int16 -> int16 four;
    per-lane tables the same."""
    base = isa.LUT.cycles(ARCH, isa.LUT(src=0, dst=40, rows=5, table=1000))
    assert base == 5 * L // ARCH.vector.lanes
    for (wide, in_wide), passes in {(1, 0): 2, (0, 1): 3, (1, 1): 4}.items():
        for per_lane in (0, 1):
            insn = isa.LUT(src=0, dst=40, rows=5, table=1000, wide=wide, in_wide=in_wide,
                           per_lane=per_lane)
            assert isa.LUT.cycles(ARCH, insn) == passes * base


@pytest.mark.parametrize("wide,in_wide", [(1, 0), (0, 1), (1, 1)])
def test_lut_per_lane_int16_entries(wide, in_wide):
    """A table of 16-bit entries per lane (a ChannelMap's with int16 codes in or out): a row
    per entry, its high bytes' rows and then its low bytes'; each lane looks up, or
    interpolates between, its own entries."""
    state = fresh()
    entries = numerics.KNOTS if in_wide else 256
    tables = rng.integers(-(2**15), 2**15, (entries, L)).astype(np.int16)
    high, low = numerics.split_wide(tables)
    state.scratchpad[0][1000:1000 + entries] = high
    state.scratchpad[0][1000 + entries:1000 + 2 * entries] = low
    insn = isa.LUT(src=0, dst=40, rows=4, table=1000, per_lane=1, wide=wide, in_wide=in_wide)
    run(state, insn)
    src = state.scratchpad[0]
    codes = numerics.join_wide(src[0:4], src[4:8]) if in_wide else src[0:4].astype(np.int64)
    for lane in range(L):
        one = tables[:, lane]
        want = numerics.interpolate(codes[:, lane], one, "int16" if wide else "int8") \
            if in_wide else one[codes[:, lane] + 128]
        got = numerics.join_wide(src[40:44, lane], src[44:48, lane]) if wide \
            else src[40:44, lane]
        np.testing.assert_array_equal(got, want)
    assert isa.LUT.access(ARCH, insn)[1] == (0, 1000, 1000 + 2 * entries, False)


def _softmax_tables(log: bool):
    """An exp table of input scale 0.05 and, for log, the log table after it (as the quantizer
    builds them), packed into the accumulator rows SOFTMAX reads."""
    from compiler.graph.int8 import log_softmax_table, softmax_table
    table = log_softmax_table(0.05) if log else softmax_table(0.05)
    rows = isa.softmax_table_rows(L, int(log))
    packed = np.zeros(rows * L, np.int32)
    packed[:table.size] = table
    return table, packed.reshape(rows, L)


@pytest.mark.parametrize("channels", [5, L, 3 * L + 2])  # C < lanes, C = lanes, several blocks
@pytest.mark.parametrize("log", [False, True])
def test_softmax_over_channel_blocks_matches_numerics(channels, log):
    state = fresh()
    table, packed = _softmax_tables(log)
    state.accumulator[0][100:100 + packed.shape[0]] = packed
    blocks, rows, stride = -(-channels // L), 6, 10
    before = state.scratchpad[0].copy()
    insn = isa.SOFTMAX(src=0, dst=200, rows=rows, n=channels - (blocks - 1) * L, blocks=blocks,
                       stride=stride, table=100, log=int(log), shift=7 if log else 0,
                       out_offset=127 if log else -128)
    run(state, insn)
    x = np.concatenate([before[b * stride:b * stride + rows] for b in range(blocks)], axis=1)
    x = x[:, :channels]
    if log:
        want = numerics.log_softmax(x, table[:256], table[256:], 7, 127)
    else:
        want = numerics.softmax(x, table, -128)
    got = np.concatenate([state.scratchpad[0][200 + b * stride:200 + b * stride + rows]
                          for b in range(blocks)], axis=1)
    assert np.array_equal(got[:, :channels], want)
    assert np.array_equal(got[:, channels:], np.concatenate(
        [before[200 + b * stride:200 + b * stride + rows] for b in range(blocks)],
        axis=1)[:, channels:])  # lanes past the last channel are left as they are
    accesses = isa.SOFTMAX.access(ARCH, insn)
    assert accesses[0] == (1, 100, 100 + packed.shape[0], False)
    assert (0, 200 + (blocks - 1) * stride, 200 + (blocks - 1) * stride + rows, True) in accesses
    assert isa.SOFTMAX.cycles(ARCH, insn) == 3 * -(-rows * blocks * L // ARCH.vector.lanes) + rows


@pytest.mark.parametrize("w_offset, x_offset", [(0, 0), (-128, 127), (5, -3)])
def test_preload_and_compute_offsets_subtract_both_zero_points(w_offset, x_offset):
    """A MatMul of two activations: (X - x_offset) @ (W - w_offset), int9 products, exact."""
    state = fresh()
    run(state, isa.PRELOAD(sp=100, k=L, w_offset=w_offset))
    weights = state.scratchpad[0][100:100 + L].astype(np.int64) - w_offset
    run(state, isa.COMPUTE(sp=5, acc=20, m_inner=4, k=L, n=L - 1, x_offset=x_offset))
    inputs = state.scratchpad[0][5:9, :L].astype(np.int64) - x_offset
    np.testing.assert_array_equal(state.accumulator[0][20:24, :L - 1],
                                  numerics.wrap32(inputs @ weights[:, :L - 1]))


def test_new_fields_default_to_zero_so_old_words_are_unchanged():
    """The offsets and LOAD's transpose are the last fields of their rows, default 0: a word
    built without them is the word of the same instruction before they existed (its high bits
    are 0)."""
    for insn, field in ((isa.PRELOAD(sp=3, k=4), "w_offset"),
                        (isa.COMPUTE(sp=1, acc=2, m_inner=3, k=4, n=5), "x_offset"),
                        (isa.LOAD(mem="scratchpad", sram=1, dram=2, y_size=3, x_size=4,
                                  elem_bytes=5, x_stride=6, y_stride=7), "transpose")):
        assert insn.args[field] == 0
        offset = isa._LAYOUT[insn.op.mnemonic][-1][1]
        assert isa.encode(insn) >> offset == 0
        assert isa.decode(isa.encode(insn)) == insn


def test_load_transpose_turns_lines_into_lanes():
    """Element (l, e) to lane l of row sram + e: Kᵀ's tile from K stored [S, Dh]."""
    state = fresh()
    keys = rng.integers(-128, 128, (L, 40)).astype(np.int8)  # S = L keys of Dh = 40 (stride 40)
    state.dram[0][500:500 + keys.size] = keys.view(np.uint8).ravel()
    run(state, isa.LOAD(mem="scratchpad", sram=30, dram=500 + 3, y_size=L - 2, x_size=7,
                        elem_bytes=1, x_stride=1, y_stride=40, pad_value=-1, transpose=1))
    want = np.full((7, L), -1, np.int8)
    want[:, :L - 2] = keys[:L - 2, 3:10].T
    np.testing.assert_array_equal(state.scratchpad[0][30:37], want)
    load = isa.LOAD(mem="scratchpad", sram=30, dram=503, y_size=L - 2, x_size=7, elem_bytes=1,
                    x_stride=1, y_stride=40, transpose=1)
    assert isa.LOAD.access(ARCH, load)[0][1:3] == (30, 37)
    # It costs what the same bytes cost without the turn: y_size runs of x_size bytes.
    plain = isa.LOAD(mem="scratchpad", sram=30, dram=503, y_size=L - 2, x_size=1,
                     elem_bytes=7, x_stride=7, y_stride=40)
    assert isa.LOAD.cycles(ARCH, load) == isa.LOAD.cycles(ARCH, plain)


@pytest.mark.parametrize("bad", [dict(elem_bytes=2, x_stride=2), dict(pad_top=1),
                                 dict(y_size=L + 1), dict(mem="accumulator")])
def test_load_transpose_refuses_what_it_cannot_turn(bad):
    state = fresh()
    args = dict(mem="scratchpad", sram=0, dram=0, y_size=2, x_size=3, elem_bytes=1,
                x_stride=1, y_stride=8, transpose=1)
    with pytest.raises(SimulatorError, match="transpose=1"):
        run(state, isa.LOAD(**{**args, **bad}))


def test_gather_copies_the_rows_the_indices_pick():
    """GATHER: row i of dst is the table row index i picks, a negative index counting from
    the end; table and destination rows at their own strides."""
    state = fresh()
    table = rng.integers(0, 256, (7, 40)).astype(np.uint8)  # 7 rows of 5 bytes, stride 40
    state.dram[0][2000:2000 + table.size] = table.ravel()
    indices = np.array([3, -1, 0, 3], "<i4")
    state.dram[0][100:116] = indices.view(np.uint8)
    run(state, isa.GATHER(index=100, count=4, table=2000, rows=7, row_bytes=5, table_stride=40,
                          dst=5000, dst_stride=8))
    got = state.dram[0][5000:5032].reshape(4, 8)[:, :5]
    np.testing.assert_array_equal(got, table[[3, 6, 0, 3], :5])


def test_gather_refuses_an_index_outside_the_table_before_moving_anything():
    state = fresh()
    state.dram[0][100:108] = np.array([1, 7], "<i4").view(np.uint8)
    before = state.dram[:, :8192].copy()
    with pytest.raises(SimulatorError, match=r"index 7 at DRAM 104 is out of range \[-7, 7\)"):
        run(state, isa.GATHER(index=100, count=2, table=2000, rows=7, row_bytes=5,
                              table_stride=5, dst=5000, dst_stride=5))
    np.testing.assert_array_equal(state.dram[:, :8192], before)


def test_gather_cycles():
    """Two latencies, the indices' run, and each row read and written (bursts of 64 B)."""
    lat = ARCH.dma.latency_cycles
    insn = isa.GATHER(index=0, count=128, table=0, rows=1000, row_bytes=768, table_stride=768,
                      dst=0, dst_stride=768)
    index_beats = 128 * 4 // 16
    row_beats = 768 // 16  # twelve bursts of 64 B, four beats each
    assert isa.GATHER.cycles(ARCH, insn) == 2 * lat + index_beats + 2 * 128 * row_beats
    work = isa.GATHER.work(ARCH, insn)
    assert (work.dram_read, work.dram_written) == (128 * 4 + 128 * 768, 128 * 768)


def test_a_wide_add_writes_its_int16_sum_as_two_planes():
    """ADD wide=1: numerics.add's int16 sum, high bytes at dst, low bytes after them; the
    clamp is int16's (qmin, qmax unused), and the scheduler sees both planes written."""
    state = fresh()
    m = [numerics.quantize_multiplier(v) for v in (0.4, 0.5, 200 / (2**20 * 0.6))]
    _params(state, 10, [x for x, _ in m], [s for _, s in m])
    a, b = state.scratchpad[0][0:4].copy(), state.scratchpad[0][4:8].copy()
    insn = isa.ADD(a=0, b=4, dst=20, rows=4, param=10, a_offset=3, b_offset=-7, wide=1)
    run(state, insn)
    want = numerics.add(a, b, 3, -7, [x for x, _ in m], [s for _, s in m], 0, dtype="int16")
    assert np.abs(want).max() > 127  # the sum needs the 16 bits
    got = numerics.join_wide(state.scratchpad[0][20:24], state.scratchpad[0][24:28])
    np.testing.assert_array_equal(got, want)
    assert isa.ADD.access(ARCH, insn)[-1] == (0, 20, 28, True)
    assert isa.ADD.cycles(ARCH, insn) == 2 * isa.ADD.cycles(ARCH, isa.ADD(**{
        **insn.args, "wide": 0}))


@pytest.mark.parametrize("a_wide, b_wide, wide", [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0),
                                                  (1, 1, 1)])
@pytest.mark.parametrize("b_step", [1, 0])
def test_a_wide_mul_reads_and_writes_two_planes(a_wide, b_wide, wide, b_step):
    """MUL a_wide/b_wide: an int16 operand's high plane at a (b), its low plane after its rows
    (after the one gate row with b_step=0); wide: the int16 product, high bytes at dst, low
    after. numerics.mul of the joined codes; the scheduler sees every plane; each pair of
    operand planes is a pass and the product's second plane one more."""
    state = fresh()
    m, s = numerics.quantize_multiplier(0.0007 if wide else 0.000003)
    _params(state, 10, [m], [s])
    b_rows = 4 if b_step else 1
    a = rng.integers(-30000, 30000, (4, L)) if a_wide else rng.integers(-128, 128, (4, L))
    b = rng.integers(-30000, 30000, (b_rows, L)) if b_wide else \
        rng.integers(-128, 128, (b_rows, L))
    sp = state.scratchpad[0]
    sp[0:4 * (1 + a_wide)] = np.concatenate(numerics.split_wide(a)) if a_wide else a
    sp[20:20 + b_rows * (1 + b_wide)] = np.concatenate(numerics.split_wide(b)) if b_wide else b
    insn = isa.MUL(a=0, b=20, dst=40, rows=4, param=10, b_step=b_step, qmin=-100, qmax=90,
                   a_wide=a_wide, b_wide=b_wide, wide=wide)
    run(state, insn)
    bb = b if b_step else np.broadcast_to(b[:1], a.shape)
    if wide:
        want = numerics.mul(a, bb, 0, 0, m, s, 0, *numerics.wide_clamp(-100, 90), dtype="int16")
        got = numerics.join_wide(sp[40:44], sp[44:48])
    else:
        want, got = numerics.mul(a, bb, 0, 0, m, s, 0, -100, 90), sp[40:44]
    assert len(np.unique(want)) > 4  # not all clamped
    np.testing.assert_array_equal(got, want)
    assert isa.decode(isa.encode(insn)).args == insn.args
    assert isa.MUL.access(ARCH, insn) == (
        (0, 0, 4 * (1 + a_wide), False), (0, 20, 20 + b_rows * (1 + b_wide), False),
        (1, 10, 12, False), (0, 40, 40 + 4 * (1 + wide), True))
    narrow = isa.MUL(**{**insn.args, "a_wide": 0, "b_wide": 0, "wide": 0})
    assert isa.MUL.cycles(ARCH, insn) == \
        ((1 + a_wide) * (1 + b_wide) + wide) * isa.MUL.cycles(ARCH, narrow)


def test_a_wide_layernorm_reads_the_low_plane_after_the_high_one():
    """LAYERNORM wide=1 over C = L + 5 channels (two blocks): blocks 0 and 1 the high plane,
    2 and 3 the low one, normalized as numerics.layer_norm of the int16 codes."""
    state = fresh()
    c, rows, stride = L + 5, 3, 8
    x = rng.integers(-3000, 3000, (rows, c))
    x[:, 7] *= 10  # an outlier channel
    high, low = numerics.split_wide(x)
    for block in range(2):
        width = L if block == 0 else 5
        state.scratchpad[0][100 + block * stride:100 + block * stride + rows, :width] = \
            high[:, block * L:block * L + width]
        state.scratchpad[0][100 + (2 + block) * stride:100 + (2 + block) * stride + rows, :width] = \
            low[:, block * L:block * L + width]
    table = np.zeros(isa.layernorm_table_rows(L, c) * L, np.int64)
    mults = [numerics.quantize_multiplier(0.8 * 2**8 / (0.05 * 2**16))] * c
    table[0] = 1
    table[1:1 + c] = [m for m, _ in mults]
    table[1 + c:1 + 2 * c] = [s for _, s in mults]
    table[1 + 2 * c:1 + 3 * c] = rng.integers(-500, 500, c)
    state.accumulator[0][200:200 + isa.layernorm_table_rows(L, c)] = table.reshape(-1, L)
    run(state, isa.LAYERNORM(src=100, dst=300, rows=rows, n=5, blocks=2, stride=stride,
                             table=200, wide=1))
    want = numerics.layer_norm(x, 1, table[1:1 + c], table[1 + c:1 + 2 * c],
                               table[1 + 2 * c:1 + 3 * c], 0, in_dtype="int16")
    got = np.concatenate([state.scratchpad[0][300:300 + rows], state.scratchpad[0][308:308 + rows, :5]],
                         axis=1)
    np.testing.assert_array_equal(got, want)


def _write_blocks(state, base: int, stride: int, x: np.ndarray) -> None:
    """Rows of C channels as SOFTMAX, LAYERNORM and REDUCE address them: channel block b's
    lanes at scratchpad rows base + b * stride, one row per row of x."""
    for block in range(-(-x.shape[1] // L)):
        part = x[:, block * L:(block + 1) * L]
        state.scratchpad[0][base + block * stride:base + block * stride + len(x),
                         :part.shape[1]] = part

def test_a_layernorm_with_out_wide_writes_int16_as_two_planes():
    """LAYERNORM out_wide=1 over C = L + 5 channels: numerics.layer_norm's int16 results, the
    high plane's blocks at dst, the low plane's after them; one more pass than int8 output."""
    state = fresh()
    c, rows, stride = L + 5, 3, 8
    x = rng.integers(-128, 128, (rows, c))
    _write_blocks(state, 100, stride, x)
    table = np.zeros(isa.layernorm_table_rows(L, c) * L, np.int64)
    m, k = numerics.quantize_multiplier(0.8 * 2**8 / (0.0005 * 2**16))  # int16's fine step
    table[0] = 1
    table[1:1 + c], table[1 + c:1 + 2 * c] = m, k
    table[1 + 2 * c:1 + 3 * c] = rng.integers(-50000, 50000, c)
    state.accumulator[0][200:200 + isa.layernorm_table_rows(L, c)] = table.reshape(-1, L)
    insn = isa.LAYERNORM(src=100, dst=300, rows=rows, n=5, blocks=2, stride=stride, table=200,
                         out_wide=1)
    run(state, insn)
    want = numerics.layer_norm(x, 1, table[1:1 + c], table[1 + c:1 + 2 * c],
                               table[1 + 2 * c:1 + 3 * c], 0, dtype="int16")
    assert np.abs(want).max() > 127  # the int16 range is used
    planes = [np.concatenate([state.scratchpad[0][base:base + rows],
                              state.scratchpad[0][base + stride:base + stride + rows, :5]], axis=1)
              for base in (300, 300 + 2 * stride)]
    np.testing.assert_array_equal(numerics.join_wide(*planes), want)
    narrow = isa.LAYERNORM(src=100, dst=300, rows=rows, n=5, blocks=2, stride=stride, table=200)
    assert insn.op.cycles(ARCH, insn) > narrow.op.cycles(ARCH, narrow)

def test_a_wide_softmax_reads_and_writes_two_planes():
    """SOFTMAX wide=1, out_wide=1 over C = L + 5 channels: the int16 input's low plane's blocks
    after the high plane's, the 512-entry table (exp by the distance's high byte, then its
    low byte), numerics.softmax's int16 probabilities in steps of 2^-(8 + fine_bits) written
    as two planes; two passes more than int8's for the input, one for the output."""
    from compiler.graph.int8 import softmax_table
    state = fresh()
    c, rows_, stride = L + 5, 3, 8
    x = rng.integers(-3000, 3000, (rows_, c))
    high, low = numerics.split_wide(x)
    _write_blocks(state, 100, stride, high)
    _write_blocks(state, 100 + 2 * stride, stride, low)
    table = softmax_table(0.002, "int16")
    table_rows = isa.softmax_table_rows(L, 0, 1)
    packed = np.zeros(table_rows * L, np.int32)
    packed[:table.size] = table
    state.accumulator[0][200:200 + table_rows] = packed.reshape(-1, L)
    insn = isa.SOFTMAX(src=100, dst=300, rows=rows_, n=5, blocks=2, stride=stride, table=200,
                       wide=1, out_wide=1, fine_bits=7)
    run(state, insn)
    want = numerics.softmax(x, table, 0, dtype="int16", in_dtype="int16", out_bits=15)
    assert want.max() > 127  # the int16 steps are used
    planes = [np.concatenate([state.scratchpad[0][base:base + rows_],
                              state.scratchpad[0][base + stride:base + stride + rows_, :5]],
                             axis=1)
              for base in (300, 300 + 2 * stride)]
    np.testing.assert_array_equal(numerics.join_wide(*planes), want)
    narrow = isa.SOFTMAX(src=100, dst=300, rows=rows_, n=5, blocks=2, stride=stride, table=200)
    once = -(-rows_ * 2 * L // ARCH.vector.lanes)
    assert isa.SOFTMAX.cycles(ARCH, insn) - isa.SOFTMAX.cycles(ARCH, narrow) == 3 * once
    assert (1, 200, 200 + table_rows, False) in isa.SOFTMAX.access(ARCH, insn)
    assert (0, 100 + 3 * stride, 100 + 3 * stride + rows_, False) in \
        isa.SOFTMAX.access(ARCH, insn)  # the low plane's second block


@pytest.mark.parametrize("fields, says", [
    ({"fine_bits": 3}, "needs out_wide=1"),
    ({"log": 1, "wide": 1}, "log=1 reads and writes int8"),
])
def test_softmax_fields_without_a_form_are_refused(fields, says):
    with pytest.raises(SimulatorError, match=says):
        run(fresh(), isa.SOFTMAX(src=0, dst=40, rows=1, n=4, table=100, **fields))


@pytest.mark.parametrize("op", ["max", "min", "l2"])
def test_reduce_writes_one_value_per_row_in_lane_0(op):
    """REDUCE over C = L + 5 channels (two blocks, SOFTMAX's addressing): numerics.reduce_rows
    of each row into lane 0 of its dst row, the other lanes untouched; l2's rescale from the
    accumulator row at `table`; one pass, and a root step per row for l2."""
    state = fresh()
    c, rows_, stride = L + 5, 3, 8
    x = rng.integers(-128, 128, (rows_, c))
    _write_blocks(state, 100, stride, x)
    m, k = numerics.quantize_multiplier(0.07 / 2**numerics.HYPOT_FRACTION_BITS)
    state.accumulator[0][200, :2] = (m, k)
    before = state.scratchpad[0][300:300 + rows_].copy()
    insn = isa.REDUCE(src=100, dst=300, rows=rows_, n=5, blocks=2, stride=stride, table=200,
                      op=op, in_offset=3, out_offset=-20)
    run(state, insn)
    want = numerics.reduce_rows(x, op, 3, m, k, -20)
    np.testing.assert_array_equal(state.scratchpad[0][300:300 + rows_, 0], want)
    np.testing.assert_array_equal(state.scratchpad[0][300:300 + rows_, 1:], before[:, 1:])
    once = -(-rows_ * 2 * ARCH.lanes // ARCH.vector.lanes)  # one pass over the 2 blocks
    assert insn.op.cycles(ARCH, insn) == once + (rows_ if op == "l2" else 0)
    assert isa.decode(isa.encode(insn)).args == insn.args

def test_a_wide_requant_writes_int16_as_two_planes():
    state = fresh()
    m = [numerics.quantize_multiplier(v) for v in rng.uniform(0.001, 0.01, L)]
    _params(state, 10, [x for x, _ in m], [s for _, s in m])
    acc = state.accumulator[0][20:23].copy()
    run(state, isa.REQUANT(acc=20, sp=40, rows=3, param=10, out_offset=0, wide=1))
    want = numerics.requantize(acc, [x for x, _ in m], [s for _, s in m], 0, axis=1,
                               dtype="int16")
    np.testing.assert_array_equal(
        numerics.join_wide(state.scratchpad[0][40:43], state.scratchpad[0][43:46]), want)


def test_an_add_of_a_wide_operand_rounds_its_sum_once():
    """ADD a_wide=1: a's high plane at a, low plane after it; numerics.wide_add of the whole
    codes, lanes 0 and 1 the operands' multipliers at lane 2's shift (an output scale far
    below b's: TFLite's alignment would round b's term at a step of the output's); the
    scheduler sees both planes read."""
    state = fresh()
    (ma, mb, m0), shifts = numerics.add_multipliers(
        0.01, 300.0, *numerics.quantize_multiplier(300.0))
    _params(state, 10, [ma, mb, m0], list(shifts))
    a = rng.integers(-30000, 30000, (4, L))
    state.scratchpad[0][0:8] = np.concatenate(numerics.split_wide(a))
    b = state.scratchpad[0][8:12].copy()
    insn = isa.ADD(a=0, b=8, dst=20, rows=4, param=10, b_offset=5, a_wide=1, wide=1)
    run(state, insn)
    want = numerics.add(a, b, 0, 5, [ma, mb, m0], shifts, 0, dtype="int16", wide=True)
    exact = np.clip(np.rint(a * 0.01 + (b.astype(np.int64) - 5) * 300.0), -2**15, 2**15 - 1)
    assert np.abs(want - exact).max() <= 1 and np.mean(want == exact) > 0.99
    np.testing.assert_array_equal(
        numerics.join_wide(state.scratchpad[0][20:24], state.scratchpad[0][24:28]), want)
    assert isa.ADD.access(ARCH, insn)[0] == (0, 0, 8, False)
