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

A node whose input is int16 too (`QuantOptions.int16_tensors`) is refused: its accumulator
holds about 33 - log2(sum |w| / max |w|) bits of product between the two operands, so both
widened would each get fewer bits than either widened alone, in four passes (shifts 15, 8, 7
and 0) and with the two widths chosen jointly; widening one of them is the choice offered.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping

import numpy as np

from compiler.graph.int8 import Weight
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, Lower
from quantizer.errors import QuantizeError, QuantizeWarning
from simulator import numerics
from simulator.errors import listing
from simulator.numerics import RANGES

# Fewer bits would buy less than the two passes cost: int8's 8 bits and one more.
MIN_WEIGHT_BITS = 9
_ARRAY = (Lower.CONV, Lower.GEMM, Lower.MATMUL)


def weight_nodes(graph: Graph, names, keep: set[str], dtype_of: Callable[[str], str]
                 ) -> set[str]:
    """The nodes `names` checked: each a Conv, Gemm (not transA) or MatMul of an activation
    by a constant weight (input 1), not kept in fp32, its input 8-bit (`dtype_of` an fp32
    activation: its integer type). Raises QuantizeError naming the first that is not."""
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
        x = node.inputs[0]
        if dtype_of(x) == "int16":
            raise QuantizeError(f"{where}: its input {x!r} is int16 too; both widened would "
                                f"share the int32 accumulator's bits (four passes, each "
                                f"operand narrower than widened alone): choose --int16 {x} "
                                f"or --int16-weights {name}")
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


def weight_bits(node: Node, attrs: Mapping[str, Any], code_range: tuple[int, int], zero: int,
                candidate: Callable[[int], tuple[np.ndarray, np.ndarray | None]]) -> int:
    """The most bits b (at most `numerics.WIDE_WEIGHT_BITS`) of node's int16 weight codes such
    that no accumulator leaves int32 for any input: `candidate(b)` gives the b-bit weight
    codes and the int32 bias codes (zero point folded, bias correction applied) the quantizer
    would make. Warns (QuantizeWarning) below the most; raises QuantizeError naming the node
    below MIN_WEIGHT_BITS."""
    weight = OPS[node.op].weight
    low_limit, high_limit = RANGES["int32"]

    def fits(bits: int) -> bool:
        codes, bias = candidate(bits)
        low, high = accumulator_extremes(weight, attrs, codes, code_range, zero, bias)
        return low.min(initial=0) >= low_limit and high.max(initial=0) <= high_limit

    bits = next((b for b in range(numerics.WIDE_WEIGHT_BITS, 1, -1) if fits(b)), 1)
    if bits < MIN_WEIGHT_BITS:
        raise QuantizeError(f"int16 weights of node {node.name!r} ({node.op}): its int32 "
                            f"accumulators hold only {bits}-bit weight codes for every input "
                            f"(at least {MIN_WEIGHT_BITS} make int16 weights worth their "
                            f"second pass)")
    if bits < numerics.WIDE_WEIGHT_BITS:
        warnings.warn(QuantizeWarning(
            f"int16 weights of node {node.name!r} ({node.op}): {bits}-bit codes, so that its "
            f"int32 accumulators cannot overflow"), stacklevel=3)
    return bits
