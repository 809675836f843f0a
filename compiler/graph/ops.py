"""The operator table: every operator ember understands, one row each.

A row holds every fact about an operator: its ONNX name, inputs, attributes with their ONNX
defaults, the shape rule and the fp32 reference. The importer, the verifier, the passes and the
evaluator read this table; nothing else lists operators. Later stages add their own columns
(int8 reference, quantization rule, lowering, MACs) to the same rows.

Input names follow ONNX; a trailing "?" marks an optional input, "*" a variadic one.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from compiler.errors import CompileError
from compiler.graph import expansions, int8, recurrent
from compiler.graph import reference as ref
from compiler.graph.int8 import INT8_ATTRS, Quant, Weight
from compiler.graph.ir import DTYPES, Graph, Node, Type, Value
from simulator.errors import SimulatorError
from simulator.numerics import gather_index, oversize


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()

ShapeRule = Callable[[Sequence[Value | None], Mapping[str, Any]], list[Type]]
# The multiply-accumulates of one node, from its input types, output types and attributes.
MacsRule = Callable[[Sequence[Type], Sequence[Type], Mapping[str, Any]], int]


class Lower(Enum):
    """The backend's rule that lowers an operator to accelerator layers (`compiler.backend.lower`
    maps each kind to its function); an operator without one runs on the host, if allowed."""

    CONV = "conv"                # the array: a convolution
    CONV_TRANSPOSE = "conv_transpose"  # the array: one convolution per output phase
    GEMM = "gemm"                # the array: a 1x1 convolution over M pixels of K channels
    MATMUL = "matmul"            # likewise, by a constant 2-D weight
    MAX_POOL = "max_pool"        # the vector unit's window operations
    AVERAGE_POOL = "average_pool"
    GLOBAL_MAX_POOL = "global_max_pool"
    GLOBAL_AVERAGE_POOL = "global_average_pool"
    REDUCE_MEAN = "reduce_mean"  # an average pool over H/W; over C a convolution by ones
    ADD = "add"                  # the vector unit's ADD; a LUT with a scalar constant operand
    SUB = "sub"                  # ADD with b's rescale negated; likewise
    MAX = "max"                  # ADD with op max (b may broadcast); likewise
    MIN = "min"                  # ADD with op min; likewise
    HYPOT = "hypot"              # ADD with op hypot
    REDUCE = "reduce"            # the vector unit's REDUCE over the contiguous axis; a max over
    #                              H and W a MAXPOOL
    MUL = "mul"                  # the vector unit's MUL; a LUT with a scalar constant operand
    DIVIDE = "divide"            # a LUT of the divisor's reciprocal, then MUL; likewise
    LUT = "lut"                  # a 256-entry table of the node's own int8 kernel
    SOFTMAX = "softmax"          # the vector unit's SOFTMAX along the contiguous axis
    LAYER_NORM = "layer_norm"    # the vector unit's LAYERNORM along the contiguous axis
    CHANNEL_LUT = "channel_lut"  # likewise, or one table per channel (LUT per_lane=1)
    GATHER = "gather"            # the indexed DMA (GATHER): a table's rows by int32 indices;
    #                              an activation's rows by constant indices, a Slice's view
    VIEW = "view"                # no layer: another name for the same bytes
    SLICE = "slice"              # no layer: a strided View of its input's buffer
    SPLIT = "split"              # likewise, one View per output
    CONCAT = "concat"            # one buffer its inputs are written or copied into
    QUANTIZE = "quantize"        # a program input binding (the host quantizes)
    TRANSPOSE = "transpose"      # a model input's binding strides, a view, or a strided copy
    RESIZE = "resize"            # copies of rows and columns (nearest), ADDs of two (linear)
    PAD = "pad"                  # constant, of H and W: a 1x1 MaxPool whose LOAD pads
    DEQUANTIZE = "dequantize"    # a program output binding (the host dequantizes)


class ViewKind(Enum):
    """How an operator's first output holds its first input's values, unchanged."""

    SAME = "same"          # the input itself (Identity, inference Dropout): a no-op
    RESHAPE = "reshape"    # the same bytes in the same order, under another shape
    PERMUTE = "permute"    # the same values in another order (Transpose)
    PART = "part"          # some of the values (Slice, Split)


@dataclass(frozen=True)
class OpDef:
    name: str
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    shape: ShapeRule
    fp32: Callable[..., Any]
    outputs: tuple[str, ...] = ("y",)
    # Attributes that older opsets had and newer ones turned into inputs: the importer moves
    # them to the input at this index, so the rest of ember sees only the newest form.
    attr_to_input: Mapping[str, int] = field(default_factory=dict)
    # Attributes older opsets had that no longer mean anything: the importer drops them.
    dropped_attrs: tuple[str, ...] = ()
    # (attribute, input index): when that input is absent, the attribute counts the node's
    # outputs (older opsets left it implicit; the newest require one or the other).
    count_outputs: tuple[str, int] | None = None
    # The opset before which the op flattened its input to 2-D at `axis`: the importer accepts
    # such a node only on the last axis, where both forms agree.
    coerced_2d_before: int | None = None
    # Only constant folding may remove this op: a graph that still holds it cannot compile.
    fold_only: bool = False
    # ember's own operator, which only a graph pass writes (a fused form): not ONNX, so the
    # importer rejects it and no ONNX case tests it; its fusion pass's tests hold its fp32 form
    # to onnxruntime's on the written-out graph.
    fused_only: bool = False
    # The input slots that hold integer indices (Gather's, OneHot's): an integer model input
    # or a constant, never quantized; the program binds a model input there as int32.
    index_inputs: tuple[int, ...] = ()
    # The importer replaces the node by these nodes of other rows (a recurrence unrolled into
    # its cell equations): `expand(node, inputs, make_const)` with the inputs' typed Values
    # (constants known) and a function making a named constant; no later stage sees the op.
    expand: Callable[..., list[Node]] | None = None
    # How the quantizer rewrites the op, and its integer-only reference (simulator.numerics);
    # None for ops that are never quantized (they only exist before constant folding).
    quant: Quant | None = None
    int8: Callable[..., Any] | None = None
    # The quantizer's per-operator details, each read by its rule kind: the linear operators'
    # weight operand and axes (Quant.LINEAR); a clamp's real bounds from its constant inputs
    # (Quant.CLAMP); the distinct window sizes an average divides by, from the input's shape,
    # the attributes and the constant inputs (Quant.AVERAGE); the input holding a real fill
    # value, quantized in the data's parameters (None: the attributes use none).
    weight: Weight | None = None
    clamp_bounds: Callable[..., tuple[float | None, float | None]] | None = None
    window_sizes: Callable[..., list[int]] | None = None
    fill_input: Callable[[Mapping[str, Any]], int | None] | None = None
    # Quant.FIXED_OUTPUT: the output's parameters, table and integer attributes from the
    # input's scale and the activation type (`int8.FixedOutput`).
    fixed_output: Callable[[float, str], int8.FixedOutput] | None = None
    # How the backend lowers the op; None: it has no lowering (the host runs it, if allowed).
    lower: Lower | None = None
    # Whether the output is the input's values unchanged (a view), and how; None: computed.
    view: ViewKind | None = None
    # The multiply-accumulates it does; None for ops whose work is not multiply-accumulates.
    macs: MacsRule | None = None
    # A per-channel affine map that the folding pass merges into the op that feeds it.
    folds_into_producer: bool = False
    # A per-output-channel scale and offset after the op fold into its weight (along the weight
    # column's `out_axis`) and its bias: BatchNormalization folding.
    absorbs_channel_affine: bool = False
    # The value depends only on the input's (static) shape, so it always folds to a constant.
    shape_only: bool = False
    # With constant operands, the op is y = x * scale + offset of its one run-time input x:
    # `channel_affine(attrs, consts, rank)` gives (scale, offset), each broadcastable against
    # x's rank (`consts`: the inputs' constants, None for x), or None when it is not such a map
    # (a constant divided by x). A graph pass makes a per-channel one a depthwise convolution.
    channel_affine: Callable[..., tuple[Any, Any] | None] | None = None
    # The attribute sets under which a graph computing one value elementwise from one input
    # (x * Sigmoid(x), x * Clip(x + 3, 0, 6) / 6) is recognised as this op (gate fusion).
    recognised_forms: tuple[Mapping[str, Any], ...] = ()
    # A constant zero padding of the spatial axes, which the op it feeds may take into its own
    # pads (`absorbs_zero_pad`): the pad-folding pass.
    folds_into_consumer: bool = False
    # The op's attributes once it also pads its input by `pads` (ONNX order: the spatial axes'
    # begins, then their ends) with zeros, or None when its attributes cannot say so.
    absorbs_zero_pad: Callable[[Mapping[str, Any], list[int]], dict | None] | None = None
    # f(x / s) = f(x) / s for every s > 0, channel by channel: cross-layer equalization may
    # scale the channels of the Conv before it and undo it in the Conv after
    # (`quantizer.equalize`).
    scale_invariant: bool = False

    @property
    def min_inputs(self) -> int:
        return sum(1 for i in self.inputs if not i.endswith(("?", "*")))

    @property
    def variadic(self) -> bool:
        return any(i.endswith("*") for i in self.inputs)

    @property
    def run_time_inputs(self) -> int:
        """How many leading input slots the int8 form lets be computed at run time (the rest
        must be constants): both operands of an elementwise binary op or of a linear op whose
        A may be the constant, else the first (a variadic slot, all its inputs)."""
        two = self.quant in (Quant.ADD, Quant.MUL, Quant.DIVIDE, Quant.HYPOT) or (
            self.weight is not None and self.weight.a_sum is not None)
        return 2 if two else 1

    def bind(self, node_name: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """The node's attributes completed with ONNX defaults; unknown or missing ones fail."""
        unknown = sorted(set(attrs) - set(self.attrs))
        if unknown:
            raise CompileError(f"node {node_name!r} ({self.name}): unsupported attribute(s) "
                               f"{unknown}; {self.name} takes {sorted(self.attrs)}")
        bound = {**self.attrs, **attrs}
        missing = [k for k, v in bound.items() if v is REQUIRED]
        if missing:
            raise CompileError(f"node {node_name!r} ({self.name}): missing required attribute(s) "
                               f"{missing}")
        return bound


