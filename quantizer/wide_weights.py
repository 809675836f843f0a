"""int16 weights on the array: the Conv, Gemm and MatMul nodes `QuantOptions.int16_weights`
names, checked, and the bits their weight codes may take.

Measured on pretrained models, int8 per-channel weights alone cap a model's output SQNR near
20 dB (EfficientNet-Lite0: 19.6 dB with fp32 activations), and a handful of layers cost most of
it; raising activations to int16 does not help. Such a layer's constant weight is quantized
symmetric to b bits (b <= 15) and stored int16: the array runs each weight tile as two passes of
int8 parts, w = (w >> 7) 2^7 + (w & 127) (`numerics.split_weight`, COMPUTE shift=7 for the
high part), into the same int32 accumulator rows. That sum is exact only while the true
accumulator, sum (x - z) w + bias over a channel's K terms, stays inside int32 for every input
code x (the zero point z folded into the bias; a padded tap is x = z): `weight_bits` takes the
most bits for which it does, computed from the very codes and int32 biases the quantizer makes
(the weight scale's floor and bias correction included), not from a bound.

A node whose input is int16 too (`QuantOptions.int16_tensors`: a model input such as an image
a stem Conv reads, or a b_x-bit tensor) runs four passes per weight tile, one per input plane
and weight part (`numerics.wide_passes`: shifts 15, 7, 8 and 0, in that order each tap), and
the two operands share the accumulator's bits: about b_x + b_w <= 33 - log2(sum |w| / max |w|).
The widths are chosen jointly (`input_bits`): a model input keeps all 16 bits (the host
quantizes it so); any other int16 tensor and its readers' weights get bits as equal as the
accumulator allows, an odd bit to the weights (measured best on EfficientNet-Lite0's stem); each
weight then takes the most bits left against the tensor's (`weight_bits`).

Why the four passes are exact, and no partial sum overflows. Each pass adds to the int32
accumulator, modulo 2^32, one of the terms 2^15 x_h w_h, 2^7 x_l w_h, 2^8 x_h w_l, x_l w_l of
each product x w (x = 2^8 x_h + x_l, x_l in [0, 255]; w = 2^7 w_h + w_l, w_l in [0, 127]); the
bias is added once more by REQUANT. Whatever the order (taps, K slices, the plan's fused chains,
BLAS's blocking), every partial sum the machine or the reference forms is a sum of a subset of
those terms and the bias, so its magnitude is at most sum_k P(x_k) P(w_k) + |bias|, where P is
`numerics.pass_magnitude` (|high| 2^s + low: the four terms' magnitudes of one product sum to
P(x) P(w) exactly). `weight_bits` takes b_w such that, with A = max P(x) over the input's codes
(2^(b_x - 1) + 255 for b_x-bit codes), A sum_k P(w_k) + |bias| <= 2^31 - 1 for every output
channel: then no partial sum ever leaves int32, and since |x| <= P(x) and |w| <= P(w) neither does
the true sum, which the accumulator therefore holds exactly. (The int16 input's zero point is 0,
so the bias carries no folded term, and a padded tap is a code of 0.) The bound is a little
stricter than the true sum's extremes (P(w) exceeds |w| by twice the low part for a negative w):
the price of an order the compiler and the machine may change freely.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import Any, Callable, Mapping

import numpy as np

from compiler.graph.int8 import Weight
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, Lower
from quantizer.calibrate import weight_scales
from quantizer.errors import QuantizeError, QuantizeWarning
from quantizer.requant import BIAS_CODE_LIMIT
from quantizer.wide import MIN_ARRAY_BITS
from simulator import numerics
from simulator.errors import listing
from simulator.numerics import RANGES

# Fewer bits would buy less than the two passes cost: int8's 8 bits and one more.
MIN_WEIGHT_BITS = 9
_ARRAY = (Lower.CONV, Lower.GEMM, Lower.MATMUL)


def weight_nodes(graph: Graph, names, keep: set[str]) -> set[str]:
    """The nodes `names` checked: each a Conv, Gemm (not transA) or MatMul of an activation
    by a constant weight (input 1), not kept in fp32 (its input 8-bit or int16). Raises
    QuantizeError naming the first that is not."""
    nodes = {node.name: node for node in graph.nodes}
    unknown = [name for name in names if name not in nodes]
    if unknown:
        linear = [node.name for node in graph.nodes if OPS[node.op].lower in _ARRAY]
        raise QuantizeError(f"--int16-weights {listing(unknown, quote=True)}: no such node in "
                            f"graph {graph.name!r} after the fp32 passes; its Conv, Gemm and "
                            f"MatMul nodes: {listing(linear)}")
    for name in names:
        node = nodes[name]
        where = f"int16 weights of node {name!r} ({node.op})"
        if name in keep:
            raise QuantizeError(f"{where}: the node is kept in fp32 (--keep-fp32); drop one "
                                f"of the two")
        weight = node.inputs[1] if len(node.inputs) > 1 else ""
        if OPS[node.op].lower not in _ARRAY or not weight or \
                not graph.values[weight].is_const or node.attrs.get("transA", 0) or \
                graph.values[node.inputs[0]].is_const:
            raise QuantizeError(f"{where}: only a Conv, Gemm or MatMul of an activation by a "
                                f"constant weight (its second input) has int16 weights")
    return set(names)


def accumulator_extremes(weight: Weight, attrs: Mapping[str, Any], codes: np.ndarray,
                         code_range: tuple[int, int], zero: int, bias: np.ndarray | None
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The least and the greatest true accumulator of each output, sum (x - z) w + bias over
    every input code x in `code_range` (the input's zero point z folded into the int32 bias,
    so the array sums raw codes times the weight `codes`, and the bias holds -z sum w):
    each term's extreme is (lo - z) w or (hi - z) w, whichever is further that way, and a
    padded tap's 0 lies between them. Exact in int64, shaped like the bias."""
    lo, hi = (int(c) - int(zero) for c in code_range)
    w = np.asarray(codes, np.int64)
    low = weight.b_sum(np.minimum(lo * w, hi * w), attrs)
    high = weight.b_sum(np.maximum(lo * w, hi * w), attrs)
    if bias is not None:
        bias = np.asarray(bias, np.int64)
        low, high = low + bias, high + bias
    return low, high


