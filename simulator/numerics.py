"""The integer arithmetic of the accelerator: the one definition shared by the machine's units
and the quantizer's integer reference, so the two can never differ by one LSB.

Everything here is exact integer arithmetic on numpy int64 (no float reaches a result, except
`int_matmul`, whose float64 BLAS products are proven exact below, and the affine map between
real values and codes, `quantize` and `dequantize`, which is float by definition). The rules,
chosen once:

- **Accumulators wrap** modulo 2^32 (two's complement), as hardware adders do. Wrapping is
  associative, so an accumulation gives the same int32 however the compiler splits K into
  tiles, and equals the quantizer's reference in any order. A quantized layer cannot reach the
  wrap in practice: |int8 x int8| <= 2^14, so K < 2^16 products plus an int32 bias of less than
  2^30 stay below 2^31.
- **Rounding is half away from zero**, as gemmlowp's `RoundingDivideByPOT`.
- **Requantization rounds once**: out = clamp(round(acc * multiplier / 2^(31 + shift)) + offset).
  This is the exact real rescale to within the multiplier's own error; gemmlowp and TFLite
  round twice (a doubling high multiply, then a shift), which can differ by one LSB.
- **Quantization rounds half to even** and saturates, as ONNX QuantizeLinear:
  q = clamp(rint(x / scale) + zero_point), real = (q - zero_point) * scale. The float type of
  that arithmetic is a parameter, not a choice made here: the program's boundary quantizes in
  float32 exactly as QuantizeLinear, the quantizer computes its constants in float64.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.errors import SimulatorError

RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-(2**15), 2**15 - 1),
          "int32": (-(2**31), 2**31 - 1)}

# Requantization shifts: the total right shift 31 + shift must lie in [0, 62] so that the
# rounding mask fits in int64; this covers real scales in [2^-32, 2^31).
SHIFT_MIN, SHIFT_MAX = -31, 31

# TFLite's quantized ADD aligns both inputs at 2^20 before rescaling them, so that the two
# input rescales lose no precision: |x - offset| <= 255 < 2^8, shifted < 2^28, sums < 2^29.
ADD_LEFT_SHIFT = 20


# The largest single tensor ember makes (a model input, a folded constant, an activation, an
# array read from a file), in bytes. Shapes come from files, so each one is checked against this
# before anything is allocated: a 10^12-element shape is then a clean error, not a MemoryError.
MAX_TENSOR_BYTES = 1 << 32


def oversize(shape, dtype) -> str | None:
    """Why a tensor of this shape and element type is too large to make, or None."""
    size = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
    if size <= MAX_TENSOR_BYTES:
        return None
    return (f"shape {list(shape)} of {np.dtype(dtype)} is {size:,} bytes, over the limit of "
            f"{MAX_TENSOR_BYTES >> 30} GiB for one tensor")


# float64 represents every integer of magnitude <= 2^53 exactly. See `int_matmul`.
_EXACT_TERMS = 2**39
_WIDE_EXACT_TERMS = 2**31  # int16 x int8 products: |product| <= 2^22
_BOTH_WIDE_EXACT_TERMS = 2**23  # int16 x int16 products: |product| <= 2^30


def saturate(x, dtype: str) -> np.ndarray:
    """Clamp to the range of `dtype` ("int8", "uint8", "int32") and return that dtype."""
    lo, hi = RANGES[dtype]
    return np.clip(np.asarray(x, dtype=np.int64), lo, hi).astype(dtype)


def wrap32(x) -> np.ndarray:
    """Two's-complement wrap of int64 values to int32: the accumulator's overflow rule."""
    return np.asarray(x, dtype=np.int64).astype(np.int32)


def mac(acc, a, b) -> np.ndarray:
    """One multiply-accumulate per element: acc + a * b, int8 x int8 into a wrapping int32."""
    return wrap32(np.asarray(acc, np.int64) + np.asarray(a, np.int64) * np.asarray(b, np.int64))


def centre(x, offset: int) -> np.ndarray:
    """x - offset, int16: an int8 operand of the array less its zero point (int9). The array's
    products of two such operands stay below 2^16 in magnitude, so `int_matmul` is exact for
    them as for int8 (its bound has the 4x margin for it)."""
    return np.asarray(x, np.int16) - np.int16(offset)


def int_matmul(a, b) -> np.ndarray:
    """Exact int8 (M, K) x int8 (K, N) -> int32 (M, N) through float64 BLAS.

    Why exact: every product satisfies |a_ik * b_kj| <= 128 * 128 = 2^14. Whatever order or
    blocking BLAS uses, each intermediate it forms is a partial sum of a subset of the K
    products, so its magnitude is at most K * 2^14. While K <= 2^39 that is <= 2^53, and every
    integer of magnitude <= 2^53 is a float64; the sum of two floats whose exact sum is such an
    integer is that integer (IEEE 754 rounds an exact result to itself), and so is an FMA's. By
    induction over the additions every intermediate is exact, hence the result is. (The project's
    usual statement, "fewer than 2^37 terms", is the same argument with a 4x margin.) The
    int64 -> int32 conversion then applies the accumulator's wrapping rule.

    An int16 operand (codes of an int16 activation, `split_wide`) times int8 weights: each
    product is at most 2^15 * 2^7 = 2^22, so the same argument holds for K <= 2^31. The result
    is the int32 the array's two passes of its planes leave (high plane shifted by
    WIDE_HIGH_SHIFT, low plane less -WIDE_LOW_OFFSET: `array_pass`), since both are the exact
    sum modulo 2^32. Likewise int8 activation codes times int16 weights (`split_weight`: each
    product at most 2^7 * 2^14 = 2^21): the result is the high tile's pass shifted by
    WEIGHT_HIGH_SHIFT plus the low tile's. Both int16 (an int16 activation times int16
    weights: each product at most 2^15 * 2^15 = 2^30), the same argument holds for K <= 2^23,
    and the result is the four passes' (`wide_passes`).
    """
    a = np.asarray(a)
    b = np.asarray(b)
    wide = (a.dtype == np.int16) + (b.dtype == np.int16)
    bound, text = ((_BOTH_WIDE_EXACT_TERMS, "2^23") if wide == 2 else
                   (_WIDE_EXACT_TERMS, "2^31") if wide else (_EXACT_TERMS, "2^39"))
    if a.shape[-1] > bound:
        raise SimulatorError(f"int_matmul: K = {a.shape[-1]} exceeds the exact bound {text}")
    product = np.matmul(a.astype(np.float64), b.astype(np.float64))
    return wrap32(product.astype(np.int64))


def matmul_accumulate(acc, a, b) -> np.ndarray:
    """acc + a @ b with int32 wrapping: what one array pass does to its accumulator rows.

    Adding the int32 accumulator in float64 stays exact by the argument of `int_matmul`:
    |acc| < 2^31 plus K * 2^14 is below 2^53 while K <= 2^38.
    """
    a = np.asarray(a)
    if a.shape[-1] > _EXACT_TERMS // 2:
        raise SimulatorError(f"matmul_accumulate: K = {a.shape[-1]} exceeds the exact bound 2^38")
    total = np.matmul(a.astype(np.float64), np.asarray(b).astype(np.float64))
    total += acc
    return wrap32(total.astype(np.int64))


# The most terms of one product that float32 sums exactly: see `array_pass`.
ARRAY_PASS_FLOAT32_TERMS = 256
# An int16 operand's high plane weighs 2^WIDE_HIGH_SHIFT against its low plane's. The largest
# left shift of an array pass (COMPUTE's `shift`, a field of as many bits as it needs) is two
# such planes' product: a MatMul of two int16 activations (`activation_passes`).
WIDE_HIGH_SHIFT = 8
ARRAY_SHIFT_MAX = 2 * WIDE_HIGH_SHIFT


def array_pass(acc, x, w, shift: int = 0) -> np.ndarray:
    """acc + (x @ w) * 2^shift with int32 wrapping (without acc, the shifted product alone):
    array passes over the k rows of the weights, for int9 operands (int8 codes, or int8 codes
    less an int8 zero point: `centre`), given as integers or as float32 holding such integers.
    Leading axes broadcast as numpy's matmul. `shift` (0 to ARRAY_SHIFT_MAX) weights a pass of
    an int16 operand's high plane (`split_wide`) by 2^8 against its low plane's: the product
    is summed exactly, then shifted, wrapping (`shift_wrap`).

    float32 BLAS is exact here, and faster than float64: every product is at most 255^2 < 2^16
    in magnitude, so over at most 256 terms every partial sum is below 2^24, and by
    `int_matmul`'s argument with float32's 24-bit significand every intermediate is exact.
    Longer rows (a chain of passes fused, `simulator.plan`) are summed in pieces of 256 terms,
    each exact, added in int32 (wrapping, associative: the same integers in any order)."""
    x = np.asarray(x)
    w = np.asarray(w)
    k = x.shape[-1]
    total = acc
    for start in range(0, max(k, 1), ARRAY_PASS_FLOAT32_TERMS):
        piece = slice(start, start + ARRAY_PASS_FLOAT32_TERMS)
        product = np.matmul(x[..., piece].astype(np.float32, copy=False),
                            w[..., piece, :].astype(np.float32, copy=False)).astype(np.int32)
        if shift:
            product = shift_wrap(product, shift)
        total = product if total is None else np.add(total, product, dtype=np.int32)
    return total


def shift_wrap(x, shift: int) -> np.ndarray:
    """x * 2^shift of int32 values, wrapping to int32: a shifted array pass's contribution.
    Wrapping commutes with the shift (2^shift (a mod 2^32) = 2^shift a mod 2^32), so a sum
    shifted once equals the sum of its shifted parts, in any order and split: the plan's fused
    chains and the quantizer's reference agree with the passes one by one."""
    if not 0 <= shift <= ARRAY_SHIFT_MAX:
        raise SimulatorError(f"array shift {shift}: expected 0 to {ARRAY_SHIFT_MAX}")
    return wrap32(np.asarray(x, np.int64) << shift)