# --- shape rules ----------------------------------------------------------------------------


def _t(like: Value, shape: Sequence[int], dtype: str | None = None) -> Type:
    return Type(dtype or like.type.dtype, tuple(int(d) for d in shape))


def same_shape(xs, attrs):
    return [_t(xs[0], xs[0].type.shape)]


def broadcast(xs, attrs):
    xs = xs[:2]  # the two operands (a quantized Div's third input is its reciprocal table)
    try:
        shape = np.broadcast_shapes(*(x.type.shape for x in xs if x is not None))
    except ValueError:
        raise CompileError("inputs of shapes " + ", ".join(str(x.type.shape) for x in xs)
                           + " do not broadcast") from None
    return [_t(xs[0], shape)]


def prelu_shape(xs, attrs):
    x, slope = xs[0].type.shape, xs[1].type.shape
    try:
        fits = np.broadcast_shapes(x, slope) == x
    except ValueError:
        fits = False
    if not fits:
        raise CompileError(f"slope {slope} does not broadcast to the input {x}")
    return same_shape(xs, attrs)


def conv_shape(xs, attrs):
    x, w = xs[0].type.shape, xs[1].type.shape
    group = attrs["group"]
    if len(x) != len(w) or len(x) < 3:
        raise CompileError(f"input {x} and weight {w} ranks do not fit a convolution")
    if x[1] != w[1] * group:
        raise CompileError(f"input has {x[1]} channels but weight {w} with group={group} "
                           f"expects {w[1] * group}")
    if w[0] % group:
        raise CompileError(f"weight {w} has {w[0]} output channels, not a multiple of "
                           f"group={group}")
    if len(xs) > 2 and xs[2] is not None and xs[2].type.shape != (w[0],):
        raise CompileError(f"bias {xs[2].type.shape} should have shape ({w[0]},)")
    _, out, _, _ = ref.resolve_pads(x[2:], w[2:], attrs["strides"], attrs["dilations"],
                                    attrs["pads"], attrs["auto_pad"])
    return [_t(xs[0], (x[0], w[0]) + out)]


def conv_transpose_shape(xs, attrs):
    x, w = xs[0].type.shape, xs[1].type.shape
    group = attrs["group"]
    if len(x) != len(w) or len(x) < 3:
        raise CompileError(f"input {x} and weight {w} ranks do not fit a convolution")
    if x[1] != w[0] or w[0] % group:
        raise CompileError(f"input has {x[1]} channels but weight {w} with group={group} "
                           f"expects {w[0]}, a multiple of group")
    if len(xs) > 2 and xs[2] is not None and xs[2].type.shape != (w[1] * group,):
        raise CompileError(f"bias {xs[2].type.shape} should have shape ({w[1] * group},)")
    _, out, _, _ = ref.conv_transpose_pads(
        x[2:], w[2:], attrs["strides"], attrs["dilations"], attrs["pads"],
        attrs["output_padding"], attrs["output_shape"], attrs["auto_pad"])
    if min(out) < 1:
        raise CompileError(f"its output would be {list(out)}: pads larger than the output")
    return [_t(xs[0], (x[0], w[1] * group) + out)]


def pool_shape(xs, attrs):
    x = xs[0].type.shape
    _, out, _, _ = ref.resolve_pads(x[2:], attrs["kernel_shape"], attrs["strides"],
                                    attrs.get("dilations"), attrs["pads"], attrs["auto_pad"],
                                    attrs["ceil_mode"])
    return [_t(xs[0], x[:2] + out)]


def global_pool_shape(xs, attrs):
    x = xs[0].type.shape
    return [_t(xs[0], x[:2] + (1,) * (len(x) - 2))]