def pass_bound(weight: Weight, attrs: Mapping[str, Any], codes: np.ndarray,
               code_range: tuple[int, int], bias: np.ndarray | None) -> np.ndarray:
    """The bound on every partial sum of an int16 input's and int16 weights' four passes
    (module docstring), per output: A sum_k P(w_k) + |bias|, A the largest
    `numerics.pass_magnitude` of the input's codes in `code_range` (zero point 0). Exact in
    int64, shaped like the bias."""
    return _pass_bound(largest_pass_magnitude(*code_range), _pass_sums(weight, attrs, codes),
                       bias)


def _pass_bound(largest: int, sums: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    bound = largest * sums
    return bound if bias is None else bound + np.abs(np.asarray(bias, np.int64))


@functools.lru_cache(maxsize=64)
def largest_pass_magnitude(lo: int, hi: int) -> int:
    """A: the largest `numerics.pass_magnitude` of an input code in [lo, hi]."""
    return int(numerics.pass_magnitude(np.arange(lo, hi + 1), weights=False).max())


def _pass_sums(weight: Weight, attrs: Mapping[str, Any], codes: np.ndarray) -> np.ndarray:
    """sum_k P(w_k) per output, over the codes' K terms."""
    return weight.b_sum(numerics.pass_magnitude(codes, weights=True), attrs)


def weight_bits(node: Node, attrs: Mapping[str, Any], code_range: tuple[int, int], zero: int,
                candidate: Callable[[int], tuple[np.ndarray, np.ndarray | None]],
                wide_input: bool = False, allowed: Callable[[int], bool] = lambda bits: True
                ) -> int:
    """The most bits b (at most `numerics.WIDE_WEIGHT_BITS`) of node's int16 weight codes such
    that no accumulator leaves int32 for any input: `candidate(b)` gives the b-bit weight
    codes and the int32 bias codes (zero point folded, bias correction applied) the quantizer
    would make. Against an int16 input (`wide_input`, its codes in `code_range`, zero point 0)
    no partial sum of the four passes may either (`pass_bound`); and `allowed(b)` (the
    quantizer's: more bits floor no channel's scale that fewer would not). Warns
    (QuantizeWarning) below the most; raises QuantizeError naming the node below
    MIN_WEIGHT_BITS."""
    weight = OPS[node.op].weight
    low_limit, high_limit = RANGES["int32"]

    def fits(bits: int) -> bool:
        if not allowed(bits):
            return False
        codes, bias = candidate(bits)
        if wide_input:
            return pass_bound(weight, attrs, codes, code_range, bias).max(initial=0) <= \
                high_limit
        low, high = accumulator_extremes(weight, attrs, codes, code_range, zero, bias)
        return low.min(initial=0) >= low_limit and high.max(initial=0) <= high_limit

    against = f" against its {code_range[1].bit_length() + 1}-bit int16 input" \
        if wide_input else ""
    bits = _most_bits(fits)
    if bits < MIN_WEIGHT_BITS:
        raise QuantizeError(f"int16 weights of node {node.name!r} ({node.op}): its int32 "
                            f"accumulators hold only {bits}-bit weight codes{against} for "
                            f"every input (at least {MIN_WEIGHT_BITS} make int16 weights worth "
                            f"their second pass)")
    if bits < numerics.WIDE_WEIGHT_BITS:
        warnings.warn(QuantizeWarning(
            f"int16 weights of node {node.name!r} ({node.op}): {bits}-bit codes{against}, so "
            f"that its int32 accumulators cannot overflow"), stacklevel=3)
    return bits


def input_bits(graph: Graph, name: str, readers: list[Node], most: int, amax: float,
               per_channel: bool, power2: bool, fixed: bool = False) -> int:
    """The bits b_x of int16 tensor `name`, of real range [-amax, amax], chosen jointly with
    the bits b_w its readers with int16 weights (`readers`) then have: b_x at most `most`
    (what its other readers allow) and at least MIN_ARRAY_BITS, b_w at least MIN_WEIGHT_BITS,
    the two as equal as the accumulator allows, an odd bit to the weights: the greatest
    (min(b_x, b_w), b_w). The weights' bits for each b_x are estimated here from the fp32
    weights at the quantizer's scales by `pass_bound` (bias codes clipped at BIAS_CODE_LIMIT,
    beyond which its floors leave a bias at most half the products' room; no bias
    correction), and decided exactly by `weight_bits`. On
    EfficientNet-Lite0's stem this rule's (14, 15) made the stem's output 68.7 dB against fp32
    where (15, 14) made 64.6 and (16, 13), all to the input, 61.5. `fixed` (a model input,
    which the host quantizes to all 16 bits): `most`, whatever it leaves the weights. Raises
    QuantizeError naming the tensor and its readers when no pair reaches both minimums."""
    if fixed or not readers:
        return most
    best = None
    for bits in range(most, MIN_ARRAY_BITS - 1, -1):
        left = min(_weight_bits_left(graph, node, amax, bits, per_channel, power2)
                   for node in readers)
        if left >= MIN_WEIGHT_BITS and (best is None or (min(bits, left), left) >
                                        (min(best[0], best[1]), best[1])):
            best = (bits, left)
        if left == numerics.WIDE_WEIGHT_BITS:  # fewer input bits leave the weights no more
            break
    if best is None:
        raise QuantizeError(f"int16 tensor {name!r} and the int16 weights of "
                            f"{listing([node.name for node in readers], quote=True)}: their "
                            f"int32 accumulators hold fewer than {MIN_ARRAY_BITS} bits of input "
                            f"codes times {MIN_WEIGHT_BITS} of weight codes; widen only one of "
                            f"the two")
    return best[0]


def _weight_bits_left(graph: Graph, node: Node, amax: float, x_bits: int, per_channel: bool,
                      power2: bool) -> int:
    """The most weight bits (<= WIDE_WEIGHT_BITS) `pass_bound` allows node against x_bits-bit
    input codes of range [-amax, amax], from its fp32 weights and bias; 1 if none."""
    row = OPS[node.op]
    attrs = row.bind(node.name, node.attrs)
    w = np.asarray(graph.values[node.inputs[1]].const, np.float64)
    axis = row.weight.out_axis(w.ndim, attrs) if per_channel else None
    real_bias = None
    if len(node.inputs) > 2 and node.inputs[2]:
        real_bias = np.asarray(graph.values[node.inputs[2]].const, np.float64) * \
            float(attrs.get("beta", 1.0))
    x_scale = amax / ((1 << (x_bits - 1)) - 1) if amax > 0 else 1.0
    code_range = (-(1 << (x_bits - 1)), (1 << (x_bits - 1)) - 1)
    cache = _CACHE.setdefault(graph, {})

    def fits(bits: int) -> bool:
        key = (node.name, bits, axis, power2)
        if key not in cache:  # the same codes for every input width tried
            qmax = (1 << (bits - 1)) - 1
            scales = np.asarray(weight_scales(w, axis, power2, qmax))
            codes = numerics.quantize(w, scales, 0, -qmax, qmax, axis=axis,
                                      arithmetic=np.float64, dtype="int16")
            cache[key] = (scales, _pass_sums(row.weight, attrs, codes))
        scales, sums = cache[key]
        # A bias code past BIAS_CODE_LIMIT gets at most half the room the products leave
        # (`quantize._bias_room`): the bound fits whenever it fits with the code clipped there.
        bias = None if real_bias is None else np.minimum(BIAS_CODE_LIMIT, np.abs(
            np.rint(real_bias / (float(attrs.get("alpha", 1.0)) * x_scale * scales))))
        return _pass_bound(largest_pass_magnitude(*code_range), sums, bias).max(initial=0) \
            <= RANGES["int32"][1]

    return _most_bits(fits)


def _most_bits(fits: Callable[[int], bool]) -> int:
    """The most weight bits b <= WIDE_WEIGHT_BITS with fits(b), 1 if none: more bits make
    larger weight codes (and bias codes), so the sums grow with them, and bisection finds it
    in four tries instead of up to fourteen."""
    low, high = 1, numerics.WIDE_WEIGHT_BITS + 1  # fits(low) or low == 1; not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


# Per graph (the budget quantizes one graph hundreds of times, and `input_bits` tries each
# input width against the same weights): each node's weight codes at each width.
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