def rounding_shift(x, shift) -> np.ndarray:
    """x / 2^shift rounded half away from zero (gemmlowp RoundingDivideByPOT), shift in [0, 62].

    Exact on int64: the quotient is x >> shift (floor), plus one when the discarded remainder
    exceeds half, where "half" counts as exceeding for positive x only (away from zero).
    """
    x = np.asarray(x, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    outside = shift[(shift < 0) | (shift > 62)]
    if outside.size:
        # One value, not the array: the error is one line even for a forged parameter block.
        raise SimulatorError(f"rounding_shift: shift must lie in [0, 62], got {outside.flat[0]}"
                             + (f" (and {outside.size - 1} more outside)" if outside.size > 1
                                else ""))
    mask = (np.int64(1) << shift) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> shift) + (remainder > threshold)


def _along(values, ndim: int, axis: int | None, dtype=np.int64) -> np.ndarray:
    """Shape per-channel `values` to broadcast along `axis` of an ndim array."""
    values = np.asarray(values, dtype=dtype)
    if axis is None or values.ndim == 0:
        return values
    shape = [1] * ndim
    shape[axis] = -1
    return values.reshape(shape)


def rescale(x, multiplier, shift, axis: int | None = None) -> np.ndarray:
    """round(x * multiplier / 2^(31 + shift)), half away from zero; exact, no clamp.

    |x| < 2^31 and |multiplier| < 2^31 keep the product inside int64.
    """
    x = np.asarray(x, dtype=np.int64)
    multiplier = _along(multiplier, x.ndim, axis)
    shift = _along(shift, x.ndim, axis)
    return rounding_shift(x * multiplier, 31 + shift)


def requantize(acc, multiplier, shift, out_offset=0, qmin=None, qmax=None, *,
               axis: int | None = None, dtype: str = "int8") -> np.ndarray:
    """int32 accumulators -> `dtype`: clamp(rescale(acc, multiplier, shift) + out_offset).

    `multiplier` and `shift` are scalars or per-channel vectors laid along `axis` of `acc`;
    qmin/qmax default to the range of `dtype` (a fused ReLU raises qmin to the zero point).
    """
    lo, hi = RANGES[dtype]
    qmin = lo if qmin is None else qmin
    qmax = hi if qmax is None else qmax
    acc = np.asarray(acc, dtype=np.int64)
    out = rescale(acc, multiplier, shift, axis) + _along(out_offset, acc.ndim, axis)
    return np.clip(out, qmin, qmax).astype(dtype)