def gemm_shape(xs, attrs):
    a, b = xs[0].type.shape, xs[1].type.shape
    m, k = (a[1], a[0]) if attrs["transA"] else a
    k2, n = (b[1], b[0]) if attrs["transB"] else b
    if k != k2:
        raise CompileError(f"Gemm inner dimensions differ: A {a} (transA={attrs['transA']}), "
                           f"B {b} (transB={attrs['transB']})")
    if len(xs) > 2 and xs[2] is not None and \
            np.broadcast_shapes(xs[2].type.shape, (m, n)) != (m, n):
        raise CompileError(f"Gemm C {xs[2].type.shape} does not broadcast to ({m}, {n})")
    return [_t(xs[0], (m, n))]


def matmul_shape(xs, attrs):
    a, b = xs[0].type.shape, xs[1].type.shape
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise CompileError(f"MatMul inner dimensions differ: {a} @ {b}")
    batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    shape = tuple(batch) + (a2[-2], b2[-1])
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b) == 1:
        shape = shape[:-1]
    return [_t(xs[0], shape)]


def concat_shape(xs, attrs):
    rank = xs[0].type.rank
    axis = attrs["axis"] + rank if attrs["axis"] < 0 else attrs["axis"]
    shape = list(xs[0].type.shape)
    for x in xs[1:]:
        other = x.type.shape
        if len(other) != rank or any(o != s for i, (o, s) in enumerate(zip(other, shape))
                                     if i != axis):
            raise CompileError(f"Concat on axis {axis}: shapes {xs[0].type.shape} and {other} "
                               "do not fit")
        shape[axis] += other[axis]
    return [_t(xs[0], shape)]


def flatten_shape(xs, attrs):
    shape = xs[0].type.shape
    axis = attrs["axis"] + len(shape) if attrs["axis"] < 0 else attrs["axis"]
    return [_t(xs[0], (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))]


def _evaluating(fp32: Callable[..., Any], data_inputs: int = 1) -> ShapeRule:
    """A shape rule that runs the reference on zeros of the data inputs and the constants.

    For data-movement and shape operators whose result shape depends on the values of their
    parameter inputs (Reshape's shape, Slice's starts): the reference is the definition, so the
    rule cannot disagree with it. The rule gives None while a parameter is not yet constant.
    """
    def rule(xs, attrs):
        args = []
        for i, x in enumerate(xs):
            if x is None:
                args.append(None)
            elif x.is_const:
                args.append(x.const)
            elif i < data_inputs:
                if (why := oversize(x.type.shape, x.type.dtype)) is not None:
                    raise CompileError(f"input {x.name!r} is too large: {why}")
                args.append(np.zeros(x.type.shape, dtype=x.type.dtype))
            else:
                return None
        result = fp32(*args, **attrs)
        results = result if isinstance(result, tuple) else (result,)
        return [Type(str(r.dtype), r.shape) for r in results]
    return rule


def _expanded_on_import(*args, **attrs):
    raise CompileError("a recurrent layer is unrolled on import; it has no reference of its "
                       "own")


def recurrent_shape(xs, attrs):
    """Y [T, dirs, B, H] (layout 1: [B, T, dirs, H]) and the last states [dirs, B, H]
    ([B, dirs, H]): what the importer types before it unrolls the layer."""
    x, r = xs[0].type.shape, xs[2].type.shape
    if len(x) != 3 or len(r) != 3:
        raise CompileError(f"X {list(x)} and R {list(r)} should both be of rank 3")
    dirs, hidden = (2 if attrs["direction"] == "bidirectional" else 1), r[-1]
    if attrs["layout"]:
        y, state = (x[0], x[1], dirs, hidden), (x[0], dirs, hidden)
    else:
        y, state = (x[0], dirs, x[1], hidden), (dirs, x[1], hidden)
    return [_t(xs[0], y), _t(xs[0], state), _t(xs[0], state)]


def gather_shape(xs, attrs):
    """data's shape with the gathered axis replaced by the indices' shape; constant indices
    are checked against the axis."""
    data, indices = xs[0].type.shape, xs[1].type.shape
    if not -len(data) <= attrs["axis"] < len(data):
        raise CompileError(f"axis {attrs['axis']} is out of range for data of rank {len(data)}")
    axis = attrs["axis"] % len(data)
    if xs[1].type.dtype not in ("int32", "int64"):
        raise CompileError(f"indices {xs[1].name!r} are {xs[1].type.dtype}: expected int32 or "
                           "int64")
    if xs[1].is_const:
        try:
            gather_index(xs[1].const, data[axis])
        except SimulatorError as err:
            raise CompileError(f"indices {xs[1].name!r}: {err}") from None
    return [_t(xs[0], data[:axis] + indices + data[axis + 1:])]


def constant_shape(xs, attrs):
    v = ref.constant(**attrs)
    return [Type(str(v.dtype), v.shape)]


def _dtype_rule(dtype_of: Callable[[Mapping[str, Any]], str], inner: ShapeRule) -> ShapeRule:
    def rule(xs, attrs):
        types = inner(xs, attrs)
        return None if types is None else [Type(dtype_of(attrs), t.shape) for t in types]
    return rule


def _cast_dtype(attrs) -> str:
    from onnx.helper import tensor_dtype_to_np_dtype, tensor_dtype_to_string
    try:
        dtype = str(np.dtype(tensor_dtype_to_np_dtype(attrs["to"])))
    except (KeyError, TypeError, ValueError):
        dtype = None
    if dtype not in DTYPES:
        name = tensor_dtype_to_string(attrs["to"]).removeprefix("TensorProto.")
        raise CompileError(f"Cast to {name}: element type not supported (ember has "
                           f"{', '.join(DTYPES)})")
    return dtype


def layer_norm_shape(xs, attrs):
    """Y as X; Mean and InvStdDev keep the axes before `axis` and are 1 after it."""
    x = xs[0].type.shape
    axis = attrs["axis"] % len(x)
    stat = x[:axis] + (1,) * (len(x) - axis)
    return [_t(xs[0], x), _t(xs[0], stat), _t(xs[0], stat)]


def batchnorm_shape(xs, attrs):
    if attrs["training_mode"]:
        raise CompileError("training_mode=1 computes batch statistics; only inference "
                           "BatchNormalization is supported")
    return same_shape(xs, attrs)


# --- affine maps: (scale, offset) of the run-time operand x, given the constant one ---------


def add_affine(attrs, consts, rank):
    a, b = consts
    return 1.0, (b if a is None else a)


def sub_affine(attrs, consts, rank):
    a, b = consts
    return (1.0, -b) if a is None else (-1.0, a)


def mul_affine(attrs, consts, rank):
    a, b = consts
    return (b if a is None else a), 0.0


def div_affine(attrs, consts, rank):
    a, b = consts
    return (1.0 / np.asarray(b, np.float64), 0.0) if a is None else None


def batchnorm_affine(attrs, consts, rank):
    """scale = gamma / sqrt(var + epsilon), offset = beta - mean * scale, along axis 1."""
    gamma, beta, mean, var = (np.asarray(c, np.float64) for c in consts[1:5])
    scale = gamma / np.sqrt(var + attrs["epsilon"])
    along = (-1,) + (1,) * (rank - 2)
    return scale.reshape(along), (beta - mean * scale).reshape(along)


