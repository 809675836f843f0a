"""int8 reference semantics of the quantizable operators, and the kinds of quantization rule.

The operator table (`compiler.graph.ops`) points each row's `int8` column at a kernel here and
its `quant` column at a `Quant` kind; the three operators only quantized graphs hold
(QuantizeLinear, DequantizeLinear, Rescale) have their shape rules here too.

A kernel takes its inputs positionally and its attributes as keywords: the ONNX attributes
(with ONNX defaults) plus the integer parameters the quantizer computed, whose names are in
`INT8_ATTRS`. Everything a kernel needs is in its inputs and attributes, so the quantizer's
reference interpreter and the compiler's lowering read the same numbers. Kernels use integer
arithmetic only, through `simulator.numerics`; the float code here builds tables at compile
time (`lookup_table`, `softmax_table`, `log_softmax_table`) or is QuantizeLinear and
DequantizeLinear (numerics' affine map in float32).

Conventions of the integer parameters, for an output of scale s_out and zero point z_out:
- a requantizing kernel (`Quant.requantizes`) accumulates exactly in int32 (wrapping, as
  numerics' accumulators do) and then applies `numerics.requantize` with `multiplier` and
  `shift` (tuples: one entry, or one per output channel) from `numerics.quantize_multiplier`
  of the real ratio (accumulator scale / s_out), adds `out_zero_point` and clamps to `qclamp`
  (a fused ReLU or Clip raises it above the range of `out_dtype`);
- activation zero points of Conv/Gemm/MatMul with constant weights are folded into the int32
  bias (bias - z_x * sum(w)), and Conv pads with z_x, so the fold is exact at the borders.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Mapping

import numpy as np
from scipy.linalg import solve_banded

from compiler.graph import reference as ref
from compiler.graph.ir import Type, Value
from simulator import numerics
from simulator.numerics import RANGES


class Quant(Enum):
    """How the quantizer treats an operator (a column of the operator table): each kind is one
    rule of the quantizer (`quantizer.quantize.RULES`)."""

    KEEP_PARAMS = "keep_params"        # data movement, max, linear Resize: output type = input's
    CLAMP = "clamp"                    # Relu, Clip: fold into the producer's qclamp, else clamp
    RESCALE_INPUTS = "rescale_inputs"  # Concat: inputs rescaled (Rescale nodes) to the output's
    LINEAR = "linear"                  # int8 x int8 products summed in int32, requantized
    ADD = "add"                        # both inputs rescaled to a common scale (TFLite's ADD)
    MUL = "mul"                        # the int32 product of the centred inputs, requantized
    DIVIDE = "divide"                  # MUL by a table of the divisor's reciprocal
    AVERAGE = "average"                # int32 window sums, one requantization per window size
    #                                    (ReduceSum's: a sum, one window of size 1)
    RESCALE = "rescale"                # ember's own Rescale: the same values in another scale
    LOOKUP = "lookup"                  # a 256-entry table built from the fp32 reference
    CHANNEL_LOOKUP = "channel_lookup"  # likewise one table per channel (PRelu's slopes)
    FIXED_OUTPUT = "fixed_output"      # an integer kernel whose output type is fixed (Softmax)
    NORMALIZE = "normalize"            # LayerNorm: integer mean, variance and root, per channel
    GATHER = "gather"                  # rows by integer indices: the data's (a table's) params
    CAST = "cast"                      # a model input's integers to float: its quantization
    HYPOT = "hypot"                    # the root of two inputs' squares summed, one scale
    NORM_L2 = "norm_l2"                # ReduceL2: the root of the centred codes' squares summed
    QUANTIZE = "quantize"              # QuantizeLinear: float → integer, at model inputs
    DEQUANTIZE = "dequantize"          # DequantizeLinear: integer → float, at model outputs

    @property
    def requantizes(self) -> bool:
        """Whether the kernel ends in `numerics.requantize` to its output type (multiplier,
        shift, out_zero_point, qclamp): a Rescale after it can fold into it."""
        return self in (Quant.LINEAR, Quant.ADD, Quant.MUL, Quant.DIVIDE, Quant.AVERAGE,
                        Quant.RESCALE, Quant.HYPOT, Quant.NORM_L2)

    @property
    def output_multipliers(self) -> slice:
        """The entries of `multiplier`/`shift` that scale to the output (ADD's first two
        rescale its inputs; Hypot's are unused, as its ADD's)."""
        return slice(2, 3) if self in (Quant.ADD, Quant.HYPOT) else slice(None)

    @property
    def fuses_clamp(self) -> bool:
        """Whether a Relu or Clip reading the output folds into the requantization's qclamp
        (every requantizing kind of an fp32 model's operators but ReduceL2, whose REDUCE
        instruction has no clamp)."""
        return self.requantizes and self not in (Quant.RESCALE, Quant.NORM_L2)

    @property
    def profiled_output(self) -> bool:
        """Whether the output's parameters come from the profile (the others keep or fix
        theirs)."""
        return self.fuses_clamp or self in (Quant.LOOKUP, Quant.CHANNEL_LOOKUP, Quant.NORM_L2,
                                            Quant.RESCALE_INPUTS, Quant.NORMALIZE, Quant.CAST)

    @property
    def quantized_only(self) -> bool:
        """Whether only quantized graphs hold the operator (the importer rejects it)."""
        return self in (Quant.QUANTIZE, Quant.DEQUANTIZE, Quant.RESCALE)


@dataclass(frozen=True)
class Weight:
    """Which operand of a linear operator (Conv, Gemm, MatMul) is the constant weight, and its
    axes (the operator table's `weight` column).

    The weight is B (input 1); when `a_sum` is given, A (input 0) may be the constant instead,
    against an activation B. The sums are of the constant operand over the axes the operator
    reduces, shaped to broadcast against the output: what an activation's zero point multiplies
    when it is folded into the int32 bias (`zero_point_fold`).
    """

    # B's output-channel axis (per-channel weight scales), from B's rank and the attributes;
    # None: per tensor.
    out_axis: Callable[[int, Mapping[str, Any]], int | None]
    b_sum: Callable[[np.ndarray, Mapping[str, Any]], np.ndarray]
    a_sum: Callable[[np.ndarray, Mapping[str, Any]], np.ndarray] | None = None
    # The kernel pads its input with the activation's zero point (`x_zero_point`), so the
    # fold stays exact at the borders.
    padded: bool = False


CONV_WEIGHT = Weight(out_axis=lambda rank, attrs: 0,
                     b_sum=lambda w, attrs: w.reshape(w.shape[0], -1).sum(axis=1), padded=True)
# ConvTranspose's weight is (C_in, C_out / group, *kernel): output channel g * C_out / group + j
# sums the taps of column j over group g's input rows. Per-channel scales along axis 1 are per
# output channel only with one group; grouped weights take one scale (the compiler's passes
# leave none: `compiler.passes.ungroup_conv_transpose`).
CONV_TRANSPOSE_WEIGHT = Weight(
    out_axis=lambda rank, attrs: 1 if attrs["group"] == 1 else None,
    b_sum=lambda w, attrs: w.reshape(attrs["group"], w.shape[0] // attrs["group"], w.shape[1],
                                     -1).sum(axis=(1, 3)).reshape(-1),
    padded=True)
GEMM_WEIGHT = Weight(
    out_axis=lambda rank, attrs: 0 if attrs["transB"] else 1,
    b_sum=lambda w, attrs: w.sum(axis=1 if attrs["transB"] else 0),
    a_sum=lambda w, attrs: w.sum(axis=0 if attrs["transA"] else 1).reshape(-1, 1))
MATMUL_WEIGHT = Weight(
    out_axis=lambda rank, attrs: rank - 1 if rank >= 2 else None,
    b_sum=lambda w, attrs: np.expand_dims(w.sum(axis=-2), -2) if w.ndim > 1 else w.sum(),
    a_sum=lambda w, attrs: np.expand_dims(w.sum(axis=-1), -1))


def zero_point_fold(weight: Weight, attrs: Mapping[str, Any], a: Value, b: Value,
                    zero: int | None = None) -> np.ndarray | None:
    """-z * (the constant operand summed over the reduced axes), in int64 and shaped like the
    int32 bias: the term that folds the activation operand's zero point z (or `zero`) into the
    bias. None unless exactly one of the two operands `a`, `b` is constant.

    The quantizer adds it to the bias, the QDQ export subtracts it again, and the uint8 offset
    pass adds the term of the -128 shift of the codes.
    """
    if a.is_const == b.is_const:
        return None
    if b.is_const:
        z = a.type.quant.zero_point[0] if zero is None else zero
        return -z * weight.b_sum(b.const.astype(np.int64), attrs)
    z = b.type.quant.zero_point[0] if zero is None else zero
    return -z * weight.a_sum(a.const.astype(np.int64), attrs)


# The attributes the quantizer adds to nodes beside their ONNX ones (the binder must accept them
# on quantized nodes; the fp32 reference never sees them).
INT8_ATTRS = frozenset({"x_zero_point", "a_zero_point", "b_zero_point", "multiplier", "shift",
                        "out_zero_point", "qclamp", "out_dtype", "counts", "table_of",
                        "knots", "fine_bits"})

# Softmax: the output is a probability in int8 of scale 2^-8 (zero point -128; 0 for uint8).
SOFTMAX_OUT_SCALE = 2.0**-numerics.SOFTMAX_OUT_BITS


# --- helpers ---------------------------------------------------------------------------------


def _requant(acc, multiplier, shift, out_zero_point, qclamp, out_dtype, axis):
    """numerics.requantize with per-tensor (one entry) or per-channel (along axis) parameters."""
    m = np.asarray(multiplier, dtype=np.int64).reshape(-1)
    s = np.asarray(shift, dtype=np.int64).reshape(-1)
    if m.size == 1:
        m, s, axis = m[0], s[0], None
    lo, hi = qclamp if qclamp is not None else RANGES[out_dtype]
    return numerics.requantize(acc, m, s, out_zero_point, lo, hi, axis=axis, dtype=out_dtype)


def _centred(x, zero_point: int):
    """x - zero_point in int64 (x itself when the zero point is 0, as for weights)."""
    return x if zero_point == 0 else np.asarray(x, np.int64) - zero_point


def _with_bias(acc, bias, shape=None):
    if bias is None:
        return acc
    bias = np.asarray(bias, np.int64)
    return numerics.wrap32(np.asarray(acc, np.int64) + (bias if shape is None else
                                                         bias.reshape(shape)))


def lookup_any(x, table) -> np.ndarray:
    """table[x - min(dtype)]: numerics.lookup for int8; uint8 indexes the table directly.

    The uint8 branch should move to numerics (`lookup` takes int8 only).
    """
    if x.dtype == np.int8:
        return numerics.lookup(x, table)
    return np.asarray(table)[np.asarray(x, np.int64)]


# --- linear algebra: int8 x int8 → int32, requantized ---------------------------------------


def conv_int8(x, w, b=None, *, multiplier, shift, x_zero_point=0, out_zero_point=0,
              qclamp=None, out_dtype="int8", auto_pad="NOTSET", dilations=None, group=1,
              kernel_shape=None, pads=None, strides=None):
    """Convolution (groups and depthwise included) with padding filled with x's zero point."""
    kernel = tuple(w.shape[2:])
    pads_, out_spatial, strides_, dilations_ = ref.resolve_pads(
        x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    xp = ref._pad_for_windows(x, pads_, out_spatial, kernel, strides_, dilations_, x_zero_point)
    win = ref._windows(xp, kernel, strides_, dilations_, out_spatial)
    n_batch, channels = x.shape[:2]
    m = w.shape[0]
    cg, mg = channels // group, m // group
    spatial = int(np.prod(out_spatial))
    acc = np.empty((n_batch, m, spatial), dtype=np.int64)
    for g in range(group):
        cols = np.moveaxis(win[:, g * cg:(g + 1) * cg], 1, 1 + len(kernel))
        cols = cols.reshape(n_batch, spatial, -1)
        weights = w[g * mg:(g + 1) * mg].reshape(mg, -1)
        acc[:, g * mg:(g + 1) * mg] = numerics.int_matmul(cols, weights.T).transpose(0, 2, 1)
    acc = acc.reshape((n_batch, m) + tuple(out_spatial))
    acc = _with_bias(acc, b, (1, m) + (1,) * len(kernel))
    return _requant(acc, multiplier, shift, out_zero_point, qclamp, out_dtype, axis=1)


def conv_transpose_int8(x, w, b=None, *, multiplier, shift, x_zero_point=0, out_zero_point=0,
                        qclamp=None, out_dtype="int8", dilations=None, group=1, **attrs):
    """ConvTranspose as the convolution that defines it (`reference.transposed_as_convolution`)
    over x with x's zero point between its pixels and around them: every tap meets a code, so
    the zero point folded into the bias over all taps is exact, as for Conv."""
    dense, weight = ref.transposed_as_convolution(x, w, x_zero_point, dilations=dilations,
                                                  group=group, **attrs)
    return conv_int8(dense, weight, b, multiplier=multiplier, shift=shift,
                     x_zero_point=x_zero_point, out_zero_point=out_zero_point, qclamp=qclamp,
                     out_dtype=out_dtype, dilations=dilations, group=group)


def gemm_int8(a, b, c=None, *, multiplier, shift, a_zero_point=0, b_zero_point=0,
              out_zero_point=0, qclamp=None, out_dtype="int8", alpha=1.0, beta=1.0, transA=0,
              transB=0):
    """A @ B + C; alpha is folded into the multiplier and beta into the int32 bias C."""
    a = a.T if transA else a
    b = b.T if transB else b
    acc = _with_bias(numerics.int_matmul(_centred(a, a_zero_point), _centred(b, b_zero_point)), c)
    return _requant(acc, multiplier, shift, out_zero_point, qclamp, out_dtype, axis=1)


def matmul_int8(a, b, bias=None, *, multiplier, shift, a_zero_point=0, b_zero_point=0,
                out_zero_point=0, qclamp=None, out_dtype="int8"):
    """A @ B (batched); the optional int32 `bias` input holds the folded zero-point term."""
    acc = _with_bias(numerics.int_matmul(_centred(a, a_zero_point), _centred(b, b_zero_point)),
                     bias)
    return _requant(acc, multiplier, shift, out_zero_point, qclamp, out_dtype, axis=-1)


# --- elementwise ----------------------------------------------------------------------------


def add_int8(a, b, *, multiplier, shift, a_zero_point=0, b_zero_point=0, out_zero_point=0,
             qclamp=None, out_dtype="int8"):
    """TFLite's quantized ADD: multiplier/shift are (a, b, out), see numerics.add; with an
    int16 operand the sum rounds once (`numerics.wide_add`: a's and b's multipliers at one
    shift)."""
    lo, hi = qclamp if qclamp is not None else RANGES[out_dtype]
    wide = np.asarray(a).dtype == np.int16 or np.asarray(b).dtype == np.int16
    return numerics.add(a, b, a_zero_point, b_zero_point, multiplier, shift, out_zero_point,
                        lo, hi, dtype=out_dtype, wide=wide)


def max_int8(a, b, *, multiplier, shift, a_zero_point=0, b_zero_point=0, out_zero_point=0,
             qclamp=None, out_dtype="int8"):
    """The larger of a and b at add_int8's common scale (numerics.extremum, op="max")."""
    return _extremum("max", a, b, multiplier, shift, a_zero_point, b_zero_point,
                     out_zero_point, qclamp, out_dtype)


def min_int8(a, b, *, multiplier, shift, a_zero_point=0, b_zero_point=0, out_zero_point=0,
             qclamp=None, out_dtype="int8"):
    """The smaller of a and b, as max_int8."""
    return _extremum("min", a, b, multiplier, shift, a_zero_point, b_zero_point,
                     out_zero_point, qclamp, out_dtype)


def hypot_int8(a, b, *, multiplier, shift, a_zero_point=0, b_zero_point=0, out_zero_point=0,
               qclamp=None, out_dtype="int8"):
    """sqrt(a^2 + b^2) of two inputs in one scale (numerics.hypot; multiplier/shift as
    add_int8's, the first two unused)."""
    lo, hi = qclamp if qclamp is not None else RANGES[out_dtype]
    return numerics.hypot(a, b, a_zero_point, b_zero_point, multiplier, shift, out_zero_point,
                          lo, hi, dtype=out_dtype)


def _extremum(op, a, b, multiplier, shift, a_zero_point, b_zero_point, out_zero_point, qclamp,
              out_dtype):
    lo, hi = qclamp if qclamp is not None else RANGES[out_dtype]
    return numerics.extremum(a, b, a_zero_point, b_zero_point, multiplier, shift,
                             out_zero_point, lo, hi, op=op, dtype=out_dtype)


def sub_int8(a, b, *, multiplier, shift, **params):
    """a - b as an ADD whose b rescale is negated (rescale is odd: round half away from zero)."""
    negated = (multiplier[0], -multiplier[1], multiplier[2])
    return add_int8(a, b, multiplier=negated, shift=shift, **params)


def mul_int8(a, b, *, multiplier, shift, a_zero_point=0, b_zero_point=0, out_zero_point=0,
             qclamp=None, out_dtype="int8"):
    """numerics.mul: (a - z_a)(b - z_b) requantized by s_a s_b / s_out (one multiplier)."""
    lo, hi = qclamp if qclamp is not None else RANGES[out_dtype]
    m, s = (int(np.ravel(v)[0]) for v in (multiplier, shift))
    return numerics.mul(a, b, a_zero_point, b_zero_point, m, s, out_zero_point, lo, hi,
                        dtype=out_dtype)


def div_int8(a, b, table, *, multiplier, shift, a_zero_point=0, b_zero_point=0,
             out_zero_point=0, qclamp=None, out_dtype="int8"):
    """a / b as a * (1 / b): `table` maps each code of b to the code of its reciprocal (zero
    point b_zero_point, `reciprocal_range`), and the product is mul_int8's."""
    return mul_int8(a, lookup_any(b, table), multiplier=multiplier, shift=shift,
                    a_zero_point=a_zero_point, b_zero_point=b_zero_point,
                    out_zero_point=out_zero_point, qclamp=qclamp, out_dtype=out_dtype)


def reciprocal_range(lo: float, hi: float, step: float) -> tuple[float, float]:
    """The real range a divisor's reciprocal is quantized over, from the divisor's calibrated
    range [lo, hi] and its quantization step: no profile holds 1 / b, since no ONNX tensor is
    it. [1 / hi, 1 / lo] when the range excludes 0; else the reciprocal is unbounded and the
    range reaches 1 / step (the divisor's smallest nonzero magnitude) on each side the range
    extends to (a coarse quantization, which the quantizer warns about)."""
    if lo > 0 or hi < 0:
        return 1.0 / hi, 1.0 / lo
    return (-1.0 / step if lo < 0 else 0.0), (1.0 / step if hi > 0 else 0.0)


def rescale_int8(x, *, multiplier, shift, x_zero_point=0, out_zero_point=0, qclamp=None,
                 out_dtype="int8"):
    """Rescale (ember-internal): the same real values in another scale and zero point."""
    return _requant(_centred(x, x_zero_point), multiplier, shift, out_zero_point, qclamp,
                    out_dtype, axis=None)


def gather_int8(data, indices, *, axis=0):
    """Gather of int8 codes: the rows `numerics.gather_index` picks (the indexed DMA's)."""
    axis = axis % data.ndim
    return np.take(data, numerics.gather_index(indices, data.shape[axis]), axis=axis)


def clamp_int8(x, *_bounds, qclamp):
    """Relu and Clip not fused into a producer: a clamp in the input's own parameters."""
    lo, hi = qclamp
    return np.clip(x, lo, hi).astype(x.dtype)


def clip_bounds(lo=None, hi=None) -> tuple[float | None, float | None]:
    """Clip's real bounds from its constant min and max inputs (None: unbounded)."""
    return tuple(None if b is None else float(b) for b in (lo, hi))


def table_map(x, table, out_dtype: str | None = None, knots=(0, 0)) -> np.ndarray:
    """A table op's codes: an int8 (uint8) code's entry (`lookup_any`), an int16 one's
    (`numerics.lookup_wide`) when the table's entries are int16 (the output is), or an int16
    input's knots interpolated by its low byte into `out_dtype` codes, `knots` = (zoom,
    origin) its window of finer knots (`numerics.interpolate`, `knot_window`)."""
    x = np.asarray(x)
    if x.dtype == np.int16:
        return numerics.interpolate(x, table, out_dtype or "int8", *knots)
    if np.asarray(table).dtype == np.int16:
        return numerics.lookup_wide(x, table)
    return lookup_any(x, table)


def tabled(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """`kernel`, or, for a node whose attribute `table_of` names its one activation input, a
    table op: `table_map` of that input through the node's last input, its int16 table. An
    elementwise map of one activation that the vector unit runs as a LUT (an Add, Sub, Mul,
    Div, Max or Min by a scalar constant; a Relu or Clip not fused into its producer) takes
    that form when its input or output is int16 (`quantizer.quantize.table_form`): its
    constants stay float, bound into the table."""
    def run(*args, table_of: int | None = None, **attrs):
        if table_of is None:
            return kernel(*args, **attrs)
        return table_map(args[table_of], args[-1], attrs.get("out_dtype"),
                         attrs.get("knots", (0, 0)))
    run.__name__, run.__doc__ = kernel.__name__, kernel.__doc__
    return run


def lookup_int8(x, table, *, out_dtype=None, knots=(0, 0), **_baked):
    """Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu: the attributes are in the table
    (`table_map`: int16 in or out, `wide_table`)."""
    return table_map(x, table, out_dtype, knots)


def power_int8(x, exponent, table, *, out_dtype=None, knots=(0, 0), **_baked):
    """Pow by a constant exponent: the exponent is in the table."""
    return table_map(x, table, out_dtype, knots)


def channel_lookup_int8(x, slope, tables, *, out_dtype=None, knots=(0, 0), **_baked):
    """PRelu: tables[c] maps channel c's codes (axis 1), or the one table every code; each
    built from the fp32 reference with channel c's slope (`channel_slopes`). With int16 codes
    in or out the tables are of int16 entries (`table_map`), a channel's in lane c."""
    tables = np.asarray(tables)
    if tables.shape[0] == 1:
        return table_map(x, tables[0], out_dtype, knots)
    if tables.dtype == np.int16:
        return np.moveaxis(table_map(np.moveaxis(np.asarray(x), 1, -1), tables.T, out_dtype,
                                     knots), -1, 1)
    if x.dtype != np.int8:  # uint8 codes index the tables directly (as lookup_any)
        return tables[np.arange(x.shape[1]).reshape((-1,) + (1,) * (x.ndim - 2)),
                      np.asarray(x, np.int64)]
    return np.moveaxis(numerics.lookup_lanes(np.moveaxis(x, 1, -1), tables.T), -1, 1)


def channel_map_int8(x, pre, post, tables, *, out_dtype=None, knots=(0, 0), **_baked):
    """ChannelMap: tables[c] maps channel c's codes, each built from the fp32 reference with
    channel c's scales (`channel_slopes` of pre and post), as PRelu's."""
    return channel_lookup_int8(x, None, tables, out_dtype=out_dtype, knots=knots)


def channel_slopes(slope, shape) -> np.ndarray | None:
    """PRelu's slope as one value (a scalar) or one per channel (axis 1) of an input of
    `shape`, or None when it varies along another axis."""
    slope = np.asarray(slope, np.float64)
    if slope.size == 1:
        return slope.reshape(1)
    if len(shape) < 2:
        return None
    full = np.broadcast_to(slope, shape)
    per_channel = full[(0, slice(None)) + (0,) * (len(shape) - 2)]
    along = per_channel.reshape((1, -1) + (1,) * (len(shape) - 2))
    return per_channel if np.array_equal(full, np.broadcast_to(along, shape)) else None


def lookup_table(fp32: Callable[..., Any], attrs: Mapping[str, Any], in_scale: float,
                 in_zero_point: int, out_scale: float, out_zero_point: int,
                 dtype: str = "int8") -> np.ndarray:
    """The 256 outputs of the fp32 reference at every input code, quantized (compile time).

    Entry i is the output for the input code min(dtype) + i, so int8 codes index with +128.
    """
    lo, hi = RANGES[dtype]
    codes = np.arange(lo, hi + 1, dtype=np.int64)
    real_in = numerics.dequantize(codes, in_scale, in_zero_point, arithmetic=np.float64)
    # A code outside the function's domain (Sqrt of a negative) maps to 0, not to NaN's cast.
    real_out = np.nan_to_num(fp32(real_in.astype(np.float32), **attrs), nan=0.0,
                             posinf=np.inf, neginf=-np.inf)
    return numerics.quantize(real_out, out_scale, out_zero_point, dtype=dtype,
                             arithmetic=np.float64)


def wide_table(fp32: Callable[..., Any], attrs: Mapping[str, Any], in_scale: float,
               in_zero_point: int, in_dtype: str, out_scale: float, out_zero_point: int,
               out_dtype: str, out_codes: tuple[int, int], knots=(0, 0)) -> np.ndarray:
    """The int16 table of a table op with int16 codes in or out (compile time), for
    `table_map`: for int8 codes in, the output's int16 code at each of the 256 (`out_codes`
    bounds them: a b-bit tensor's); for int16 codes in, the 257 knots (code (k - 128) * 256 for
    entry k, `numerics.interpolate`), and with `knots` = (zoom, origin), zoom > 0, the window's
    257 after them (code origin + k * 2^(8 - zoom), `knot_window`), each set fitted to the
    function over the codes it serves (`_fitted_knots`)."""
    if in_dtype != "int16":
        lo, hi = RANGES[in_dtype]
        return _knot_entries(fp32, attrs, np.arange(lo, hi + 1, dtype=np.int64), in_scale,
                             in_zero_point, out_scale, out_zero_point, out_dtype, out_codes,
                             fine=1)
    codes = (np.arange(numerics.KNOTS, dtype=np.int64) - 128) << numerics.KNOT_BITS
    zoom, origin = knots
    if zoom:
        step = numerics.KNOT_BITS - zoom
        codes = np.concatenate([codes, origin + (np.arange(numerics.KNOTS, dtype=np.int64)
                                                 << step)])
    at_knots = _knot_entries(fp32, attrs, codes, in_scale, in_zero_point, out_scale,
                             out_zero_point, out_dtype, out_codes)
    exact = _exact_codes(fp32, attrs, in_scale, in_zero_point, out_scale, out_zero_point,
                         out_dtype, out_codes)
    return _fitted_knots(exact, at_knots, out_dtype, out_codes, zoom, origin)


# How strongly a knot that serves no code (inside the window, its neighbours' codes all
# taken by the window's knots) keeps the function's own value: a tie-break, not a weight.
_UNSERVED_KNOT_WEIGHT = 1e-3


def _fitted_knots(exact: np.ndarray, at_knots: np.ndarray, out_dtype: str,
                  out_codes: tuple[int, int], zoom: int, origin: int) -> np.ndarray:
    """Knot entries chosen by least squares: the interpolation's squared error against
    `exact` (the function at every int16 code, in output codes) summed over the codes each
    set of knots serves, the coarse knots' the codes outside the window. The function's own
    values at the knots (`at_knots`) leave the chord of a curved stretch on one side of it:
    HardSwish's parabola between -3 and 3 lies under every chord, so each int16 HardSwish erred
    upwards and the errors of PicoDet's 94 added up, 4.6 dB of its output against exact
    HardSwishes. The fit centres each stretch's error; the normal equations are tridiagonal
    (each code weighs two neighbouring knots)."""
    x = np.arange(-(1 << 15), 1 << 15, dtype=np.int64)
    fine = 2 ** numerics.KNOT_FRACTION_BITS[out_dtype]
    count = numerics.KNOTS
    offset, step = x - origin, numerics.KNOT_BITS - zoom
    inside = (offset >= 0) & (offset < numerics.window_codes(zoom)) if zoom else \
        np.zeros(x.shape, bool)
    # (knot index, fraction between it and the next, the codes) of the coarse knots, then of
    # the window's
    stretches = [((x[~inside] >> numerics.KNOT_BITS) + 128,
                  (x[~inside] & ((1 << numerics.KNOT_BITS) - 1)) / (1 << numerics.KNOT_BITS),
                  ~inside)]
    if zoom:
        stretches.append((offset[inside] >> step,
                          (offset[inside] & ((1 << step) - 1)) / (1 << step), inside))
    fitted = []
    for k, (index, t, codes) in enumerate(stretches):
        prior = at_knots[k * count:(k + 1) * count] / fine
        y = exact[codes]
        diagonal = np.bincount(index, (1 - t) ** 2, count) + \
            np.bincount(index + 1, t ** 2, count) + _UNSERVED_KNOT_WEIGHT
        beside = np.bincount(index, t * (1 - t), count)[:-1]
        right = np.bincount(index, (1 - t) * y, count) + np.bincount(index + 1, t * y, count) + \
            _UNSERVED_KNOT_WEIGHT * prior
        bands = np.zeros((3, count))
        bands[0, 1:], bands[1], bands[2, :-1] = beside, diagonal, beside
        fitted.append(solve_banded((1, 1), bands, right))
    lo, hi = out_codes if fine == 1 else RANGES["int16"]
    return np.clip(np.rint(np.concatenate(fitted) * fine), lo, hi).astype(np.int16)


def _exact_codes(fp32, attrs, in_scale, in_zero_point, out_scale, out_zero_point,
                 out_dtype, out_codes) -> np.ndarray:
    """The function at every int16 input code, in (unrounded) output codes, clipped to the
    output's codes. Far outside the calibrated range too: the function may overflow float32
    there (a mask's large scale), and the clip takes ±inf."""
    x = np.arange(-(1 << 15), 1 << 15, dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = fp32(numerics.dequantize(x, in_scale, in_zero_point,
                                         arithmetic=np.float64).astype(np.float32), **attrs)
        exact = np.nan_to_num(np.asarray(exact, np.float64), nan=0.0) / out_scale + \
            out_zero_point
    return np.clip(exact, *(out_codes if out_dtype == "int16" else RANGES[out_dtype]))


def _knot_entries(fp32, attrs, codes, in_scale, in_zero_point, out_scale, out_zero_point,
                  out_dtype, out_codes, fine: int | None = None) -> np.ndarray:
    """The function at input `codes`, as int16 entries: codes bounded by `out_codes` or, for
    knots an int8 output interpolates between, its codes in Q(KNOT_FRACTION_BITS), saturated
    only at the int16 entries' bounds (twice the output's range: an interpolation towards a
    knot past the range still reaches the range's end where the function does)."""
    real_in = numerics.dequantize(codes, in_scale, in_zero_point, arithmetic=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # ±inf saturates below
        real_out = np.nan_to_num(fp32(real_in.astype(np.float32), **attrs), nan=0.0,
                                 posinf=np.inf, neginf=-np.inf)
    if fine is None:
        fine = 2 ** numerics.KNOT_FRACTION_BITS[out_dtype]
    lo, hi = out_codes if fine == 1 else RANGES["int16"]
    return numerics.quantize(real_out, out_scale / fine, out_zero_point * fine, lo, hi,
                             dtype="int16", arithmetic=np.float64)


def knot_window(fp32: Callable[..., Any], attrs: Mapping[str, Any], in_scale: float,
                in_zero_point: int, out_scale: float, out_zero_point: int, out_dtype: str,
                out_codes: tuple[int, int], span: tuple[int, int] = (-(1 << 15), (1 << 15) - 1),
                density: np.ndarray | None = None) -> tuple[int, int]:
    """Where an int16 input's window of finer knots goes (`numerics.interpolate`): the (zoom,
    origin) whose table errs least, in squared output codes against the function, summed over
    the input codes of `span` (the calibrated range's), each weighed by `density` (the share
    of the calibration data at each of the 65,536 codes, `code_density`) when given, or
    (0, 0) when no window removes a quarter of the coarse knots' error (a map they follow: its
    rounding, not its bends). For each zoom, every origin on its knots' grid is weighed at
    once: the errors of the coarse knots and of knots 2^(8 - zoom) codes apart everywhere are
    computed once for every code, and a window's gain is a difference of prefix sums."""
    lo_code, hi_code = span
    x = np.arange(-(1 << 15), 1 << 15, dtype=np.int64)
    exact = _exact_codes(fp32, attrs, in_scale, in_zero_point, out_scale, out_zero_point,
                         out_dtype, out_codes)
    weight = ((x >= lo_code) & (x <= hi_code)).astype(np.float64)
    if density is not None:
        weight *= density
    # The coarse knots fitted as `wide_table` fits them; each candidate window's at the
    # function's values (fitting it too could only lower its error further).
    coarse = _fitted_knots(exact, _knot_entries(
        fp32, attrs, (np.arange(numerics.KNOTS, dtype=np.int64) - 128) << numerics.KNOT_BITS,
        in_scale, in_zero_point, out_scale, out_zero_point, out_dtype, out_codes),
        out_dtype, out_codes, 0, 0)
    coarse_error = weight * (numerics.interpolate(x, coarse, out_dtype) - exact) ** 2
    best, best_gain = (0, 0), coarse_error.sum() / 4
    for zoom in range(1, numerics.MAX_ZOOM + 1):
        step = numerics.KNOT_BITS - zoom
        width = numerics.window_codes(zoom)
        # Knots 2^step codes apart from the lowest code up, past the highest by a window.
        grid = -(1 << 15) + (np.arange((((1 << 16) + width) >> step) + 1, dtype=np.int64)
                             << step)
        table = _knot_entries(fp32, attrs, grid, in_scale, in_zero_point, out_scale,
                              out_zero_point, out_dtype, out_codes)
        offset = x + (1 << 15)
        value = numerics.weigh_knots(table[offset >> step], table[(offset >> step) + 1],
                                     offset & ((1 << step) - 1), step, out_dtype)
        gain = np.concatenate([[0.0], np.cumsum(coarse_error - weight * (value - exact) ** 2)])
        starts = np.arange(0, 1 << 16, 1 << step)  # window origins, as offsets from -2^15
        ends = np.minimum(starts + width, 1 << 16)
        gains = gain[ends] - gain[starts]
        k = int(np.argmax(gains))
        if gains[k] > best_gain:
            best, best_gain = (zoom, int(-(1 << 15) + starts[k])), float(gains[k])
    return best


# The share of a window search's weight spread evenly over the calibrated span, the rest by
# the data: a region the calibration samples missed still counts a little.
DENSITY_FLOOR = 0.01


def code_density(edges: np.ndarray, counts: np.ndarray, scale: float, zero_point: int,
                 span: tuple[int, int]) -> np.ndarray:
    """The share of the calibration data at each int16 code (a histogram's bins, `edges` and
    `counts`, each at the code of its centre), DENSITY_FLOOR of it spread evenly over `span`:
    where the input's values are, so that a window of finer knots goes to the bends the data
    meets (a HardSwish's at -3 and 3), not to one at the range's far end (where its output's
    range clips it) that a few values reach."""
    density = np.zeros(1 << 16)
    total = float(np.sum(counts))
    lo, hi = span
    if total > 0:
        centres = (np.asarray(edges[:-1], np.float64) + np.asarray(edges[1:], np.float64)) / 2
        codes = np.clip(np.rint(centres / scale) + zero_point, lo, hi).astype(np.int64)
        np.add.at(density, codes + (1 << 15), np.asarray(counts, np.float64) / total)
    density *= 1 - DENSITY_FLOOR
    density[lo + (1 << 15):hi + (1 << 15) + 1] += DENSITY_FLOOR / (hi - lo + 1)
    return density


def softmax_table(in_scale: float, in_dtype: str = "int8") -> np.ndarray:
    """exp(-in_scale * d) in Q(SOFTMAX_EXP_BITS) for d = max - x in 0..255 (compile time); for
    int16 codes, those of d = 256 h for h in 0..255, then those of d in 0..255
    (`numerics.wide_exps` multiplies one of each)."""
    d = np.arange(numerics.EXP_ENTRIES, dtype=np.float64)
    if in_dtype == "int16":
        d = np.concatenate([d * numerics.EXP_ENTRIES, d])
    return np.rint(np.exp(-in_scale * d) * 2.0**numerics.SOFTMAX_EXP_BITS).astype(np.int32)


def log_softmax_shift(in_scale: float) -> int:
    """The fraction bits of LogSoftmax's log table: as many as keep its largest entry,
    ln 2 / in_scale, below 2^30 (an int32 with room for the interpolation), at most 16."""
    bits = 30 - max(0, int(np.ceil(np.log2(np.log(2.0) / in_scale))))
    return int(np.clip(bits, 0, numerics.LOG_FRACTION_BITS))


def log_softmax_table(in_scale: float) -> np.ndarray:
    """The exp table (`softmax_table`) followed by ln(1 + j / 256) / in_scale in
    Q(`log_softmax_shift`) for j in 0..256: the int32 table `numerics.log_softmax` reads."""
    j = np.arange(numerics.LOG_ENTRIES, dtype=np.float64)
    logs = np.log1p(j / (numerics.LOG_ENTRIES - 1)) / in_scale
    logs = np.rint(logs * 2.0**log_softmax_shift(in_scale)).astype(np.int32)
    return np.concatenate([softmax_table(in_scale), logs])


@dataclass(frozen=True)
class FixedOutput:
    """What the quantizer gives an operator of fixed output type (`Quant.FIXED_OUTPUT`): the
    output's scale and zero point, the int32 table input and the integer attributes."""

    scale: float
    zero_point: int
    table: np.ndarray
    attrs: Mapping[str, Any]


def softmax_output(in_scale: float, dtype: str, in_dtype: str = "int8",
                   out_bits: int = 16) -> FixedOutput:
    """Softmax: probabilities of scale 2^-8 from the lowest code (probability 0); int16 ones
    (`dtype`) of scale 2^-(b - 1) from code 0, for codes of b = `out_bits` bits (the zero
    point of every int16 value, and b below 16 where an accumulator narrows them), SOFTMAX's
    `fine_bits` the bits past 8."""
    table = softmax_table(in_scale, in_dtype)
    if dtype == "int16":
        fine_bits = out_bits - 1 - numerics.SOFTMAX_OUT_BITS
        return FixedOutput(2.0**-(out_bits - 1), 0, table,
                           {"out_zero_point": 0, "fine_bits": fine_bits, "out_dtype": "int16"})
    zero = RANGES[dtype][0]
    return FixedOutput(SOFTMAX_OUT_SCALE, zero, table, {"out_zero_point": zero})


def log_softmax_output(in_scale: float, dtype: str, in_dtype: str = "int8",
                       out_bits: int = 8) -> FixedOutput:
    """LogSoftmax keeps the input's scale, its zero point the highest code (log-probability 0):
    y = s_x (x - max) - ln(sum exp(s_x (x - max))), whose first term is a whole number of the
    input's steps, so only the logarithm rounds (to half a step, as the input did), and the
    codes reach the logits' own range below 0 (lower log-probabilities saturate). A profiled
    scale would be about as wide (the output's range is the logits' range plus ln C at most)
    but round the first term too."""
    if "int16" in (dtype, in_dtype):
        raise ValueError("LogSoftmax reads and writes 8-bit codes")
    zero = RANGES[dtype][1]
    return FixedOutput(in_scale, zero, log_softmax_table(in_scale),
                       {"out_zero_point": zero, "shift": log_softmax_shift(in_scale)})


def softmax_int8(x, table, *, axis=-1, out_zero_point=-128, fine_bits=0, out_dtype=None):
    """`numerics.softmax` along `axis` (the exp table from `softmax_table`); x and the output
    (`out_dtype`, else x's type) may be int16."""
    return numerics.softmax(x, table, out_zero_point, axis=axis,
                            dtype=out_dtype or ("int8" if x.dtype == np.int16 else str(x.dtype)),
                            in_dtype=str(x.dtype), out_bits=numerics.SOFTMAX_OUT_BITS + fine_bits)


def log_softmax_int8(x, table, *, axis=-1, out_zero_point=127, shift=0):
    """`numerics.log_softmax` along `axis` (the tables from `log_softmax_table`)."""
    exp_table, log_table = np.split(np.asarray(table), [numerics.EXP_ENTRIES])
    return numerics.log_softmax(x, exp_table, log_table, shift, out_zero_point, axis=axis,
                                dtype=str(x.dtype))


def layer_norm_params(scale, bias, epsilon: float, channels: int, in_scale: float,
                      out_scale: float) -> np.ndarray:
    """The int32 parameters `numerics.layer_norm` reads (compile time): the epsilon term
    eps C^2 / s_x^2, then per channel the multiplier and shift of gamma 2^8 / (s_y 2^16)
    (negated for a negative gamma, 0 for a zero one or one so small that its ratio is under
    2^-32: every normalized value, below 2^31 in Q16, rescales to 0 by it either way, as
    pretrained models' dead channels have it; clamped to the largest above 2^31) and the bias
    beta 2^8 / s_y (the output's zero point is the node's out_zero_point)."""
    gamma = np.broadcast_to(np.asarray(scale, np.float64).reshape(-1), (channels,))
    beta = np.broadcast_to(np.zeros(1) if bias is None else
                           np.asarray(bias, np.float64).reshape(-1), (channels,))
    eps_term = min(round(epsilon * channels * channels / in_scale**2), 2**31 - 1)
    multipliers, shifts = np.zeros(channels, np.int64), np.zeros(channels, np.int64)
    for c, g in enumerate(gamma):
        ratio = abs(float(g)) * 2**numerics.LAYERNORM_BIAS_BITS \
            / (out_scale * 2**numerics.LAYERNORM_FRACTION_BITS)
        if ratio >= 2.0**-32:  # quantize_multiplier's range is [2^-32, 2^31)
            m, k = numerics.quantize_multiplier(min(ratio, 2.0**31 * (1 - 2.0**-30)))
            multipliers[c], shifts[c] = (m if g > 0 else -m), k
    biases = np.round(beta / out_scale * 2**numerics.LAYERNORM_BIAS_BITS)
    return np.concatenate([[eps_term], multipliers, shifts,
                           np.clip(biases, -2**31, 2**31 - 1)]).astype(np.int32)


def layer_norm_int8(x, scale, bias, table, *, axis=-1, epsilon=1e-5, stash_type=1,
                    out_zero_point=0, out_dtype="int8"):
    """`numerics.layer_norm` over the last axis, with the parameters of `layer_norm_params`
    (gamma and beta are in them; the node keeps its fp32 ones for the QDQ export); x may be
    int16 (a residual stream)."""
    c = x.shape[-1]
    table = np.asarray(table, np.int64)
    return numerics.layer_norm(x, table[0], table[1:1 + c], table[1 + c:1 + 2 * c],
                               table[1 + 2 * c:1 + 3 * c], out_zero_point,
                               dtype=out_dtype, in_dtype=str(x.dtype))


# --- pooling and reductions ------------------------------------------------------------------


def max_pool_int8(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                  pads=None, storage_order=0, strides=None):
    """MaxPool keeps the scale and the type (int8, or int16: `numerics.window_max` compares
    whole values): padding is the dtype's minimum, which never wins a window."""
    fill = RANGES[str(x.dtype)][0]
    win, *_ = ref._pool_windows(x, kernel_shape, strides, pads, auto_pad, ceil_mode,
                                dilations, fill)
    return numerics.window_max(win, win.ndim - x.ndim).astype(x.dtype)


def pool_counts(spatial, *, kernel_shape, strides=None, pads=None, auto_pad="NOTSET",
                ceil_mode=0, dilations=None, count_include_pad=0) -> np.ndarray:
    """The divisor of AveragePool at each output position (1, 1, *out), as the fp32 reference.

    Positions inside the input count, plus explicit padding when count_include_pad; positions
    past the end added only by ceil_mode never do.
    """
    ones = np.ones((1, 1) + tuple(spatial), dtype=np.int64)
    pads_, out_spatial, strides_, dilations_ = ref.resolve_pads(
        tuple(spatial), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    limit = pads_ if count_include_pad else (0,) * len(pads_)
    ones = ref._pad_spatial(ones, limit, 1)
    shifted = tuple(p - lp for p, lp in zip(pads_, limit))
    ones = ref._pad_for_windows(ones, shifted, out_spatial, kernel_shape, strides_, dilations_, 0)
    win = ref._windows(ones, tuple(kernel_shape), strides_, dilations_, out_spatial)
    return win.sum(axis=tuple(range(ones.ndim, win.ndim)))


def average_pool_sizes(shape, attrs) -> list[int]:
    """The distinct window sizes of AveragePool over an input of `shape`, ascending."""
    window = {k: attrs[k] for k in ("kernel_shape", "strides", "pads", "auto_pad", "ceil_mode",
                                    "dilations", "count_include_pad")}
    return sorted({int(c) for c in np.unique(pool_counts(shape[2:], **window))})


def global_pool_sizes(shape, attrs) -> list[int]:
    return [int(np.prod(shape[2:]))]


def average_pool_int8(x, *, counts, multiplier, shift, x_zero_point=0, out_zero_point=0,
                      qclamp=None, out_dtype="int8", auto_pad="NOTSET", ceil_mode=0,
                      count_include_pad=0, dilations=None, kernel_shape=None, pads=None,
                      strides=None):
    """Sum of (x - z_x) per window in int64, then one requantization per window size.

    `counts` lists the distinct window sizes; multiplier[i]/shift[i] encode
    s_x / (counts[i] * s_out), so the division by the window size rounds only once.
    """
    win, *_ = ref._pool_windows(x, kernel_shape, strides, pads, auto_pad, ceil_mode,
                                dilations, x_zero_point)
    total = (np.asarray(win, np.int64) - x_zero_point).sum(axis=tuple(range(x.ndim, win.ndim)))
    per_window = pool_counts(x.shape[2:], kernel_shape=kernel_shape, strides=strides, pads=pads,
                             auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                             count_include_pad=count_include_pad)
    index = np.searchsorted(np.asarray(counts), per_window)
    m = np.asarray(multiplier, np.int64)[index]
    s = np.asarray(shift, np.int64)[index]
    lo, hi = qclamp if qclamp is not None else RANGES[out_dtype]
    return numerics.requantize(total, m, s, out_zero_point, lo, hi, dtype=out_dtype)


def global_average_pool_int8(x, *, counts, multiplier, shift, x_zero_point=0,
                             out_zero_point=0, qclamp=None, out_dtype="int8"):
    total = (np.asarray(x, np.int64) - x_zero_point).sum(axis=tuple(range(2, x.ndim)),
                                                         keepdims=True)
    return _requant(total, multiplier, shift, out_zero_point, qclamp, out_dtype, axis=None)


def reduce_mean_int8(x, axes=None, *, counts, multiplier, shift, x_zero_point=0,
                     out_zero_point=0, qclamp=None, out_dtype="int8", keepdims=1,
                     noop_with_empty_axes=0):
    axes = reduce_axes(x.ndim, axes, noop_with_empty_axes)
    total = (np.asarray(x, np.int64) - x_zero_point).sum(axis=axes, keepdims=bool(keepdims))
    return _requant(total, multiplier, shift, out_zero_point, qclamp, out_dtype, axis=None)


def reduce_l2_int8(x, axes=None, *, multiplier, shift, x_zero_point=0, out_zero_point=0,
                   qclamp=None, out_dtype="int8", keepdims=1, noop_with_empty_axes=0):
    """ReduceL2 of int8 codes over `axes` (`numerics.reduce_rows` op l2: the reduced axes
    gathered last, one row each)."""
    x = np.asarray(x, np.int64)
    axes = reduce_axes(x.ndim, axes, noop_with_empty_axes)
    kept = [a for a in range(x.ndim) if a not in axes]
    rows = np.transpose(x, kept + list(axes)).reshape(*[x.shape[a] for a in kept], -1)
    y = numerics.reduce_rows(rows, "l2", x_zero_point, np.asarray(multiplier).reshape(-1)[0],
                             np.asarray(shift).reshape(-1)[0], out_zero_point,
                             dtype=out_dtype)
    lo, hi = qclamp if qclamp is not None else RANGES[out_dtype]
    y = np.clip(y, lo, hi).astype(out_dtype)
    if keepdims:
        y = y.reshape([1 if a in axes else x.shape[a] for a in range(x.ndim)])
    return y


def reduce_mean_sizes(shape, attrs, axes=None) -> list[int]:
    axes = reduce_axes(len(shape), axes, attrs["noop_with_empty_axes"])
    return [int(np.prod([shape[a] for a in axes]))]


def reduce_sum_sizes(shape, attrs, axes=None) -> list[int]:
    """ReduceSum: the sum itself is requantized, as a mean over windows of one."""
    return [1]


def reduce_axes(rank: int, axes, noop_with_empty_axes=0) -> tuple[int, ...]:
    """ReduceMean's reduced axes, as the fp32 reference reads them."""
    if axes is None or len(np.atleast_1d(axes)) == 0:
        return () if noop_with_empty_axes else tuple(range(rank))
    return tuple(int(a) + rank if int(a) < 0 else int(a) for a in np.atleast_1d(axes))


# --- QuantizeLinear and DequantizeLinear (ONNX semantics) ------------------------------------


def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0,
                    precision=0, saturate=1):
    """ONNX QuantizeLinear: `numerics.quantize` in float32; uint8 without a zero point."""
    dtype = "uint8" if y_zero_point is None else str(np.asarray(y_zero_point).dtype)
    zero_point = 0 if y_zero_point is None else y_zero_point
    return numerics.quantize(x, y_scale, zero_point, axis=axis, dtype=dtype)


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                      output_dtype=0):
    """ONNX DequantizeLinear: `numerics.dequantize` in float32."""
    zero_point = 0 if x_zero_point is None else x_zero_point
    return numerics.dequantize(x, x_scale, zero_point, axis=axis)


# --- shape rules of the operators only quantized graphs hold ---------------------------------


def quantize_shape(xs, attrs):
    zero_point = xs[2] if len(xs) > 2 and xs[2] is not None else None
    dtype = zero_point.type.dtype if zero_point is not None else "uint8"
    return [Type(dtype, xs[0].type.shape)]


def dequantize_shape(xs, attrs):
    return [Type("float32", xs[0].type.shape)]


def resize_int8(x, roi=None, scales=None, sizes=None, **attrs):
    """Nearest copies codes (the fp32 reference's own). Linear is separable, axis by axis as
    the fp32 reference goes: each output is `numerics.add` of its two taps, weighed by ADD's
    input rescales (1 - frac, frac) with offsets 0, the sum rescaled back by 2^-ADD_LEFT_SHIFT
    (`linear_resize_taps`). A convex combination of codes keeps the input's scale and zero
    point and never saturates, so the vector unit's ADD over strided Views computes it."""
    if attrs["mode"] != "linear":
        return ref.resize(x, roi, scales, sizes, **attrs)
    out_shape, scale = ref.resize_scales(x.shape, scales, sizes, attrs["axes"],
                                         attrs["keep_aspect_ratio_policy"])
    if tuple(out_shape) == x.shape:
        return x
    # The vector unit's codes are int8: uint8 codes (the reference alone runs them) are
    # shifted there and back, so both element types round alike.
    centre = RANGES[str(x.dtype)][0] + 128
    y = np.asarray(x, np.int64) - centre
    for axis in range(x.ndim):
        if out_shape[axis] == x.shape[axis] and scale[axis] == 1:
            continue
        picks = []
        for lo, hi, rescales in linear_resize_taps(
                x.shape[axis], out_shape[axis], scale[axis],
                attrs["coordinate_transformation_mode"]):
            a = np.take(y, [lo], axis=axis)
            picks.append(a if rescales is None else numerics.add(
                a, np.take(y, [hi], axis=axis), 0, 0, *rescales, 0).astype(np.int64))
        y = np.concatenate(picks, axis=axis)
    return (y + centre).astype(x.dtype)


# ADD's output rescale for a linear resize: the weighed sum back to the input's codes.
_LERP_OUT = numerics.quantize_multiplier(2.0 ** -numerics.ADD_LEFT_SHIFT)
# A linear resize's weights are multiples of 2^-16: positions whose float32 coordinates differ
# by rounding noise alone share their weights (and so a layer), at a cost of under 2^-17 of the
# 255-code range, 0.002 of a step.
_LERP_WEIGHT_BITS = 16


def linear_resize_taps(in_len: int, out_len: int, scale, ctm: str) -> list[tuple]:
    """Per output position of one axis: (lo, hi, rescales), rescales the (multipliers, shifts)
    of ADD weighing input lo by 1 - frac and hi by frac, or None when the output is a copy
    of input lo (frac rounds to 0, as at a clamped border or on the input's own grid)."""
    taps = []
    for lo, hi, frac in zip(*ref.linear_taps(in_len, out_len, scale, ctm)):
        lo, hi = int(lo), int(hi)
        frac = round(float(frac) * 2 ** _LERP_WEIGHT_BITS) / 2 ** _LERP_WEIGHT_BITS
        if frac == 1:
            lo, frac = hi, 0.0
        if frac == 0:
            taps.append((lo, lo, None))
            continue
        (m0, s0), (m1, s1) = (numerics.quantize_multiplier(w) for w in (1 - frac, frac))
        taps.append((lo, hi, ((m0, m1, _LERP_OUT[0]), (s0, s1, _LERP_OUT[1]))))
    return taps


def rescale_shape(xs, attrs):
    return [Type(attrs.get("out_dtype") or xs[0].type.dtype, xs[0].type.shape)]