def _affine(values, ndim: int, axis: int | None, dtype) -> np.ndarray:
    """A scale or zero point as `dtype`, laid along `axis`; a single value is a scalar."""
    values = np.asarray(values, dtype=dtype)
    return values.reshape(()) if values.size == 1 else _along(values, ndim, axis, dtype)


def quantize(x, scale, zero_point=0, qmin=None, qmax=None, *, axis: int | None = None,
             dtype: str = "int8", arithmetic=np.float32) -> np.ndarray:
    """Real values -> `dtype` codes: clamp(rint(x / scale) + zero_point), ties to even.

    The division, rounding and addition run in `arithmetic` (float32 is ONNX QuantizeLinear's),
    so each caller states the exact bits it wants. `scale` and `zero_point` are scalars or
    per-channel vectors laid along `axis` of x; qmin/qmax default to the range of `dtype`.
    """
    lo, hi = RANGES[dtype]
    qmin = lo if qmin is None else qmin
    qmax = hi if qmax is None else qmax
    x = np.asarray(x, dtype=arithmetic)
    scale = _affine(scale, x.ndim, axis, arithmetic)
    q = np.rint(x / scale) + _affine(zero_point, x.ndim, axis, arithmetic)
    return np.clip(q, qmin, qmax).astype(dtype)


def dequantize(q, scale, zero_point=0, *, axis: int | None = None,
               arithmetic=np.float32) -> np.ndarray:
    """Codes -> real values (q - zero_point) * scale, as ONNX DequantizeLinear: the difference
    exact in int64, the product in `arithmetic`, which is also the result's type."""
    q = np.asarray(q, dtype=np.int64)
    centred = q - _affine(zero_point, q.ndim, axis, np.int64)
    return centred.astype(arithmetic) * _affine(scale, q.ndim, axis, arithmetic)


def add(x, y, x_offset, y_offset, multipliers, shifts, out_offset, qmin=None, qmax=None, *,
        dtype: str = "int8", left_shift: int = ADD_LEFT_SHIFT, wide: bool = False):
    """Quantized elementwise add of two tensors with their own scales: int8 ones as TFLite's
    ADD, an int16 one (`wide`) by `wide_add`.

    multipliers/shifts = (x, y, out): the input rescales map each input to a common scale
    2^-left_shift finer than the larger input scale; the output rescale maps the sum to the
    output scale. The compiler derives all three with `quantize_multiplier`. The sum may be
    int16 (`dtype`: a residual stream, `split_wide`). With `wide` (an operand is int16: a
    residual stream, a map by a constant) the sum rounds once instead, and the lanes are
    `wide_add`'s. x and y broadcast (numpy rules).
    """
    if wide:
        return wide_add(x, y, x_offset, y_offset, multipliers, shifts, out_offset, qmin, qmax,
                        dtype=dtype)
    xs, ys = _common_scale(x, y, x_offset, y_offset, multipliers, shifts, left_shift)
    return requantize(xs + ys, multipliers[2], shifts[2], out_offset, qmin, qmax, dtype=dtype)


def wide_add(x, y, x_offset, y_offset, multipliers, shifts, out_offset, qmin=None, qmax=None,
             *, dtype: str = "int16") -> np.ndarray:
    """The add of an int16 operand (`split_wide`) and an int8 or int16 one, rounded once:
    clamp(round(((x - x_offset) m_x + (y - y_offset) m_y) / 2^(31 + shift)) + out_offset),
    m_x = multipliers[0] and m_y = multipliers[1] the two operands' ratios s_x / s_out and
    s_y / s_out at one shift, lane 2's (`add_multipliers`: the larger ratio's, its multiplier
    Q31-normalised); lane 2's multiplier and lanes 0 and 1's shifts are unused. A Sub's m_y is
    negative. x and y broadcast (numpy rules).

    TFLite's form (`add`) rounds each operand at 2^-left_shift of the larger input scale and
    the sum again at the output's: an int16 operand aligned so that its rescale stays inside
    int64 leaves only 2^12 between those steps, so an output scale near the larger input's
    2^-12 (operands of very different scales, or a sum that cancels) rounds two or three
    times. Here nothing rounds before the end, so the sum errs only by its one rounding and by
    the multipliers' own error (2^-31 of the larger ratio; the smaller multiplier's rounding is
    at most half a unit of 2^-(31 + shift), and shift is the larger ratio's).

    Exact in int64: with offsets of at most 8 bits (an int16 tensor's zero point is 0, an int8
    one's in [-128, 127]) each centred operand is below 2^15 + 2^7 < 2^16 in magnitude (int8:
    2^8), each |multiplier| < 2^31 (`quantize_multiplier`), so each product is below 2^47 and
    their sum below 2^48; `rounding_shift` takes it, 31 + shift in [0, 62].
    """
    xc = np.asarray(x, np.int64) - x_offset
    yc = np.asarray(y, np.int64) - y_offset
    total = xc * np.asarray(multipliers[0], np.int64) + yc * np.asarray(multipliers[1], np.int64)
    lo, hi = RANGES[dtype]
    qmin = lo if qmin is None else qmin
    qmax = hi if qmax is None else qmax
    out = rounding_shift(total, 31 + np.asarray(shifts[2], np.int64)) + out_offset
    return np.clip(out, qmin, qmax).astype(dtype)