# --- MAC counts ----------------------------------------------------------------------------


def conv_macs(xs, ys, attrs):
    # Every output element sums C/group x kernel taps products.
    return ys[0].size * int(np.prod(xs[1].shape[1:], dtype=np.int64))


def conv_transpose_macs(xs, ys, attrs):
    # Every input element meets C_out/group x kernel taps (those falling outside the output
    # included, as a padded Conv's are).
    return xs[0].size * int(np.prod(xs[1].shape[1:], dtype=np.int64))


def gemm_macs(xs, ys, attrs):
    a = xs[0].shape
    return ys[0].size * int(a[-2] if attrs["transA"] else a[-1])


def matmul_macs(xs, ys, attrs):
    return ys[0].size * int(xs[0].shape[-1])


# --- the table ------------------------------------------------------------------------------

_POOL = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None, "kernel_shape": REQUIRED,
         "pads": None, "strides": None}
_RESIZE = {"antialias": 0, "axes": None, "coordinate_transformation_mode": "half_pixel",
           "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0,
           "keep_aspect_ratio_policy": "stretch", "mode": "nearest",
           "nearest_mode": "round_prefer_floor"}

def _more_pads(attrs: Mapping[str, Any], pads: list[int]) -> dict | None:
    """A windowed op's explicit pads grown by `pads`, unless auto_pad computes them."""
    if attrs["auto_pad"] not in ("NOTSET", "VALID"):
        return None
    own = list(attrs["pads"] or [0] * len(pads))
    return {"pads": [a + b for a, b in zip(own, pads)], "auto_pad": "NOTSET"}


def _average_more_pads(attrs: Mapping[str, Any], pads: list[int]) -> dict | None:
    """Likewise for an average, which must then count the zeros: only when it pads nothing of
    its own or already counts its pads, and without ceil_mode's partial windows."""
    if attrs["ceil_mode"] or (not attrs["count_include_pad"] and any(attrs["pads"] or ())):
        return None
    more = _more_pads(attrs, pads)
    return None if more is None else {**more, "count_include_pad": 1}


# The kernel of an elementwise op the vector unit runs as a LUT of one activation (a scalar
# constant operand, a clamp), which also runs as a table with int16 codes (`int8.tabled`).
_tabled = int8.tabled
Q = Quant  # the quant column's kinds, short for the rows below
L = Lower  # likewise the lower column's
V = ViewKind  # and the view column's

_QDQ = {"axis": 1, "block_size": 0, "output_dtype": 0}

