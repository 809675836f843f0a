"""fp32 reference semantics of every operator, in numpy, after the ONNX specification.

Each function takes the operator's inputs positionally (None for an omitted optional input) and
its attributes as keywords with ONNX names, and returns one array or a tuple of arrays. They are
plain and slow-but-clear where clarity costs little; convolution and pooling go through strided
windows so the reference runs real models in seconds.

Users judge ember against onnxruntime, so where onnxruntime departs from the letter of the spec
the reference follows onnxruntime and says so where it does (Resize's float32 arithmetic and
its no-op on an unchanged shape, Slice's INT_MAX ends). A feature the reference does not
implement raises CompileError, never a silently different answer.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from compiler.errors import CompileError
from simulator.numerics import gather_index, oversize

# --- helpers ---------------------------------------------------------------------------------


def resolve_pads(in_spatial, kernel, strides, dilations, pads, auto_pad, ceil_mode=0):
    """Explicit (begin..., end...) pads and output sizes for conv and pooling windows."""
    n = len(in_spatial)
    strides = tuple(strides) if strides else (1,) * n
    dilations = tuple(dilations) if dilations else (1,) * n
    pads = list(pads) if pads else [0] * (2 * n)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [math.ceil(i / s) for i, s in zip(in_spatial, strides)]
        for a in range(n):
            total = max(0, (out[a] - 1) * strides[a] + eff[a] - in_spatial[a])
            small, large = total // 2, total - total // 2
            pads[a], pads[a + n] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    out = []
    for a in range(n):
        span = in_spatial[a] + pads[a] + pads[a + n] - eff[a]
        size = (math.ceil(span / strides[a]) if ceil_mode else span // strides[a]) + 1
        if ceil_mode and (size - 1) * strides[a] >= in_spatial[a] + pads[a]:
            size -= 1  # the last window must start inside the input or its begin padding
        out.append(size)
    return tuple(pads), tuple(out), strides, dilations


def _windows(x, kernel, strides, dilations, out_spatial):
    """View x (N, C, *spatial, already padded) as (N, C, *out_spatial, *kernel) windows."""
    n = len(kernel)
    spatial_strides = x.strides[2:]
    shape = x.shape[:2] + tuple(out_spatial) + tuple(kernel)
    strides_ = (x.strides[:2] + tuple(s * st for s, st in zip(spatial_strides, strides))
                + tuple(s * d for s, d in zip(spatial_strides, dilations)))
    assert len(shape) == 2 + 2 * n
    return as_strided(x, shape=shape, strides=strides_, writeable=False)


def _pad_spatial(x, pads, value):
    n = x.ndim - 2
    width = [(0, 0), (0, 0)] + [(pads[a], pads[a + n]) for a in range(n)]
    if not any(p for pair in width for p in pair):
        return x
    return np.pad(x, width, mode="constant", constant_values=value)


def _pad_for_windows(x, pads, out_spatial, kernel, strides, dilations, value):
    """Pad the begin side by `pads` and the end side as far as the last window reaches."""
    n = x.ndim - 2
    ends = []
    for a in range(n):
        reach = (out_spatial[a] - 1) * strides[a] + (kernel[a] - 1) * dilations[a] + 1
        ends.append(max(0, reach - pads[a] - x.shape[2 + a]))
    x = _pad_spatial(x, tuple(pads[:n]) + tuple(ends), value)
    return x


def _axis(axis, rank):
    return axis + rank if axis < 0 else axis


# --- linear algebra -------------------------------------------------------------------------


def conv_windows(x, kernel, *, auto_pad="NOTSET", dilations=None, pads=None, strides=None):
    """Each output position's input window of a convolution (zero padded), as a view:
    (N, C, *out_spatial, *kernel)."""
    pads, out_spatial, strides, dilations = resolve_pads(
        x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    xp = _pad_for_windows(x, pads, out_spatial, kernel, strides, dilations, 0.0)
    return _windows(xp, kernel, strides, dilations, out_spatial)


def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    kernel = tuple(w.shape[2:])
    win = conv_windows(x, kernel, auto_pad=auto_pad, dilations=dilations, pads=pads,
                       strides=strides)                               # N, C, *out, *k
    out_spatial = win.shape[2:2 + len(kernel)]
    n_batch, channels = x.shape[:2]
    m = w.shape[0]
    cg, mg = channels // group, m // group
    spatial = int(np.prod(out_spatial))
    out = np.empty((n_batch, m, spatial), dtype=np.result_type(x, w))
    for g in range(group):
        wg = win[:, g * cg:(g + 1) * cg]                           # N, cg, *out, *k
        cols = np.moveaxis(wg, 1, 1 + len(kernel))                 # N, *out, cg, *k
        cols = cols.reshape(n_batch, spatial, cg * int(np.prod(kernel)))  # N may be 0
        weights = w[g * mg:(g + 1) * mg].reshape(mg, -1)
        out[:, g * mg:(g + 1) * mg] = np.matmul(cols, weights.T).transpose(0, 2, 1)
    out = out.reshape((n_batch, m) + tuple(out_spatial))
    if b is not None:
        out += b.reshape((1, m) + (1,) * len(kernel))
    return out


def conv_transpose_pads(in_spatial, kernel, strides=None, dilations=None, pads=None,
                        output_padding=None, output_shape=None, auto_pad="NOTSET"):
    """ConvTranspose's (begin..., end...) crops of the full transposed output and its output
    sizes, as onnxruntime computes them: with `output_shape` or SAME_*, the odd unit of the
    total crop goes to the end for SAME_UPPER and to the begin otherwise (ONNX's spec), and an
    `output_shape` larger than the full output grows it at the end (bias only there)."""
    n = len(in_spatial)
    strides = tuple(strides) if strides else (1,) * n
    dilations = tuple(dilations) if dilations else (1,) * n
    adjust = tuple(output_padding) if output_padding else (0,) * n
    pads = list(pads) if pads and auto_pad == "NOTSET" else [0] * (2 * n)
    out = []
    for a in range(n):
        full = (in_spatial[a] - 1) * strides[a] + adjust[a] + (kernel[a] - 1) * dilations[a] + 1
        wanted = output_shape[-n + a] if output_shape else \
            in_spatial[a] * strides[a] if auto_pad in ("SAME_UPPER", "SAME_LOWER") else None
        if wanted is not None:
            total = max(0, full - wanted)
            small, large = total // 2, total - total // 2
            pads[a] = small if auto_pad == "SAME_UPPER" else large
            pads[a + n] = full - pads[a] - wanted
        out.append(full - pads[a] - pads[a + n])
    return tuple(pads), tuple(out), strides, dilations


def transposed_as_convolution(x, w, fill, *, auto_pad="NOTSET", dilations=None, group=1,
                              kernel_shape=None, output_padding=None, output_shape=None,
                              pads=None, strides=None):
    """ConvTranspose as the stride-1 convolution that defines it: x with strides - 1 copies of
    `fill` (the value of zero: 0.0, or an int8 zero point) between neighbours, padded with
    `fill` by (kernel - 1) * dilation - pad at the begin (negative: cropped) and to the output
    size at the end, by the flipped weight with input and output channels swapped per group.
    Returns that input and that (C_out, C_in / group, *kernel) weight."""
    kernel = tuple(w.shape[2:])
    pads_, out, strides_, dilations_ = conv_transpose_pads(
        x.shape[2:], kernel, strides, dilations, pads, output_padding, output_shape, auto_pad)
    n = len(kernel)
    shape, index = list(x.shape[:2]), [slice(None), slice(None)]
    for a in range(n):
        begin = (kernel[a] - 1) * dilations_[a] - pads_[a]
        size = out[a] + (kernel[a] - 1) * dilations_[a]
        first = max(0, -begin + strides_[a] - 1) // strides_[a]  # inputs cropped at the begin
        last = min(x.shape[2 + a], (size - 1 - begin) // strides_[a] + 1)
        shape.append(size)
        index.append(slice(begin + first * strides_[a], begin + last * strides_[a],
                           strides_[a]) if last > first else slice(0, 0))
        x = np.take(x, range(first, max(first, last)), axis=2 + a)
    dense = np.full(shape, fill, dtype=x.dtype)
    dense[tuple(index)] = x
    return dense, transposed_weight(w, group)


def transposed_weight(w, group=1):
    """ConvTranspose's (C_in, C_out / group, *kernel) weight as its convolution's: flipped, with
    input and output channels swapped within each group, (C_out, C_in / group, *kernel)."""
    cin, mg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    flipped = np.flip(w, axis=tuple(range(2, w.ndim)))
    return flipped.reshape((group, cin // group, mg) + kernel).swapaxes(1, 2).reshape(
        (group * mg, cin // group) + kernel)


def conv_transpose(x, w, b=None, *, dilations=None, **attrs):
    dense, weight = transposed_as_convolution(x, w, 0.0, dilations=dilations, **attrs)
    return conv(dense, weight, b, dilations=dilations, group=attrs.get("group", 1))


def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    a = a.T if transA else a
    b = b.T if transB else b
    y = alpha * (a @ b)
    if c is not None:
        y = y + beta * c
    return y.astype(np.result_type(a, b), copy=False)


def matmul(a, b):
    return np.matmul(a, b)


def batch_normalization(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9,
                        training_mode=0):
    if training_mode:
        raise CompileError("BatchNormalization with training_mode=1 is not an inference op")
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + epsilon)
    return ((x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


# --- elementwise ----------------------------------------------------------------------------


def relu(x):
    return np.maximum(x, np.zeros((), x.dtype))


def clip(x, min=None, max=None):  # noqa: A002 - ONNX input names
    if min is not None:
        x = np.maximum(x, min)
    if max is not None:
        x = np.minimum(x, max)
    return x


def leaky_relu(x, *, alpha=0.01):
    return np.where(x < 0, x * np.asarray(alpha, x.dtype), x)


def prelu(x, slope):
    return np.where(x < 0, x * np.asarray(slope, x.dtype), x)


def sigmoid(x):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)


def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return np.clip(x * np.asarray(alpha, x.dtype) + np.asarray(beta, x.dtype), 0, 1).astype(x.dtype)


def hard_swish(x):
    return (x * hard_sigmoid(x, alpha=1.0 / 6.0, beta=0.5)).astype(x.dtype)


def tanh(x):
    return np.tanh(x)


# Smooth activations: each a function of one value, so int8 runs each as one 256-entry table.
# Computed in float64 and rounded once to the input's type.

def _f64(fn):
    def apply(x, **attrs):
        return np.asarray(fn(np.asarray(x, np.float64), **attrs)).astype(x.dtype)
    apply.__name__ = fn.__name__
    return apply


@_f64
def swish(x, *, alpha=1.0):
    return x / (1.0 + np.exp(-alpha * x))


@_f64
def softplus(x):
    return np.logaddexp(0.0, x)


@_f64
def mish(x):
    return x * np.tanh(np.logaddexp(0.0, x))


@_f64
def erf(x):
    return _erf(x)


@_f64
def gelu(x, *, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


@_f64
def elu(x, *, alpha=1.0):
    return np.where(x < 0, alpha * np.expm1(np.minimum(x, 0.0)), x)


@_f64
def celu(x, *, alpha=1.0):
    return np.maximum(x, 0.0) + np.minimum(0.0, alpha * np.expm1(np.minimum(x, 0.0) / alpha))


@_f64
def selu(x, *, alpha=1.6732632423543772, gamma=1.0507009873554805):
    return gamma * np.where(x <= 0, alpha * np.expm1(np.minimum(x, 0.0)), x)


@_f64
def softsign(x):
    return x / (1.0 + np.abs(x))


@_f64
def exp(x):
    with np.errstate(over="ignore"):
        return np.exp(x)


def neg(x):
    return np.negative(x)


@_f64
def sqrt(x):
    with np.errstate(invalid="ignore"):
        return np.sqrt(x)


def power(x, y):
    """ONNX Pow: the output has the base's type whatever the exponent's."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.power(x.astype(np.float64), np.asarray(y, np.float64)).astype(x.dtype)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def hypot(a, b):
    """sqrt(a^2 + b^2): ember's fused magnitude (`compiler.passes.fuse_hypot`)."""
    return np.sqrt(np.square(a) + np.square(b)).astype(np.result_type(a, b))


def maximum(*operands):
    return functools.reduce(np.maximum, operands)


def minimum(*operands):
    return functools.reduce(np.minimum, operands)


def mul(a, b):
    return a * b


def reciprocal(x):
    """1 / x; 1 / 0 is an infinity (no warning: a table over every code meets it)."""
    with np.errstate(divide="ignore"):
        return np.reciprocal(np.asarray(x))


def div(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(a / b).astype(np.result_type(a, b))
    return a / b


def softmax(x, *, axis=-1):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, *, axis=-1):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def layer_normalization(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX LayerNormalization: normalized over the axes from `axis` on, then scale and bias;
    also the mean and the inverse standard deviation (outputs Mean and InvStdDev)."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    wide = x.astype(np.float64) if stash_type == 1 else x
    mean = wide.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(((wide - mean) ** 2).mean(axis=axes, keepdims=True) + epsilon)
    y = (wide - mean) * inv * scale + (0 if bias is None else bias)
    return y.astype(x.dtype), mean.astype(x.dtype), inv.astype(x.dtype)


def identity(x):
    return x


def dropout(x, ratio=None, training_mode=None, *, seed=None):
    if training_mode is not None and bool(np.asarray(training_mode)):
        raise CompileError("Dropout with training_mode=true is not an inference op")
    return x, np.ones(x.shape, dtype=bool)


# --- pooling and reductions -----------------------------------------------------------------


def _pool_windows(x, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations, fill):
    pads, out_spatial, strides, dilations = resolve_pads(
        x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xp = _pad_for_windows(x, pads, out_spatial, kernel_shape, strides, dilations, fill)
    win = _windows(xp, tuple(kernel_shape), strides, dilations, out_spatial)
    return win, pads, out_spatial, strides, dilations


def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
             storage_order=0, strides=None):
    lowest = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    win, *_ = _pool_windows(x, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations,
                            lowest)
    k_axes = tuple(range(x.ndim, win.ndim))
    return win.max(axis=k_axes).astype(x.dtype)


def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    win, pads_, out_spatial, strides_, dil = _pool_windows(
        x, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations, 0.0)
    k_axes = tuple(range(x.ndim, win.ndim))
    total = win.sum(axis=k_axes)
    # The divisor counts window positions inside the input, plus explicit padding when
    # count_include_pad; positions past the end added only by ceil_mode never count.
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    limit_pads = pads_ if count_include_pad else (0,) * len(pads_)
    ones = _pad_spatial(ones, limit_pads, 1.0)
    shifted = tuple(p - lp for p, lp in zip(pads_, limit_pads))
    ones = _pad_for_windows(ones, shifted, out_spatial, kernel_shape, strides_, dil, 0.0)
    counts = _windows(ones, tuple(kernel_shape), strides_, dil, out_spatial).sum(axis=k_axes)
    return (total / counts).astype(x.dtype)


def global_average_pool(x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)


def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


def _reduce(fn, x, axes, keepdims, noop_with_empty_axes):
    """ONNX's reductions: over `axes` (all when none are given, unless noop_with_empty_axes)."""
    if axes is None or len(np.atleast_1d(axes)) == 0:
        if noop_with_empty_axes:
            return x
        axes = tuple(range(x.ndim))
    axes = tuple(int(a) for a in np.atleast_1d(axes))
    return np.asarray(fn(x, axes, bool(keepdims))).astype(x.dtype)


def reduce_mean(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(lambda v, a, k: np.mean(v, axis=a, keepdims=k), x, axes, keepdims,
                   noop_with_empty_axes)


def reduce_sum(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(lambda v, a, k: np.sum(v, axis=a, keepdims=k), x, axes, keepdims,
                   noop_with_empty_axes)


def _extreme(dtype, low: bool):
    """The identity of max (low) or min over an empty set: -inf / +inf, the type's bounds."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return -np.inf if low else np.inf
    if dtype.kind == "b":
        return not low
    info = np.iinfo(dtype)
    return info.min if low else info.max


def einsum(*operands, equation):
    """ONNX Einsum: numpy's, on the equation as written."""
    return np.einsum(equation.replace(" ", ""), *operands)


def arg_extreme(x, *, axis=0, keepdims=1, select_last_index=0, low: bool = False):
    """ONNX ArgMax (ArgMin with `low`): the first (or last) position of the largest (smallest)
    value along `axis`, int64."""
    axis = _axis(axis, x.ndim)
    pick = np.argmin if low else np.argmax
    if select_last_index:
        flipped = np.flip(x, axis=axis)
        index = x.shape[axis] - 1 - pick(flipped, axis=axis)
    else:
        index = pick(x, axis=axis)
    index = index.astype(np.int64)
    return np.expand_dims(index, axis) if keepdims else index


def arg_max(x, **attrs):
    return arg_extreme(x, **attrs)


def arg_min(x, **attrs):
    return arg_extreme(x, low=True, **attrs)


def gather_elements(data, indices, *, axis=0):
    """ONNX GatherElements: out[i][j][k] = data[i][indices[i][j][k]][k] along `axis` (a
    negative index counting from the end; one outside the axis an error naming it)."""
    axis = _axis(axis, data.ndim)
    return np.take_along_axis(data, gather_index(indices, data.shape[axis]), axis=axis)


def reduce_max(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(lambda v, a, k: np.max(v, axis=a, keepdims=k,
                                          initial=_extreme(v.dtype, True)),
                   x, axes, keepdims, noop_with_empty_axes)


def reduce_min(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(lambda v, a, k: np.min(v, axis=a, keepdims=k,
                                          initial=_extreme(v.dtype, False)),
                   x, axes, keepdims, noop_with_empty_axes)


def reduce_l2(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(lambda v, a, k: np.sqrt(np.sum(np.square(v.astype(np.float64)), axis=a,
                                                  keepdims=k)), x, axes, keepdims,
                   noop_with_empty_axes)


# --- comparisons and selection ----------------------------------------------------------------


def equal(a, b):
    return np.equal(a, b)


def less(a, b):
    return np.less(a, b)


def greater(a, b):
    return np.greater(a, b)


def logical_not(x):
    return np.logical_not(x)


def where(condition, x, y):
    return np.where(condition, x, y).astype(np.result_type(x, y))


# --- data movement --------------------------------------------------------------------------


def expand(x, shape):
    """ONNX Expand: numpy broadcasting of x and `shape` (either may have the larger dims)."""
    return np.array(x * np.ones([int(d) for d in shape], x.dtype), dtype=x.dtype)


def tile(x, repeats):
    return np.tile(x, [int(r) for r in repeats])


def range_(start, limit, delta):
    count = max(int(np.ceil((limit - start) / delta)), 0)
    return (start + delta * np.arange(count)).astype(np.asarray(start).dtype)


def flatten(x, *, axis=1):
    axis = _axis(axis, x.ndim)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(outer, -1) if x.size else x.reshape(outer, int(np.prod(x.shape[axis:])))


def reshape(x, shape, *, allowzero=0):
    target = [int(d) for d in shape]
    if not allowzero:
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


def transpose(x, *, perm=None):
    return np.transpose(x, perm)


def squeeze(x, axes=None):
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(_axis(int(a), x.ndim) for a in np.atleast_1d(axes)))


def unsqueeze(x, axes):
    rank = x.ndim + len(np.atleast_1d(axes))
    for a in sorted(_axis(int(a), rank) for a in np.atleast_1d(axes)):
        x = np.expand_dims(x, a)
    return x


_INT_MAX_ENDS = (np.iinfo(np.int32).max, np.iinfo(np.int64).max)


def slice_(data, starts, ends, axes=None, steps=None):
    starts, ends = np.atleast_1d(starts), np.atleast_1d(ends)
    axes = range(len(starts)) if axes is None else np.atleast_1d(axes)
    steps = [1] * len(starts) if steps is None else np.atleast_1d(steps)
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(int(axis), data.ndim)
        dim = data.shape[axis]
        start, end, step = int(start), int(end), int(step)
        # The ONNX spec clamps starts to [0, dim] stepping forward and [0, dim - 1] backward,
        # ends to [0, dim] and [-1, dim - 1], where -1 means "past the first element".
        # onnxruntime also reads an end of INT_MAX as "to the edge", backwards too.
        end_is_open = end in _INT_MAX_ENDS
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start = min(max(start, 0), dim - 1)
            end = -1 if end_is_open else min(max(end, -1), dim - 1)
        index[axis] = slice(start, None if end < 0 else end, step)
    return data[tuple(index)]


def split(x, split=None, *, axis=0, num_outputs=None):
    axis = _axis(axis, x.ndim)
    if split is None or len(np.atleast_1d(split)) == 0:
        parts = num_outputs
        size = -(-x.shape[axis] // parts)  # ceil: the last chunk may be smaller (opset 18)
        split = [size] * (parts - 1) + [x.shape[axis] - size * (parts - 1)]
    bounds = np.cumsum([int(s) for s in np.atleast_1d(split)])[:-1]
    return tuple(np.split(x, bounds, axis=axis))


def concat(*xs, axis):
    return np.concatenate(xs, axis=axis)


def pad(data, pads, constant_value=None, axes=None, *, mode="constant"):
    pads = [int(p) for p in np.atleast_1d(pads)]
    rank = data.ndim
    axes = list(range(rank)) if axes is None else [_axis(int(a), rank) for a in axes]
    width = [(0, 0)] * rank
    for i, a in enumerate(axes):
        width[a] = (pads[i], pads[i + len(axes)])
    if any(p < 0 for pair in width for p in pair):
        index = tuple(slice(-min(b, 0), data.shape[a] + min(e, 0)) for a, (b, e) in
                      enumerate(width))
        data = data[index]
        width = [(max(b, 0), max(e, 0)) for b, e in width]
    _check_size([n + b + e for n, (b, e) in zip(data.shape, width)], data.dtype)
    if mode == "constant":
        value = 0 if constant_value is None else np.asarray(constant_value).item()
        return np.pad(data, width, mode="constant", constant_values=value)
    if mode == "reflect":
        for a, (begin, end) in enumerate(width):
            if max(begin, end) > data.shape[a] - 1:
                raise CompileError(f"Pad reflect pads ({begin}, {end}) on axis {a} exceed its "
                                   f"length {data.shape[a]} minus one (onnxruntime rejects them)")
        return np.pad(data, width, mode="reflect")
    if mode == "edge":
        return np.pad(data, width, mode="edge")
    if mode == "wrap":
        return np.pad(data, width, mode="wrap")
    raise CompileError(f"Pad mode {mode!r} is not supported")


def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    """Nearest and (multi)linear resize, separable per axis.

    Scales, output sizes and source coordinates are float32, as onnxruntime computes them:
    ember is judged against onnxruntime, and the ONNX reference's float64 arithmetic differs
    from it at exact ties (a nearest pixel at x.5) and in floor(size * scale).
    """
    if mode not in ("nearest", "linear"):
        raise CompileError(f"Resize mode {mode!r} is not supported (nearest, linear)")
    if antialias:
        raise CompileError("Resize with antialias=1 is not supported")
    if coordinate_transformation_mode == "tf_crop_and_resize":
        raise CompileError("Resize coordinate_transformation_mode 'tf_crop_and_resize' is not "
                           "supported")
    out_shape, scale = resize_scales(x.shape, scales, sizes, axes, keep_aspect_ratio_policy)
    rank = x.ndim
    _check_size(out_shape, x.dtype)
    if tuple(out_shape) == x.shape:
        return x   # onnxruntime copies the input whenever the shape is unchanged, whatever scales
    y = x
    for a in range(rank):
        if out_shape[a] == x.shape[a] and scale[a] == 1:
            continue
        y = _resize_axis(y, a, out_shape[a], scale[a], mode, coordinate_transformation_mode,
                         nearest_mode)
    return y.astype(x.dtype, copy=False)


def resize_scales(shape, scales, sizes, axes, keep_aspect_ratio_policy="stretch"):
    """Resize's output shape and its float32 scale per axis, as onnxruntime computes them."""
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [_axis(int(a), rank) for a in axes]
    f32 = np.float32
    scale = [f32(1.0)] * rank
    out_shape = list(shape)
    if sizes is not None and len(np.atleast_1d(sizes)):
        sizes = [int(s) for s in np.atleast_1d(sizes)]
        for a, size in zip(axes, sizes):
            out_shape[a], scale[a] = size, f32(size) / f32(shape[a])
        if keep_aspect_ratio_policy in ("not_larger", "not_smaller"):
            # One scale for all the axes, the smallest or largest; sizes round half up.
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            common = pick(scale[a] for a in axes)
            for a in axes:
                scale[a] = common
                out_shape[a] = int(np.floor(common * f32(shape[a]) + f32(0.5)))
        elif keep_aspect_ratio_policy != "stretch":
            raise CompileError(f"Resize keep_aspect_ratio_policy {keep_aspect_ratio_policy!r} "
                               "is not one of stretch, not_larger, not_smaller")
    else:
        for a, s in zip(axes, np.atleast_1d(scales)):
            scale[a] = f32(s)
            out_shape[a] = int(np.floor(f32(shape[a]) * scale[a]))
    return out_shape, scale


def _source_coordinates(in_len, out_len, scale, ctm):
    """Where each output position samples the input axis (float32, onnxruntime's formulas)."""
    f32 = np.float32
    o = np.arange(out_len, dtype=f32)
    half = f32(0.5)
    if ctm == "half_pixel":
        return (o + half) / scale - half
    if ctm == "half_pixel_symmetric":
        # As onnxruntime's source writes it: the offset in float32, the rest in double. Its
        # nearest pixel can still differ from this at exact ties (x.5), where rounding order
        # decides; no simple formula reproduces those.
        adjustment = f32(out_len) / (scale * f32(in_len))
        offset = f32(in_len) / f32(2) * (f32(1) - adjustment)
        return (np.float64(offset) + (o.astype(np.float64) + 0.5) / np.float64(scale)
                - 0.5).astype(f32)
    if ctm == "pytorch_half_pixel":
        return (o + half) / scale - half if out_len > 1 else np.zeros_like(o)
    if ctm == "align_corners":
        return o * f32(in_len - 1) / f32(out_len - 1) if out_len > 1 else np.zeros_like(o)
    if ctm == "asymmetric":
        return o / scale
    if ctm == "tf_half_pixel_for_nn":  # Resize-11 only
        return (o + half) / scale
    raise CompileError(f"Resize coordinate_transformation_mode {ctm!r} is not supported")


def linear_taps(in_len, out_len, scale, ctm):
    """Linear resize along one axis: output o = x[lo[o]] * (1 - frac[o]) + x[hi[o]] * frac[o],
    frac in float64 from the float32 source coordinate clamped to the axis."""
    coord = np.clip(_source_coordinates(in_len, out_len, scale, ctm), 0, in_len - 1)
    coord = coord.astype(np.float64)
    lo = np.floor(coord).astype(np.int64)
    return lo, np.minimum(lo + 1, in_len - 1), coord - lo


def _resize_axis(x, axis, out_len, scale, mode, ctm, nearest_mode):
    in_len = x.shape[axis]
    coord = _source_coordinates(in_len, out_len, scale, ctm)
    if mode == "nearest":
        tie = coord == np.floor(coord) + np.float32(0.5)
        if nearest_mode == "round_prefer_floor":
            idx = np.where(tie, np.floor(coord), np.round(coord))
        elif nearest_mode == "round_prefer_ceil":
            idx = np.where(tie, np.ceil(coord), np.round(coord))
        elif nearest_mode == "floor":
            idx = np.floor(coord)
        elif nearest_mode == "ceil":
            idx = np.ceil(coord)
        else:
            raise CompileError(f"Resize nearest_mode {nearest_mode!r} is not supported")
        idx = np.clip(idx, 0, in_len - 1).astype(np.int64)
        return np.take(x, idx, axis=axis)
    lo, hi, frac = linear_taps(in_len, out_len, scale, ctm)
    shape = [1] * x.ndim
    shape[axis] = out_len
    frac = frac.reshape(shape)
    a, b = np.take(x, lo, axis=axis).astype(np.float64), np.take(x, hi, axis=axis)
    return a * (1 - frac) + b * frac


# --- constants and shape arithmetic (removed by constant folding) ---------------------------


def constant(*, value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, sparse_value=None, value_string=None, value_strings=None):
    if value is not None:
        return np.asarray(value)
    if value_float is not None:
        return np.asarray(value_float, dtype=np.float32)
    if value_floats is not None:
        return np.asarray(value_floats, dtype=np.float32)
    if value_int is not None:
        return np.asarray(value_int, dtype=np.int64)
    if value_ints is not None:
        return np.asarray(value_ints, dtype=np.int64)
    raise CompileError("Constant without a numeric value (sparse or string) is not supported")


def shape(x, *, start=0, end=None):
    return np.asarray(x.shape[start:end], dtype=np.int64)


def gather(data, indices, *, axis=0):
    axis = _axis(axis, data.ndim)
    return np.take(data, gather_index(indices, data.shape[axis]), axis=axis)


def one_hot(indices, depth, values, *, axis=-1):
    """ONNX OneHot: `values[1]` where the new axis's position equals the index (negative ones
    counted from `depth`), `values[0]` elsewhere; an index outside [-depth, depth) is all off."""
    depth = int(np.asarray(depth).reshape(-1)[0])
    index = np.asarray(indices).astype(np.int64)
    index = np.where(index < 0, index + depth, index)
    axis = _axis(axis, index.ndim + 1)
    classes = np.arange(depth).reshape([-1 if a == axis else 1 for a in range(index.ndim + 1)])
    off, on = np.asarray(values).reshape(-1)[:2]
    return np.where(np.expand_dims(index, axis) == classes, on, off).astype(values.dtype)


def cast(x, *, to, saturate=1, round_mode="up"):
    from onnx.helper import tensor_dtype_to_np_dtype
    return x.astype(tensor_dtype_to_np_dtype(to))


def constant_of_shape(shape_, *, value=None):
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    shape = tuple(int(d) for d in shape_)
    _check_size(shape, fill.dtype)
    return np.full(shape, fill[0], dtype=fill.dtype)


def _check_size(shape, dtype) -> None:
    """Refuse, before allocating it, an output whose shape a parameter made too large."""
    why = oversize(shape, dtype)
    if why is not None:
        raise CompileError(f"output too large: {why}")
