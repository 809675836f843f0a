"""Ranges for attention's additive mask, which calibration alone would make useless.

A transformer masks padding by adding a large negative number (exporters write -10000, -1e9 or
float32's lowest, -3.4e38) to the scores of masked keys before the Softmax. Calibrated as they
are, the mask's range and the sum's reach down to that number: one int8 step of the sum is then
far larger than every score, and every score rounds to the same code (onnxruntime's int8
attention collapses so). Yet the Softmax needs only that a masked score ends far enough below
its row's largest: at a gap of ln(256 n) for n keys the masked keys' weights add up to under
1/256 of the largest, less than one step of the int8 probabilities.

So for `Softmax(scores + mask)` whose mask reaches below every score's range by more than that
gap, the sum is quantized over the scores' range widened downwards by the gap, and the mask over
[-(span of the scores + gap), its top]: a masked key's sum saturates at the lowest code, at
least the gap below any row's largest score, and an unmasked one keeps the scores' resolution.
"""

from __future__ import annotations

import math
from typing import Callable

from compiler.graph.ir import Graph
from compiler.graph.ops import ADD, SOFTMAX

Range = tuple[float, float]


def additive_mask_ranges(graph: Graph, real_range: Callable[[str], Range]) -> dict[str, Range]:
    """The ranges to use instead of the calibrated ones, by value name: each masked Softmax's
    input and its mask (a mask read by several Softmaxes, one per layer, takes the widest)."""
    producers, users = graph.producers(), graph.users()
    ranges: dict[str, Range] = {}
    for node in graph.nodes:
        if node.op != SOFTMAX.name:
            continue
        x = node.inputs[0]
        add = producers.get(x)
        if add is None or add.op != ADD.name or len(users.get(x, [])) != 1 or x in graph.outputs \
                or any(graph.values[n].is_const for n in add.inputs):
            continue
        shape = graph.type_of(x).shape
        keys = shape[int(node.attrs.get("axis", -1)) % len(shape)]
        gap = math.log(256 * keys)
        for scores, mask in (add.inputs, add.inputs[::-1]):
            (s_lo, s_hi), (m_lo, m_hi) = real_range(scores), real_range(mask)
            if m_hi > 0 or m_lo > -(s_hi - s_lo) - 2 * gap:
                continue  # no mask: it does not reach far below every score
            reach = (s_hi - s_lo) + gap
            ranges[x] = (s_lo - gap, s_hi + m_hi)
            old = ranges.get(mask, (0.0, m_hi))
            ranges[mask] = (min(old[0], -reach), m_hi)
            break
    return ranges