def add_multipliers(x_ratio: float, y_ratio: float, multiplier: int, shift: int
                    ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """`wide_add`'s parameter lanes (multipliers, shifts) for the operands' real ratios s_x /
    s_out and s_y / s_out, given the larger ratio's `quantize_multiplier` (multiplier, shift):
    the larger's lane holds that multiplier, the smaller's round(ratio * 2^(31 + shift))
    (float64: a power-of-two scaling, then one rounding) capped at it, so below 2^31. Every
    lane's shift is the one shift, lane 2's multiplier is 0 (unused)."""
    larger = max(x_ratio, y_ratio)
    lanes = tuple(multiplier if r == larger else
                  min(int(np.rint(math.ldexp(r, 31 + shift))), multiplier)
                  for r in (x_ratio, y_ratio))
    return (*lanes, 0), (shift, shift, shift)


# An int16 value in the machine's 8-bit memories: two planes of int8 codes, the high byte
# (signed) and the low byte offset by -128, so that each plane is an ordinary int8 tensor.
WIDE_LOW_OFFSET = 128


def split_wide(v) -> tuple[np.ndarray, np.ndarray]:
    """int16 values → (high, low) int8 planes: v = high * 256 + low + 128."""
    v = np.asarray(v, np.int64)
    return (v >> 8).astype(np.int8), ((v & 0xFF) - WIDE_LOW_OFFSET).astype(np.int8)


def wide_clamp(qmin: int, qmax: int) -> tuple[int, int]:
    """The int16 range an 8-bit clamp (qmin, qmax) stands for on a wide result: the codes
    whose high byte lies in [qmin, qmax], i.e. [qmin * 256, qmax * 256 + 255]. The defaults
    (-128, 127) are the whole int16 range; (0, 127) a fused ReLU's; (-2^(b-9), 2^(b-9) - 1) a
    b-bit int16 tensor's (`quantizer.wide`: the array's accumulator bound)."""
    return qmin << 8, (qmax << 8) | 0xFF


def join_wide(high, low) -> np.ndarray:
    """The int16 values of two planes (`split_wide`'s inverse), as int64."""
    return (np.asarray(high, np.int64) << 8) + np.asarray(low, np.int64) + WIDE_LOW_OFFSET


# An int16 weight (`QuantOptions.int16_weights`) in the array's int8 tiles: w = high * 2^7 +
# low with high = w >> 7 and low = w & 127, both int8 codes as they are (high in [-128, 127]
# for |w| <= 2^14, low in [0, 127]), so neither pass needs a weight offset. The array runs the
# high tile's pass with COMPUTE shift=WEIGHT_HIGH_SHIFT and the low tile's with shift 0 into
# the same accumulator rows; WIDE_WEIGHT_BITS-bit symmetric codes (|w| <= 2^14 - 1) split so.
WEIGHT_HIGH_SHIFT = 7
WIDE_WEIGHT_BITS = 15


def split_weight(w) -> tuple[np.ndarray, np.ndarray]:
    """int16 weight codes of at most WIDE_WEIGHT_BITS bits -> (high, low) int8 tiles:
    w = high * 2^7 + low, low in [0, 127]. Exact for every w in [-2^14, 2^14 - 1]; a code
    outside raises (its high part would not be an int8)."""
    w = np.asarray(w, np.int64)
    limit = 1 << (WIDE_WEIGHT_BITS - 1)
    if w.size and (w.min() < -limit or w.max() >= limit):
        raise SimulatorError(f"split_weight: codes must lie in [{-limit}, {limit - 1}], got "
                             f"[{w.min()}, {w.max()}]")
    low_mask = (1 << WEIGHT_HIGH_SHIFT) - 1
    return (w >> WEIGHT_HIGH_SHIFT).astype(np.int8), (w & low_mask).astype(np.int8)


# An int16 activation (`split_wide`) times int16 weights (`split_weight`): four array passes,
# one per (input plane, weight part), each shifted by the sum of its two weights' shifts.
def wide_passes() -> tuple[tuple[int, int, int], ...]:
    """The array passes of an int16 input times int16 weights, in the order the compiler
    emits them for each tap: (input plane, weight part, COMPUTE shift), plane and part 0 the
    high one. x = 2^8 x_h + x_l (x_l = low byte + 128, in [0, 255]) and w = 2^7 w_h + w_l
    (w_l in [0, 127]), so x w = 2^15 x_h w_h + 2^7 x_l w_h + 2^8 x_h w_l + x_l w_l: the shifts
    15, 7, 8 and 0, the largest COMPUTE's 4-bit field holds (ARRAY_SHIFT_MAX)."""
    return ((0, 0, WIDE_HIGH_SHIFT + WEIGHT_HIGH_SHIFT), (1, 0, WEIGHT_HIGH_SHIFT),
            (0, 1, WIDE_HIGH_SHIFT), (1, 1, 0))


def activation_passes(a_wide: bool, b_wide: bool) -> tuple[tuple[int, int, int], ...]:
    """The array passes of a MatMul of two activations, in the order the compiler emits them
    for each K slice: (streamed operand a's plane, stationary operand b's plane, COMPUTE
    shift), plane 0 the high one (an int8 operand's only plane). Each plane of an int16 operand
    is int8 codes (`split_wide`): its high plane weighs 2^8, its low plane holds the low byte
    - 128, offset by -WIDE_LOW_OFFSET on the array (x_offset, or PRELOAD's w_offset). So with
    a = 2^8 a_h + a_l and b = 2^8 b_h + b_l, a b = 2^16 a_h b_h + 2^8 a_l b_h + 2^8 a_h b_l +
    a_l b_l: passes shifted 16, 8, 8 and 0 (ARRAY_SHIFT_MAX), b's high plane first (one
    PRELOAD for a's planes in turn)."""
    return tuple((a, b, WIDE_HIGH_SHIFT * ((a_wide and a == 0) + (b_wide and b == 0)))
                 for b in range(1 + b_wide) for a in range(1 + a_wide))


def pass_magnitude(codes, weights: bool) -> np.ndarray:
    """|high| 2^s + low of each code as the array's passes see it (int64): int16 weight codes
    (`weights`, `split_weight`: s = 7, low in [0, 127]) or int16 activation codes
    (`split_wide`: s = 8, low the byte in [0, 255]). It bounds |code| (equal for codes >= 0),
    and over an input's and a weight's passes the magnitudes of the four terms of a product
    (`wide_passes`) sum to exactly pass_magnitude(x) * pass_magnitude(w): any partial sum of
    the passes' terms, in any order, is at most the sum of these products."""
    codes = np.asarray(codes, np.int64)
    shift = WEIGHT_HIGH_SHIFT if weights else WIDE_HIGH_SHIFT
    return (np.abs(codes >> shift) << shift) + (codes & ((1 << shift) - 1))


def extremum(x, y, x_offset, y_offset, multipliers, shifts, out_offset, qmin=None, qmax=None,
             *, op: str, dtype: str = "int8") -> np.ndarray:
    """Quantized elementwise Max (op="max") or Min (op="min") of int8 tensors with their own
    scales: `add`'s rescales of each input to the common scale, the larger (smaller) of the
    two, requantized by the output rescale as add's sum. x and y broadcast (numpy rules)."""
    xs, ys = _common_scale(x, y, x_offset, y_offset, multipliers, shifts)
    pick = np.maximum(xs, ys) if op == "max" else np.minimum(xs, ys)
    return requantize(pick, multipliers[2], shifts[2], out_offset, qmin, qmax, dtype=dtype)


# The root of hypot's sum of squares in Q8: a code's 256th, so the root's own rounding is far
# below the output's step.
HYPOT_FRACTION_BITS = 8


def hypot(x, y, x_offset, y_offset, multipliers, shifts, out_offset, qmin=None, qmax=None, *,
          dtype: str = "int8") -> np.ndarray:
    """sqrt((x - x_offset)^2 + (y - y_offset)^2) of two int8 or int16 tensors in one scale s (a
    complex spectrum's magnitude: the squares of its parts, their sum and its root fused, so the
    power, whose range 8 bits do not hold, never rounds): the sum of squares exact in int64
    (< 2^33, shifted to < 2^49), its root in Q(HYPOT_FRACTION_BITS) by `isqrt`, requantized by
    the output rescale (multipliers[2], shifts[2]: s 2^-8 / s_out) as add's sum, + out_offset,
    clamped. Lanes 0 and 1 are unused: the operands share their scale. x and y broadcast (numpy
    rules)."""
    dx = np.asarray(x, np.int64) - x_offset
    dy = np.asarray(y, np.int64) - y_offset
    root = isqrt((dx * dx + dy * dy) << (2 * HYPOT_FRACTION_BITS))
    return requantize(root, multipliers[2], shifts[2], out_offset, qmin, qmax, dtype=dtype)


def _common_scale(x, y, x_offset, y_offset, multipliers, shifts, left_shift=ADD_LEFT_SHIFT):
    """`add`'s inputs, centred and rescaled to the common scale by lanes 0 and 1."""
    xs = rescale((np.asarray(x, np.int64) - x_offset) << left_shift, multipliers[0], shifts[0])
    ys = rescale((np.asarray(y, np.int64) - y_offset) << left_shift, multipliers[1], shifts[1])
    return xs, ys


def mul(x, y, x_offset, y_offset, multiplier, shift, out_offset, qmin=None, qmax=None, *,
        dtype: str = "int8") -> np.ndarray:
    """Quantized elementwise product of int8 or int16 tensors with their own scales (TFLite's
    MUL): (x - x_offset)(y - y_offset) of the whole codes, exact in int64, requantized once by
    multiplier and shift (`quantize_multiplier` of s_x s_y / s_out), + out_offset, clamped to
    `dtype` (int16: a wide product, `split_wide`). x and y broadcast (numpy rules).

    One formulation for every width, so an int16 product never rounds twice: with int8 offsets
    each centred factor is below 2^15 + 2^7 in magnitude (int8: 2^8), the product below 2^31
    (int8 x int8: 2^16), and `rescale`'s product by a Q31 multiplier below 2^62, inside
    int64. The machine's 8 x 8 multipliers sum an int16 operand's partial products per plane
    (`split_wide`) into this same integer before the one rounding shift."""
    product = (np.asarray(x, np.int64) - x_offset) * (np.asarray(y, np.int64) - y_offset)
    return requantize(product, multiplier, shift, out_offset, qmin, qmax, dtype=dtype)


def window_sum(windows, offset) -> np.ndarray:
    """Sum of (x - offset) over the last two axes (a pooling window), exact in int64: the sum of
    x less the window's size times the offset, so a view of overlapping windows is reduced in
    place, never copied out window by window (kh * kw times the image)."""
    windows = np.asarray(windows)
    size = windows.shape[-2] * windows.shape[-1]
    return windows.sum(axis=(-2, -1), dtype=np.int64) - np.int64(offset) * size


def window_max(windows, window_axes: int = 2) -> np.ndarray:
    """The largest code over the last `window_axes` axes (a pooling window), in the codes' own
    type: int8 codes, or int16 ones (`join_wide` of an int16 value's two planes: one compare on
    the whole value, never plane by plane, since the low plane alone orders nothing)."""
    windows = np.asarray(windows)
    return windows.max(axis=tuple(range(windows.ndim - window_axes, windows.ndim)))


def gather_index(indices, size: int) -> np.ndarray:
    """ONNX Gather's indices into an axis of `size` entries as int64 positions, a negative
    index counting from the end; an index outside [-size, size) raises SimulatorError naming
    it and its position (the data decides it, so no program can be checked beforehand)."""
    indices = np.asarray(indices, np.int64)
    bad = np.argwhere((indices < -size) | (indices >= size))
    if bad.size:
        where = tuple(int(i) for i in bad[0])
        raise SimulatorError(f"index {int(indices[where])} at {list(where)} is out of range "
                             f"[{-size}, {size})")
    return np.where(indices < 0, indices + size, indices)


def lookup(x, table) -> np.ndarray:
    """table[x + 128] for int8 x and a 256-entry int8 table (sigmoid, tanh, ...)."""
    return np.asarray(table, np.int8)[np.asarray(x, np.int64) + 128]


def lookup_lanes(x, tables) -> np.ndarray:
    """tables[x + 128, j] for int8 x whose last axis is j: a 256-entry int8 table per lane
    (per channel: PRelu with a slope per channel), `tables` of shape (256, lanes)."""
    return _entries(np.asarray(tables, np.int8), np.asarray(x, np.int64) + 128)


def lookup_wide(x, table) -> np.ndarray:
    """table[x + 128] for int8 x and a 256-entry int16 table: a table op whose output is
    int16 (each entry an int16 code, written as two planes, `split_wide`); a table of shape
    (256, lanes) is a table per lane, x's last axis (`lookup_lanes`)."""
    return _entries(np.asarray(table, np.int16), np.asarray(x, np.int64) + 128)


def _entries(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """table[index]; with a table per lane, (entries, lanes), lane j's entry at index's lane j
    (its last axis)."""
    if table.ndim == 1:
        return table[index]
    return table[index, np.arange(index.shape[-1])]


# A table op reading int16 codes: a table of KNOTS 16-bit entries, entry k the function at
# the code (k - 128) * 256 (k = 256 one past the largest code), indexed by the code's high
# byte and interpolated linearly by its low byte, in 256ths.
KNOTS = 257
KNOT_BITS = 8  # the codes between two knots: 2^8, the low byte's
# A window of finer knots (LUT zoom > 0): KNOTS more entries after the coarse ones, 2^(8 -
# zoom) codes apart from code `origin` on, which the codes inside the window interpolate
# between instead. 257 knots over all 65,536 codes put a function's every bend (HardSwish's
# at +-3, a sigmoid's knee) between a few knots when the input's range is wide; the window
# puts 256 segments where the bends are (`compiler.graph.int8.knot_window` places it).
MAX_ZOOM = KNOT_BITS
# The entries of a table whose output is int8 are that output's codes in Q7 (each code 128
# fine steps): a knot's own rounding is 1/256 of an output step, and the int16 entries hold
# twice the output's range, so that a knot just past it (saturated at the range's end) would
# not bend the interpolation towards it. An int16 output's entries are its codes.
KNOT_FRACTION_BITS = {"int8": 7, "int16": 0}


def knot_entries(zoom: int = 0) -> int:
    """Entries of an int16 input's table: the coarse knots, and a window's as many again."""
    return KNOTS * (2 if zoom else 1)


def window_codes(zoom: int) -> int:
    """The int16 codes a window of zoom `zoom` (1..MAX_ZOOM) spans: 256 segments of
    2^(8 - zoom) codes."""
    return (KNOTS - 1) << (KNOT_BITS - zoom)


def interpolate(x, table, dtype: str = "int8", zoom: int = 0, origin: int = 0) -> np.ndarray:
    """An int16 code x (`join_wide` of its planes) through a table of int16 knots: with h = x
    >> 8 (the high byte, -128..127) and f = x & 255 (the low byte + 128, 0..255), the knots T0
    = table[h + 128] and T1 = table[h + 129] are weighed as T0 (256 - f) + T1 f = 256 T0 + (T1
    - T0) f, exact in int64 (|.| < 2^24), and rounded once, half away from zero, to `dtype`
    codes: a right shift by 8 plus the entries' fraction bits (KNOT_FRACTION_BITS: 7 for int8,
    whose entries are Q7, 0 for int16), then saturated. With zoom z > 0 the table holds KNOTS
    more knots, 2^s codes apart (s = 8 - z) from code `origin`: a code x with 0 <= x - origin
    < 256 * 2^s takes h = (x - origin) >> s into them and f = its low s bits, the shift s
    instead of 8 (`window_codes`). The result lies between the two knots' values, so entries
    inside a range keep it inside. A table of shape (entries, lanes) is a table per lane, x's
    last axis (a ChannelMap's per channel, LUT per_lane=1)."""
    x = np.asarray(x, np.int64)
    table = np.asarray(table, np.int64)
    if not 0 <= zoom <= MAX_ZOOM:
        raise SimulatorError(f"interpolate: zoom {zoom}; expected 0 (no window) to {MAX_ZOOM}")
    if table.shape[0] != knot_entries(zoom):
        raise SimulatorError(f"interpolate: a table of {table.shape[0]} entries; expected "
                             f"{knot_entries(zoom)} (one per high byte and one past the last"
                             + (", then as many for the window)" if zoom else ")"))
    index = (x >> KNOT_BITS) + 128
    fraction = x & ((1 << KNOT_BITS) - 1)
    shift = np.int64(KNOT_BITS)
    if zoom:
        step = KNOT_BITS - zoom
        offset = x - origin
        inside = (offset >= 0) & (offset < window_codes(zoom))
        index = np.where(inside, KNOTS + (offset >> step), index)
        fraction = np.where(inside, offset & ((1 << step) - 1), fraction)
        shift = np.where(inside, step, shift)
    return weigh_knots(_entries(table, index), _entries(table, index + 1), fraction, shift,
                       dtype)


def weigh_knots(first, second, fraction, shift, dtype: str = "int8") -> np.ndarray:
    """Two knots' int16 entries weighed by `fraction` of 2^`shift` (`interpolate`'s step, and
    the quantizer's when it places a window, `int8.knot_window`): first 2^shift + (second -
    first) fraction, exact in int64, rounded once, half away from zero, by the shift plus the
    entries' fraction bits (KNOT_FRACTION_BITS), saturated to `dtype` codes."""
    first = np.asarray(first, np.int64)
    fine = (first << shift) + (np.asarray(second, np.int64) - first) * fraction
    out = rounding_shift(fine, shift + KNOT_FRACTION_BITS[dtype])
    return np.clip(out, *RANGES[dtype]).astype(dtype)


def quantize_multiplier(real_scale: float) -> tuple[int, int]:
    """A positive real ratio -> (multiplier, shift) with real ~= multiplier * 2^-(31 + shift).

    multiplier lies in [2^30, 2^31) (Q31 with the top bit normalised), so rounding it to the
    nearest integer gives a relative error |m * 2^-(31+s) / real - 1| <= 2^-31. Valid for real
    scales in [2^-32, 2^31) (less the last half ulp of Q31 below 2^31, which rounds up to it);
    anything else raises, naming the value.
    """
    if not (isinstance(real_scale, (int, float)) and math.isfinite(real_scale) and real_scale > 0):
        raise SimulatorError(f"quantize_multiplier: scale must be a positive finite number, "
                             f"got {real_scale!r}")
    (multiplier,), (shift,) = quantize_multipliers([real_scale])
    return int(multiplier), int(shift)


def quantize_multipliers(real_scales) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_multiplier` of each of the positive finite `real_scales` at once (a per-channel
    requantization has thousands): (multipliers, shifts), int64. mantissa * 2^31 is exact in
    float64 (a power-of-two scaling of a 53-bit mantissa), and rint rounds it half to even as
    the exact rational would be."""
    reals = np.asarray(real_scales, np.float64).reshape(-1)
    bad = ~(np.isfinite(reals) & (reals > 0))
    if bad.any():
        raise SimulatorError(f"quantize_multiplier: scale must be a positive finite number, "
                             f"got {reals[bad][0]!r}")
    # real = mantissa * 2^exponent with mantissa in [0.5, 1)
    mantissa, exponent = np.frexp(reals)
    multipliers = np.rint(mantissa * 2.0**31).astype(np.int64)
    carried = multipliers == 2**31
    multipliers[carried] = 2**30
    shifts = -(exponent.astype(np.int64) + carried)
    outside = (shifts < SHIFT_MIN) | (shifts > SHIFT_MAX)
    if outside.any():
        raise SimulatorError(f"quantize_multiplier: scale {float(reals[outside][0])!r} is "
                             f"outside the representable range [2^-32, 2^31)")
    return multipliers, shifts


# Softmax: the exp table's entries carry this many fraction bits (its entry for the row's maximum
# is exactly 1.0 = 2^SOFTMAX_EXP_BITS, so a row's sum is at least that), and a probability is
# written in steps of 2^-SOFTMAX_OUT_BITS.
SOFTMAX_EXP_BITS = 20
SOFTMAX_OUT_BITS = 8
# LogSoftmax: the mantissa of a row's sum indexes a table of ln(1 + j / 2^LOG_MANTISSA_BITS),
# and the bits below the index interpolate linearly between two entries.
LOG_MANTISSA_BITS = 8
LOG_FRACTION_BITS = 16
EXP_ENTRIES = 256  # one per distance max - x of int8 codes
# An int16 input's table: exp(-s_x 256 h) for the distance's high byte h, then exp(-s_x l) for
# its low byte l, each in Q(SOFTMAX_EXP_BITS); their rounded product is the distance's entry.
WIDE_EXP_ENTRIES = 2 * EXP_ENTRIES
LOG_ENTRIES = (1 << LOG_MANTISSA_BITS) + 1  # ln(1 + j / 256) for j in 0..256; j = 256 is ln 2


def divide_rounding(numerator, denominator) -> np.ndarray:
    """numerator / denominator rounded half up, for numerator >= 0 and denominator > 0 (int64):
    the divider of softmax's normalisation."""
    n = np.asarray(numerator, np.int64)
    d = np.asarray(denominator, np.int64)
    return (2 * n + d) // (2 * d)


def isqrt(v) -> np.ndarray:
    """floor(sqrt(v)) of non-negative int64 values, exactly: a float estimate corrected to the
    integer whose square is the largest not above v (a square-root unit's result)."""
    v = np.asarray(v, np.int64)
    if v.size and v.min() < 0:
        raise SimulatorError(f"isqrt: negative operand {v.min()}")
    root = np.floor(np.sqrt(v.astype(np.float64))).astype(np.int64)
    for _ in range(2):  # the estimate is within one of the root for v < 2^63
        root = np.where(root * root > v, root - 1, root)
        root = np.where((root + 1) * (root + 1) <= v, root + 1, root)
    return root


# LayerNorm's fixed point: the normalized value (x - mean) / std in Q16, from a square root of
# the variance term scaled by 2^(2 * 8) (8 more bits of root).
LAYERNORM_FRACTION_BITS = 16
# The root's fraction bits, by the input's type: int8 codes' variance term is small enough to
# take a root of V * 2^16; int16 codes' is 2^16 times larger, precise enough as it is, and
# V * 2^16 would leave int64.
LAYERNORM_ROOT_BITS = {"int8": 8, "uint8": 8, "int16": 0}
# Keeps C^2 * 2^14 * 2^16 (int8) and C^2 * 2^30 (int16) inside int64.
LAYERNORM_MAX_CHANNELS = 1 << 14
# gamma * n and beta meet in steps of 2^-8 of the output's, so only the last shift rounds.
LAYERNORM_BIAS_BITS = 8


def layer_norm(x, eps_term, multipliers, shifts, biases, out_offset=0, *,
               dtype: str = "int8", in_dtype: str = "int8") -> np.ndarray:
    """Integer LayerNorm over the last axis of `in_dtype` codes, int8 or int16 (I-BERT's
    integer-only form): with S1 = sum x and S2 = sum x^2 over the C codes of a row, the
    variance term V = C S2 - S1^2 + eps_term is C^2 times the variance in codes squared (the
    zero point cancels), and n = (C x - S1) 2^16 / sqrt(V) is the normalized value in Q16, its
    root taken by `isqrt` on V 2^(2 r) (r = LAYERNORM_ROOT_BITS of the input's type) and the
    division rounded half away from zero; then per channel, in
    256ths of the output's step, rescale(n, multiplier, shift) + bias, with gamma 2^8 /
    (s_y 2^16) as the multiplier (negative for a negative gamma) and beta 2^8 / s_y as the
    bias, and one rounding shift by 8 to the output's steps, + out_offset (z_y), clamped.
    eps_term = round(eps C^2 / s_x^2)."""
    x = np.asarray(x, np.int64)
    c = x.shape[-1]
    if c > LAYERNORM_MAX_CHANNELS:
        raise SimulatorError(f"layer_norm: {c} channels; at most {LAYERNORM_MAX_CHANNELS}")
    s1 = x.sum(axis=-1, keepdims=True)
    v = c * (x * x).sum(axis=-1, keepdims=True) - s1 * s1 + np.int64(eps_term)
    root_bits = LAYERNORM_ROOT_BITS[in_dtype]
    root = np.maximum(isqrt(v << (2 * root_bits)), 1)
    d = c * x - s1
    n = np.sign(d) * divide_rounding(np.abs(d) << (LAYERNORM_FRACTION_BITS + root_bits), root)
    fine = rescale(n, multipliers, shifts, axis=-1) + _along(biases, x.ndim, -1)
    out = rounding_shift(fine, LAYERNORM_BIAS_BITS) + out_offset
    return np.clip(out, *RANGES[dtype]).astype(dtype)


REDUCE_OPS = ("max", "min", "l2")  # what a row reduction computes (REDUCE's op field)


def reduce_rows(x, op: str, in_offset=0, multiplier=0, shift=0, out_offset=0, *,
                dtype: str = "int8") -> np.ndarray:
    """One value per row of int8 codes (the last axis): its largest or smallest code (op
    "max", "min": the output keeps the input's scale and zero point, exactly, as max and min
    commute with a monotone quantization), or its L2 norm (op "l2"): the sum of the centred
    codes' squares exact in int64, its root in Q(HYPOT_FRACTION_BITS) by `isqrt`, requantized
    by multiplier and shift (s_x 2^-8 / s_out), + out_offset, clamped."""
    x = np.asarray(x, np.int64)
    if op == "max":
        return x.max(axis=-1).astype(dtype)
    if op == "min":
        return x.min(axis=-1).astype(dtype)
    if op != "l2":
        raise SimulatorError(f"reduce_rows: op {op!r}; expected one of {REDUCE_OPS}")
    d = x - in_offset
    root = isqrt((d * d).sum(axis=-1) << (2 * HYPOT_FRACTION_BITS))
    return requantize(root, multiplier, shift, out_offset, dtype=dtype)


def _exp_sum(x, exp_table, axis: int, in_dtype: str = "int8"):
    """(max - x, T[max - x] summed along `axis`): the first two passes of softmax over a row.
    For int16 codes the distance d < 2^16 takes `wide_exps`."""
    x = np.asarray(x, np.int64)
    distance = np.max(x, axis=axis, keepdims=True) - x
    if in_dtype == "int16":
        exps = wide_exps(distance, exp_table)
        return distance, exps, np.sum(exps, axis=axis, keepdims=True)
    if distance.size and distance.max() >= EXP_ENTRIES:
        raise SimulatorError(f"softmax: codes {distance.max()} apart in one row; the exp table "
                             f"has {EXP_ENTRIES} entries (int8 codes)")
    exps = np.asarray(exp_table, np.int64)[distance]
    return distance, exps, np.sum(exps, axis=axis, keepdims=True)


def wide_exps(distance, exp_table) -> np.ndarray:
    """T[d] for int16 codes' distances d = 256 h + l below a row's maximum: the table's coarse
    entry for h times its fine entry for l (`WIDE_EXP_ENTRIES`, each in Q(SOFTMAX_EXP_BITS)),
    rounded back to Q(SOFTMAX_EXP_BITS). T[0] is exactly 2^20, as int8's."""
    table = np.asarray(exp_table, np.int64)
    if table.size != WIDE_EXP_ENTRIES:
        raise SimulatorError(f"softmax: an int16 input reads {WIDE_EXP_ENTRIES} exp entries "
                             f"(by the distance's high byte, then its low byte); the table "
                             f"has {table.size}")
    d = np.asarray(distance, np.int64)
    if d.size and (d.min() < 0 or d.max() >= 1 << 16):
        raise SimulatorError(f"softmax: distance {d.max()} outside int16 codes' [0, 2^16)")
    return rounding_shift(table[d >> 8] * table[EXP_ENTRIES + (d & 0xFF)], SOFTMAX_EXP_BITS)


def softmax(x, exp_table, out_offset, *, axis: int = -1, dtype: str = "int8",
            in_dtype: str = "int8", out_bits: int = SOFTMAX_OUT_BITS) -> np.ndarray:
    """Integer softmax along `axis`: p = round(2^b * T[max - x] / sum T[max - x]) + out_offset,
    clamped to `dtype` and to the 2^b codes from out_offset. T holds exp(-s_x * d) in
    Q(SOFTMAX_EXP_BITS): EXP_ENTRIES int32 for int8 codes, or for int16 codes (`in_dtype`)
    `wide_exps` of WIDE_EXP_ENTRIES. So the output's scale is 2^-b (b = out_bits: 8 for int8
    codes, up to 15 for int16 ones of zero point 0; probability 1 saturates at the top code);
    the sum is at least T[0] = 2^20, and the division rounds half up, exactly."""
    _, exps, total = _exp_sum(x, exp_table, axis, in_dtype)
    p = divide_rounding(exps << out_bits, total) + out_offset
    lo, hi = RANGES[dtype]
    return np.clip(p, lo, min(hi, out_offset + (1 << out_bits) - 1)).astype(dtype)


def _floor_log2(x) -> np.ndarray:
    """floor(log2 x) of positive int64 values: the position of the leading one bit."""
    x = np.asarray(x, np.int64)
    out = np.zeros(x.shape, np.int64)
    for bit in (32, 16, 8, 4, 2, 1):  # binary search, as a priority encoder
        high = (x >> bit) > 0
        out += np.where(high, bit, 0)
        x = np.where(high, x >> bit, x)
    return out


def log_softmax(x, exp_table, log_table, shift, out_offset, *, axis: int = -1,
                dtype: str = "int8") -> np.ndarray:
    """Integer log-softmax along `axis`, in the input's scale s_x: y = out_offset - (max - x)
    - round(ln(S / 2^20) / s_x), clamped, where S = sum T[max - x] (`softmax`'s table and sum).

    ln(S / 2^20) = (k - 20) ln 2 + ln(m) for S = m 2^k with m in [1, 2): k is the leading one of
    S, and ln(m) is interpolated in `log_table` (LOG_ENTRIES int32, entry j = ln(1 + j/256) / s_x
    in Q(shift), so entry 256 is ln 2 / s_x) between the entries at the mantissa's first 8 bits,
    by its next LOG_FRACTION_BITS. Every step is exact integer arithmetic; the rounding is half
    up (the sum of logarithms is never negative)."""
    distance, _, total = _exp_sum(x, exp_table, axis)
    table = np.asarray(log_table, np.int64)
    k = _floor_log2(total)
    bits = LOG_MANTISSA_BITS + LOG_FRACTION_BITS
    # The mantissa's bits below the leading one, as a fraction of 2^bits.
    fraction = np.where(k >= bits, total >> np.maximum(k - bits, 0),
                        total << np.maximum(bits - k, 0)) - (np.int64(1) << bits)
    index = fraction >> LOG_FRACTION_BITS
    below = fraction & ((1 << LOG_FRACTION_BITS) - 1)
    step = table[index + 1] - table[index]
    mantissa = table[index] + rounding_shift(step * below, LOG_FRACTION_BITS)
    logs = (k - SOFTMAX_EXP_BITS) * table[LOG_ENTRIES - 1] + mantissa
    y = out_offset - distance - rounding_shift(logs, shift)
    return np.clip(y, *RANGES[dtype]).astype(dtype)