_ROWS = (
    # Linear algebra: the array's work; int32 accumulation, per-channel requantization.
    OpDef("Conv", ("X", "W", "B?"),
          {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
           "pads": None, "strides": None}, conv_shape, ref.conv,
          quant=Q.LINEAR, int8=int8.conv_int8, weight=int8.CONV_WEIGHT,
          lower=L.CONV, macs=conv_macs, absorbs_channel_affine=True,
          absorbs_zero_pad=_more_pads),
    OpDef("ConvTranspose", ("X", "W", "B?"),
          {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
           "output_padding": None, "output_shape": None, "pads": None, "strides": None},
          conv_transpose_shape, ref.conv_transpose, quant=Q.LINEAR,
          int8=int8.conv_transpose_int8, weight=int8.CONV_TRANSPOSE_WEIGHT,
          lower=L.CONV_TRANSPOSE, macs=conv_transpose_macs, absorbs_channel_affine=True),
    OpDef("Gemm", ("A", "B", "C?"), {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
          gemm_shape, ref.gemm, quant=Q.LINEAR, int8=int8.gemm_int8, weight=int8.GEMM_WEIGHT,
          lower=L.GEMM, macs=gemm_macs, absorbs_channel_affine=True),
    OpDef("MatMul", ("A", "B"), {}, matmul_shape, ref.matmul,
          quant=Q.LINEAR, int8=int8.matmul_int8,  # int8: an int32 bias input too
          weight=int8.MATMUL_WEIGHT, lower=L.MATMUL, macs=matmul_macs),
    OpDef("BatchNormalization", ("X", "scale", "B", "input_mean", "input_var"),
          {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}, batchnorm_shape,
          ref.batch_normalization,  # folded into Conv/Gemm, else a depthwise Conv
          folds_into_producer=True, channel_affine=batchnorm_affine),
    # Elementwise: the vector unit's work. Clamps fuse into the producer's requantization;
    # nonlinearities become 256-entry tables (an int8 `table` input).
    OpDef("Relu", ("X",), {}, same_shape, ref.relu, quant=Q.CLAMP,
          int8=_tabled(int8.clamp_int8), clamp_bounds=lambda *params: (0.0, None),
          lower=L.LUT, scale_invariant=True),
    OpDef("Clip", ("input", "min?", "max?"), {}, same_shape, ref.clip, quant=Q.CLAMP,
          int8=_tabled(int8.clamp_int8), clamp_bounds=int8.clip_bounds, lower=L.LUT),
    OpDef("LeakyRelu", ("X",), {"alpha": 0.01}, same_shape, ref.leaky_relu,
          quant=Q.LOOKUP, int8=int8.lookup_int8, lower=L.LUT, scale_invariant=True),
    OpDef("PRelu", ("X", "slope"), {}, prelu_shape, ref.prelu, quant=Q.CHANNEL_LOOKUP,
          int8=int8.channel_lookup_int8, lower=L.CHANNEL_LUT),
    OpDef("Sigmoid", ("X",), {}, same_shape, ref.sigmoid, quant=Q.LOOKUP, int8=int8.lookup_int8,
          lower=L.LUT),
    # ember's: post * f(pre * x), pre and post one value per channel (axis 1) and f a one-input
    # table op (`map`, with its attributes `map_attrs`): a Conv → f → Conv chain equalized
    # through an f that is not homogeneous (HardSwish, SiLU...: `quantizer.equalize` mode
    # "all", `fuse_channel_map`). One table per channel, as PRelu's.
    OpDef("ChannelMap", ("X", "pre", "post"), {"map": REQUIRED, "map_attrs": {}}, prelu_shape,
          lambda x, pre, post, *, map, map_attrs: _channel_map(x, pre, post, map, map_attrs),
          quant=Q.CHANNEL_LOOKUP, int8=int8.channel_map_int8, lower=L.CHANNEL_LUT,
          fused_only=True),
    OpDef("HardSigmoid", ("X",), {"alpha": 0.2, "beta": 0.5}, same_shape, ref.hard_sigmoid,
          quant=Q.LOOKUP, int8=int8.lookup_int8, lower=L.LUT,
          recognised_forms=({"alpha": 1 / 6, "beta": 0.5},)),  # Clip(x + 3, 0, 6) / 6
    OpDef("HardSwish", ("X",), {}, same_shape, ref.hard_swish,
          quant=Q.LOOKUP, int8=int8.lookup_int8, lower=L.LUT, recognised_forms=({},)),
    OpDef("Tanh", ("input",), {}, same_shape, ref.tanh, quant=Q.LOOKUP, int8=int8.lookup_int8,
          lower=L.LUT),
    OpDef("Abs", ("X",), {}, same_shape, np.abs, quant=Q.LOOKUP, int8=int8.lookup_int8,
          lower=L.LUT),
    OpDef("Neg", ("X",), {}, same_shape, ref.neg, quant=Q.LOOKUP, int8=int8.lookup_int8,
          lower=L.LUT),
    OpDef("Exp", ("input",), {}, same_shape, ref.exp, quant=Q.LOOKUP, int8=int8.lookup_int8,
          lower=L.LUT),
    OpDef("Erf", ("input",), {}, same_shape, ref.erf, quant=Q.LOOKUP, int8=int8.lookup_int8,
          lower=L.LUT),
    OpDef("Sqrt", ("X",), {}, same_shape, ref.sqrt, quant=Q.LOOKUP, int8=int8.lookup_int8,
          lower=L.LUT),
    # A constant scalar exponent is bound into the table (a computed one has no int8 form).
    OpDef("Pow", ("X", "Y"), {}, broadcast, ref.power, quant=Q.LOOKUP, int8=int8.power_int8,
          lower=L.LUT),
    OpDef("Gelu", ("X",), {"approximate": "none"}, same_shape, ref.gelu, quant=Q.LOOKUP,
          int8=int8.lookup_int8, lower=L.LUT,
          recognised_forms=({"approximate": "none"}, {"approximate": "tanh"})),
    OpDef("Swish", ("X",), {"alpha": 1.0}, same_shape, ref.swish, quant=Q.LOOKUP,
          int8=int8.lookup_int8, lower=L.LUT, recognised_forms=({},)),
    OpDef("Mish", ("X",), {}, same_shape, ref.mish, quant=Q.LOOKUP, int8=int8.lookup_int8,
          lower=L.LUT, recognised_forms=({},)),
    OpDef("Softplus", ("X",), {}, same_shape, ref.softplus, quant=Q.LOOKUP,
          int8=int8.lookup_int8, lower=L.LUT),
    OpDef("Softsign", ("input",), {}, same_shape, ref.softsign, quant=Q.LOOKUP,
          int8=int8.lookup_int8, lower=L.LUT),
    OpDef("Elu", ("X",), {"alpha": 1.0}, same_shape, ref.elu, quant=Q.LOOKUP,
          int8=int8.lookup_int8, lower=L.LUT),
    OpDef("Celu", ("X",), {"alpha": 1.0}, same_shape, ref.celu, quant=Q.LOOKUP,
          int8=int8.lookup_int8, lower=L.LUT),
    OpDef("Selu", ("X",), {"alpha": 1.6732632423543772, "gamma": 1.0507009873554805},
          same_shape, ref.selu, quant=Q.LOOKUP, int8=int8.lookup_int8, lower=L.LUT),
    OpDef("Add", ("A", "B"), {}, broadcast, ref.add, quant=Q.ADD,
          int8=_tabled(int8.add_int8), lower=L.ADD, channel_affine=add_affine),
    OpDef("Sub", ("A", "B"), {}, broadcast, ref.sub, quant=Q.ADD,
          int8=_tabled(int8.sub_int8), lower=L.SUB, channel_affine=sub_affine),
    # Variadic in ONNX: two operands here, as Add's (the vector unit's ADD with op max or
    # min); other counts are expanded on import into a chain of them.
    OpDef("Max", ("data_0", "data_1"), {}, broadcast, ref.maximum, quant=Q.ADD,
          int8=_tabled(int8.max_int8), lower=L.MAX, expand=expansions.expand_variadic),
    OpDef("Min", ("data_0", "data_1"), {}, broadcast, ref.minimum, quant=Q.ADD,
          int8=_tabled(int8.min_int8), lower=L.MIN, expand=expansions.expand_variadic),
    # ember's: sqrt(A^2 + B^2), a complex spectrum's magnitude written as Pow/Mul, Add and
    # Sqrt (`fuse_hypot`), so its power never rounds to 8 bits (the vector unit's ADD op hypot).
    OpDef("Hypot", ("A", "B"), {}, broadcast, ref.hypot, quant=Q.HYPOT, int8=int8.hypot_int8,
          lower=L.HYPOT, fused_only=True),
    OpDef("Mul", ("A", "B"), {}, broadcast, ref.mul, quant=Q.MUL,
          int8=_tabled(int8.mul_int8), lower=L.MUL, channel_affine=mul_affine),
    # Div by a constant becomes a Mul (or a depthwise Conv); by an activation, a Mul by a
    # table of the divisor's reciprocal (an int8 `table` input).
    OpDef("Div", ("A", "B"), {}, broadcast, ref.div, quant=Q.DIVIDE,
          int8=_tabled(int8.div_int8), lower=L.DIVIDE, channel_affine=div_affine),
    OpDef("Reciprocal", ("X",), {}, same_shape, ref.reciprocal, quant=Q.LOOKUP,
          int8=int8.lookup_int8, lower=L.LUT),
    # Softmax and LogSoftmax: an int32 exp table (LogSoftmax's with a log table after it) and
    # the vector unit's SOFTMAX along the memory's contiguous axis.
    OpDef("Softmax", ("input",), {"axis": -1}, same_shape, ref.softmax,
          quant=Q.FIXED_OUTPUT, int8=int8.softmax_int8, fixed_output=int8.softmax_output,
          coerced_2d_before=13, lower=L.SOFTMAX),
    OpDef("LogSoftmax", ("input",), {"axis": -1}, same_shape, ref.log_softmax,
          quant=Q.FIXED_OUTPUT, int8=int8.log_softmax_int8, fixed_output=int8.log_softmax_output,
          coerced_2d_before=13, lower=L.SOFTMAX),
    # LayerNormalization: integer mean, variance and square root over the contiguous axis
    # (`numerics.layer_norm`, the vector unit's LAYERNORM), gamma and beta per channel.
    OpDef("LayerNormalization", ("X", "Scale", "B?"), {"axis": -1, "epsilon": 1e-5,
                                                       "stash_type": 1},
          layer_norm_shape, ref.layer_normalization, outputs=("Y", "Mean?", "InvStdDev?"),
          quant=Q.NORMALIZE, int8=int8.layer_norm_int8, lower=L.LAYER_NORM),
    OpDef("Identity", ("input",), {}, same_shape, ref.identity,
          quant=Q.KEEP_PARAMS, int8=ref.identity, lower=L.VIEW, view=V.SAME),
    OpDef("Dropout", ("data", "ratio?", "training_mode?"), {"seed": None},
          lambda xs, a: [_t(xs[0], xs[0].type.shape), _t(xs[0], xs[0].type.shape, "bool")],
          ref.dropout, outputs=("output", "mask?"), attr_to_input={"ratio": 1},
          view=V.SAME, dropped_attrs=("is_test",)),  # a view in inference
    # Windows and reductions: max keeps the scale, sums requantize.
    OpDef("MaxPool", ("X",), {**_POOL, "storage_order": 0}, pool_shape, ref.max_pool,
          quant=Q.KEEP_PARAMS, int8=int8.max_pool_int8, lower=L.MAX_POOL),
    OpDef("AveragePool", ("X",), {**_POOL, "count_include_pad": 0}, pool_shape,
          ref.average_pool, quant=Q.AVERAGE, int8=int8.average_pool_int8,
          window_sizes=int8.average_pool_sizes, lower=L.AVERAGE_POOL,
          absorbs_zero_pad=_average_more_pads),
    OpDef("GlobalAveragePool", ("X",), {}, global_pool_shape, ref.global_average_pool,
          quant=Q.AVERAGE, int8=int8.global_average_pool_int8,
          window_sizes=int8.global_pool_sizes, lower=L.GLOBAL_AVERAGE_POOL),
    OpDef("GlobalMaxPool", ("X",), {}, global_pool_shape, ref.global_max_pool,
          quant=Q.KEEP_PARAMS, int8=ref.global_max_pool, lower=L.GLOBAL_MAX_POOL),
    OpDef("ReduceMean", ("data", "axes?"), {"keepdims": 1, "noop_with_empty_axes": 0},
          _evaluating(ref.reduce_mean), ref.reduce_mean, attr_to_input={"axes": 1},
          quant=Q.AVERAGE, int8=int8.reduce_mean_int8, window_sizes=int8.reduce_mean_sizes,
          lower=L.REDUCE_MEAN),
    # ReduceSum is ReduceMean's sum requantized by s_x / s_out (one window of "size" 1).
    OpDef("ReduceSum", ("data", "axes?"), {"keepdims": 1, "noop_with_empty_axes": 0},
          _evaluating(ref.reduce_sum), ref.reduce_sum, attr_to_input={"axes": 1},
          quant=Q.AVERAGE, int8=int8.reduce_mean_int8, window_sizes=int8.reduce_sum_sizes,
          lower=L.REDUCE_MEAN),
    # A maximum or minimum of int8 codes is the code of the maximum (quantization is
    # monotone): the input's type, exactly. ReduceL2 roots the exact sum of the centred codes'
    # squares (`numerics.reduce_rows`). The vector unit's REDUCE over the contiguous axis.
    *(OpDef(name, ("data", "axes?"), {"keepdims": 1, "noop_with_empty_axes": 0},
            _evaluating(fn), fn, attr_to_input={"axes": 1}, quant=Q.KEEP_PARAMS, int8=fn,
            lower=L.REDUCE)
      for name, fn in (("ReduceMax", ref.reduce_max), ("ReduceMin", ref.reduce_min))),
    OpDef("ReduceL2", ("data", "axes?"), {"keepdims": 1, "noop_with_empty_axes": 0},
          _evaluating(ref.reduce_l2), ref.reduce_l2, attr_to_input={"axes": 1},
          quant=Q.NORM_L2, int8=int8.reduce_l2_int8, lower=L.REDUCE),
    # Comparisons, selection and broadcasting copies: fp32 only for now (constant folding
    # evaluates them; with --allow-host the host runs the rest).
    OpDef("Equal", ("A", "B"), {}, _dtype_rule(lambda a: "bool", broadcast), ref.equal),
    OpDef("Less", ("A", "B"), {}, _dtype_rule(lambda a: "bool", broadcast), ref.less),
    OpDef("Greater", ("A", "B"), {}, _dtype_rule(lambda a: "bool", broadcast), ref.greater),
    OpDef("Not", ("X",), {}, same_shape, ref.logical_not),
    OpDef("Where", ("condition", "X", "Y"), {}, _evaluating(ref.where, 3), ref.where),
    OpDef("Expand", ("input", "shape"), {}, _evaluating(ref.expand), ref.expand),
    OpDef("Tile", ("input", "repeats"), {}, _evaluating(ref.tile), ref.tile),
    OpDef("Range", ("start", "limit", "delta"), {}, _evaluating(ref.range_, 0), ref.range_),
    OpDef("Resize", ("X", "roi?", "scales?", "sizes?"), _RESIZE, _evaluating(ref.resize),
          ref.resize, quant=Q.KEEP_PARAMS, int8=int8.resize_int8, lower=L.RESIZE),
    # Data movement: views and copies; integers move as they are, keeping the scale.
    OpDef("Flatten", ("input",), {"axis": 1}, flatten_shape, ref.flatten,
          quant=Q.KEEP_PARAMS, int8=ref.flatten, lower=L.VIEW, view=V.RESHAPE),
    OpDef("Reshape", ("data", "shape"), {"allowzero": 0}, _evaluating(ref.reshape),
          ref.reshape, quant=Q.KEEP_PARAMS, int8=ref.reshape, lower=L.VIEW, view=V.RESHAPE),
    OpDef("Transpose", ("data",), {"perm": None}, _evaluating(ref.transpose), ref.transpose,
          quant=Q.KEEP_PARAMS, int8=ref.transpose, lower=L.TRANSPOSE, view=V.PERMUTE),
    OpDef("Squeeze", ("data", "axes?"), {}, _evaluating(ref.squeeze), ref.squeeze,
          attr_to_input={"axes": 1}, quant=Q.KEEP_PARAMS, int8=ref.squeeze,
          lower=L.VIEW, view=V.RESHAPE),
    OpDef("Unsqueeze", ("data", "axes"), {}, _evaluating(ref.unsqueeze), ref.unsqueeze,
          attr_to_input={"axes": 1}, quant=Q.KEEP_PARAMS, int8=ref.unsqueeze,
          lower=L.VIEW, view=V.RESHAPE),
    OpDef("Slice", ("data", "starts", "ends", "axes?", "steps?"), {}, _evaluating(ref.slice_),
          ref.slice_, quant=Q.KEEP_PARAMS, int8=ref.slice_, lower=L.SLICE, view=V.PART),
    OpDef("Split", ("input", "split?"), {"axis": 0, "num_outputs": None},
          _evaluating(ref.split), ref.split, outputs=("outputs*",),
          attr_to_input={"split": 1}, quant=Q.KEEP_PARAMS, int8=ref.split,
          lower=L.SPLIT, view=V.PART, count_outputs=("num_outputs", 1)),
    OpDef("Concat", ("inputs*",), {"axis": REQUIRED}, concat_shape, ref.concat,
          quant=Q.RESCALE_INPUTS, int8=ref.concat, lower=L.CONCAT),
    OpDef("Pad", ("data", "pads", "constant_value?", "axes?"), {"mode": "constant"},
          _evaluating(ref.pad), ref.pad, quant=Q.KEEP_PARAMS, int8=ref.pad,
          fill_input=lambda attrs: 2 if attrs["mode"] == "constant" else None,
          lower=L.PAD, folds_into_consumer=True),
    # The boundary between float and integer, and the quantizer's own rescale: only quantized
    # graphs hold these. Their "fp32" reference is their definition (ONNX semantics).
    OpDef("QuantizeLinear", ("x", "y_scale", "y_zero_point?"),
          {**_QDQ, "precision": 0, "saturate": 1}, int8.quantize_shape, int8.quantize_linear,
          quant=Q.QUANTIZE, int8=int8.quantize_linear, lower=L.QUANTIZE),
    OpDef("DequantizeLinear", ("x", "x_scale", "x_zero_point?"), _QDQ, int8.dequantize_shape,
          int8.dequantize_linear, quant=Q.DEQUANTIZE, int8=int8.dequantize_linear,
          lower=L.DEQUANTIZE),
    OpDef("Rescale", ("x",), {"multiplier": None, "shift": None, "x_zero_point": 0,
                              "out_zero_point": 0, "qclamp": None, "out_dtype": "int8"},
          int8.rescale_shape, int8.rescale_int8,
          quant=Q.RESCALE, int8=int8.rescale_int8,  # ember's: int8 → int8, new scale
          lower=L.LUT),
    # Constants and shape arithmetic: constant folding removes them before compilation.
    # Recurrent layers: unrolled on import over the static sequence length
    # (`compiler.graph.recurrent`), so their reference is never called.
    OpDef("LSTM", ("X", "W", "R", "B?", "sequence_lens?", "initial_h?", "initial_c?", "P?"),
          {"activation_alpha": None, "activation_beta": None, "activations": None,
           "clip": None, "direction": "forward", "hidden_size": None, "input_forget": 0,
           "layout": 0}, recurrent_shape, _expanded_on_import,
          outputs=("Y?", "Y_h?", "Y_c?"), expand=recurrent.expand_lstm),
    OpDef("GRU", ("X", "W", "R", "B?", "sequence_lens?", "initial_h?"),
          {"activation_alpha": None, "activation_beta": None, "activations": None,
           "clip": None, "direction": "forward", "hidden_size": None, "layout": 0,
           "linear_before_reset": 0}, recurrent_shape, _expanded_on_import,
          outputs=("Y?", "Y_h?"), expand=recurrent.expand_gru),
    OpDef("Constant", (), {"value": None, "value_float": None, "value_floats": None,
                           "value_int": None, "value_ints": None, "sparse_value": None,
                           "value_string": None, "value_strings": None},
          constant_shape, ref.constant, fold_only=True),
    OpDef("Shape", ("data",), {"start": 0, "end": None},
          lambda xs, a: [Type("int64", (len(range(*slice(a["start"], a["end"]).indices(
              xs[0].type.rank))),))], ref.shape, fold_only=True, shape_only=True),
    OpDef("ConstantOfShape", ("input",), {"value": None}, _evaluating(ref.constant_of_shape, 0),
          ref.constant_of_shape, fold_only=True),
    # Matrix-product equations, expanded on import into Transposes and one MatMul.
    OpDef("Einsum", ("Inputs_0", "Inputs_1"), {"equation": REQUIRED},
          _evaluating(ref.einsum, 2), ref.einsum, expand=expansions.expand_einsum),
    # Positions of the extremes and elements by computed indices: fp32 only for now.
    OpDef("ArgMax", ("data",), {"axis": 0, "keepdims": 1, "select_last_index": 0},
          _evaluating(ref.arg_max), ref.arg_max),
    OpDef("ArgMin", ("data",), {"axis": 0, "keepdims": 1, "select_last_index": 0},
          _evaluating(ref.arg_min), ref.arg_min),
    OpDef("GatherElements", ("data", "indices"), {"axis": 0}, _evaluating(ref.gather_elements),
          ref.gather_elements, index_inputs=(1,)),
    # Rows of a table by integer indices (a model input's or constants): an embedding's
    # constant table is quantized per tensor and its rows copied by the indexed DMA (GATHER);
    # an activation's rows by constant indices are a view (the CLS token's row).
    OpDef("Gather", ("data", "indices"), {"axis": 0}, gather_shape, ref.gather,
          index_inputs=(1,), quant=Q.GATHER, int8=int8.gather_int8, lower=L.GATHER),
    OpDef("OneHot", ("indices", "depth", "values"), {"axis": -1},
          _evaluating(ref.one_hot, 1), ref.one_hot, index_inputs=(0,)),
    # A Cast of a model input's integers to float (a mask, after `cast_early`) is the input's
    # quantization: the host writes the integers' int8 codes, as it does a float input's.
    OpDef("Cast", ("input",), {"to": REQUIRED, "saturate": 1, "round_mode": "up"},
          _dtype_rule(_cast_dtype, same_shape), ref.cast, quant=Q.CAST),
)

OPS: dict[str, OpDef] = {op.name: op for op in _ROWS}


# Operators only the quantizer writes: ember takes fp32 models, so the importer rejects them.
QUANTIZED_ONLY = frozenset(name for name, op in OPS.items()
                           if op.quant is not None and op.quant.quantized_only)
FUSED_ONLY = frozenset(name for name, op in OPS.items() if op.fused_only)
IMPORTABLE = frozenset(OPS) - QUANTIZED_ONLY - FUSED_ONLY


# The rows of the operators the quantizer and the QDQ export write nodes of, for their names.
QUANTIZE_LINEAR, DEQUANTIZE_LINEAR, RESCALE = (
    OPS["QuantizeLinear"], OPS["DequantizeLinear"], OPS["Rescale"])
RELU, CLIP, ADD, RECIPROCAL = OPS["Relu"], OPS["Clip"], OPS["Add"], OPS["Reciprocal"]
# And the rows of the operators the graph passes write.
CONV, CONV_TRANSPOSE, GEMM, MUL = OPS["Conv"], OPS["ConvTranspose"], OPS["Gemm"], OPS["Mul"]
CHANNEL_MAP = OPS["ChannelMap"]
MAX, MIN, HYPOT = OPS["Max"], OPS["Min"], OPS["Hypot"]
# And the rows the importer unrolls recurrent layers into (`compiler.graph.recurrent`).
MATMUL, SUB, SIGMOID, TANH = OPS["MatMul"], OPS["Sub"], OPS["Sigmoid"], OPS["Tanh"]
SLICE, CONCAT, RESHAPE = OPS["Slice"], OPS["Concat"], OPS["Reshape"]
TRANSPOSE, IDENTITY, PAD = OPS["Transpose"], OPS["Identity"], OPS["Pad"]
SQUEEZE = OPS["Squeeze"]
# And the rows the written-out LayerNorm fusion reads and writes.
DIV, POW, SQRT, REDUCE_MEAN = OPS["Div"], OPS["Pow"], OPS["Sqrt"], OPS["ReduceMean"]
LAYER_NORMALIZATION = OPS["LayerNormalization"]
# And the rows the mask passes move and sink past (`cast_early`, `sink_expand`) and the
# quantizer's masked Softmax (`quantizer.masks`).
CAST, EXPAND, SOFTMAX = OPS["Cast"], OPS["Expand"], OPS["Softmax"]
# And the rows the written-out softmax fusion reads.
EXP, REDUCE_MAX, REDUCE_SUM = OPS["Exp"], OPS["ReduceMax"], OPS["ReduceSum"]
# And the rows the one-hot embedding fusion reads and writes.
EQUAL, ONE_HOT, GATHER = OPS["Equal"], OPS["OneHot"], OPS["Gather"]
# And the row the sensitivity run switches each tensor's precision with.
WHERE = OPS["Where"]
# And the rows the vector unit's REDUCE computes.
REDUCE_MIN, REDUCE_L2 = OPS["ReduceMin"], OPS["ReduceL2"]
# And the row the QDQ export writes out as exporters do (ONNX has it from opset 24 only).
SWISH = OPS["Swish"]
BATCH_NORMALIZATION, CONSTANT = OPS["BatchNormalization"], OPS["Constant"]
# And the global pools `conv1d_as_2d` makes 2-D.
GLOBAL_MAX_POOL, GLOBAL_AVERAGE_POOL = OPS["GlobalMaxPool"], OPS["GlobalAveragePool"]


def reaches_the_accelerator(row: OpDef) -> bool:
    """Whether the op's int8 form runs on the accelerator: it has a lowering, or it becomes
    one the quantizer writes (a model input's Cast: its QuantizeLinear, a program binding)."""
    return row.lower is not None or row.quant is Q.CAST


def moves_elements(row: OpDef) -> bool:
    """Whether the op only moves or repeats its first input's elements (a view, Expand)."""
    return row.view is not None or row is EXPAND


def broadcasts(row: OpDef) -> bool:
    """Whether the op is elementwise over its inputs broadcast to one shape."""
    return row.shape is broadcast


def elementwise_map(row: OpDef) -> bool:
    """Whether the op maps each element of its one run-time input on its own (a table, a
    clamp, a Cast)."""
    return row.shape is same_shape and row.quant in (Q.LOOKUP, Q.CLAMP, Q.CAST)


def reduces(row: OpDef) -> bool:
    """Whether the op reduces its input over an `axes` input (sum, mean, max, min, L2)."""
    return row.inputs == ("data", "axes?") and "keepdims" in row.attrs


def supported_ops() -> str:
    return ", ".join(sorted(IMPORTABLE))


def infer_types(graph: Graph, node: Node) -> list[Type]:
    """The output types the shape rule gives; the recorded ones where it cannot tell.

    A rule cannot tell when a parameter input (Reshape's shape, say) is computed rather than
    constant: before constant folding such a graph is still valid.
    """
    inputs = [graph.values[name] if name else None for name in node.inputs]
    return infer_from(node, inputs) or [graph.values[name].type for name in node.outputs]


def infer_from(node: Node, inputs: Sequence[Value | None]) -> list[Type] | None:
    op = OPS[node.op]
    attrs = node.attrs if op.quant is Quant.RESCALE else {
        k: v for k, v in node.attrs.items() if k not in INT8_ATTRS}
    try:
        types = op.shape(inputs, op.bind(node.name, attrs))
    except CompileError as err:
        if str(err).startswith(f"node {node.name!r}"):
            raise
        raise CompileError(f"node {node.name!r} ({node.op}): {err}") from None
    except (ValueError, IndexError, TypeError) as err:
        raise CompileError(f"node {node.name!r} ({node.op}): cannot infer output shape: "
                           f"{err}") from None
    if types is None:
        return None
    if op.quant is not Quant.RESCALE and "out_dtype" in node.attrs and \
            (types[0].dtype in ("int8", "uint8", "int16") or "table_of" in node.attrs):
        # A quantized kernel's output type is its out_dtype (an int16 residual stream; a
        # table's, whose first input may be a float constant, `int8.tabled`), which no shape
        # rule sees (the attribute is the quantizer's).
        types = [Type(node.attrs["out_dtype"], types[0].shape), *types[1:]]
    if len(node.outputs) > len(types):
        raise CompileError(f"node {node.name!r} ({node.op}) has {len(node.outputs)} outputs; "
                           f"ember's {node.op} produces {len(types)} ({', '.join(op.outputs)})")
    return types[:len(node.outputs)]


@contextmanager
def data_errors(node: Node):
    """A reference's error about the data (an index outside its table) as one naming the node
    and its indices input."""
    try:
        yield
    except SimulatorError as err:
        row = OPS[node.op]
        indices = [node.inputs[i] for i in row.index_inputs if i < len(node.inputs)]
        what = f", indices {indices[0]!r}" if indices else ""
        raise CompileError(f"node {node.name!r} ({node.op}){what}: {err}") from None


def _channel_map(x, pre, post, map: str, map_attrs: Mapping[str, Any]):
    """ChannelMap's fp32 form: its one-input table op between two per-channel scales."""
    row = OPS[map]
    return (post * row.fp32(x * pre, **row.bind(map, map_attrs))).astype(x.dtype)


# Where a region computing one value elementwise is compared with each recognised operator
# (`recognised_forms`): every float32 value at a fine step over the range activations take,
# to 1e-5 of the larger magnitude.
GRID = np.linspace(-24.0, 24.0, 9601, dtype=np.float32)
TOLERANCE = 1e-5


def recognised(got: np.ndarray) -> tuple[str, dict] | None:
    """The (operator, attributes) whose function takes the values `got` on `GRID`, if the
    table knows one (gate fusion; equalization through an activation)."""
    got = np.asarray(got, np.float64)
    with np.errstate(all="ignore"):
        for name, row in OPS.items():
            for attrs in row.recognised_forms:
                want = np.asarray(row.fp32(GRID, **row.bind(name, attrs)), np.float64)
                if got.shape == want.shape and \
                        np.all(np.abs(got - want) <= TOLERANCE * np.maximum(1.0, np.abs(want))):
                    return name, attrs
    return None


def run_fp32(node: Node, args: Sequence[np.ndarray | None]) -> tuple[np.ndarray, ...]:
    """Apply the row's fp32 reference; always returns one array per node output."""
    op = OPS[node.op]
    with data_errors(node):
        result = op.fp32(*args, **op.bind(node.name, node.attrs))
    results = result if isinstance(result, tuple) else (result,)
    return tuple(np.asarray(r) for r in results[:len(node.outputs)])


def is_integer_node(graph: Graph, node: Node) -> bool:
    """Whether `node` of a quantized graph runs its int8 kernel: it writes quantized values,
    or it is one of the operators only quantized graphs hold."""
    if node.op in QUANTIZED_ONLY:
        return True
    return any(graph.values[name].type.quant is not None for name in node.outputs)


def int8_attrs(node: Node) -> dict[str, Any]:
    """The node's attributes (ONNX ones and the quantizer's integer parameters) completed with
    the table's defaults: the keywords its int8 kernel takes."""
    base = {k: v for k, v in OPS[node.op].attrs.items() if v is not REQUIRED}
    return {**base, **node.attrs}


def node_macs(graph: Graph, node: Node) -> int | None:
    """The node's multiply-accumulates (its row's `macs` rule), or None when its work is not
    multiply-accumulates."""
    rule = OPS[node.op].macs
    if rule is None:
        return None
    return rule([graph.type_of(name) for name in node.inputs if name],
                [graph.type_of(name) for name in node.outputs if name], int8_attrs(node))
