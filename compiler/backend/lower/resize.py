"""Lowering Resize of H and W of an N x C x H x W map, nearest and linear, at any scale.

Along one axis, a Resize is a map from output positions to input positions: nearest takes one
input row (or column) per output row, the fp32 reference's own index arithmetic run on
coordinates; linear weighs two neighbours, lo and lo + 1, by 1 - frac and frac
(`compiler.graph.int8.linear_resize_taps`, which the int8 kernel reads too). The map is cut
into runs: outputs start, start + step, ... taking inputs source, source + source_step, ...
with the same weights. Each run is one layer over strided Views: an identity-table copy (LUT)
where one input is taken, the vector unit's ADD of the two neighbours' Views, weighed by its
input rescales, where two are. A whole factor f is f runs per axis (its phases); a fractional
p/q factor about p; an irregular map (align_corners, say) up to one run per output position.

Nearest copies both axes at once (a copy per pair of runs) when that is no more copies than
two passes; else, and always for linear (whose int8 kernel rounds after each axis), H goes
first into a tensor of the node's own, then W into the output (or its part of a Concat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from compiler.backend.layers import AddLayer, Layout, View, block_shape
from compiler.backend.lower.walk import Walk, unsupported
from compiler.graph import reference as ref
from compiler.graph.int8 import linear_resize_taps
from compiler.graph.ir import Node
from compiler.graph.ops import int8_attrs, run_fp32

_AXES = (2, 3)  # H and W; in a View's (N, H, W, C) block they are axes 1 and 2


@dataclass(frozen=True)
class Run:
    """Outputs start, start + step, ... (count of them) along one axis take inputs source,
    source + source_step, ...; with `rescales` (ADD's multipliers and shifts) each also
    takes the next input, weighed."""

    start: int
    step: int
    count: int
    source: int
    source_step: int
    rescales: tuple | None = None

    def outputs(self, view: View, axis: int) -> View:
        return view.sub(axis, self.start, self.count, self.step)

    def inputs(self, view: View, axis: int, tap: int = 0) -> View:
        return view.sub(axis, self.source + tap, self.count, self.source_step)


def runs(sources, keys) -> list[Run]:
    """Cover output positions 0..len(sources) with few runs: positions of one key (the same
    weights) whose sources advance evenly. Greedy, longest run first from each position in
    order, so a whole factor's runs are its phases in order. A run's sources strictly advance
    (a View cannot stay in place), unless it has one position."""
    found = []
    for key in dict.fromkeys(keys):
        left = [o for o, k in enumerate(keys) if k == key]
        while left:
            start, free = left[0], set(left)
            best = [start]
            for nxt in left[1:]:
                step, source_step = nxt - start, sources[nxt] - sources[start]
                if source_step < 1:
                    continue
                run = [start]
                while run[-1] + step in free and \
                        sources[run[-1] + step] - sources[run[-1]] == source_step:
                    run.append(run[-1] + step)
                if len(run) > len(best):
                    best = run
            step = best[1] - best[0] if len(best) > 1 else 1
            source_step = sources[best[1]] - sources[best[0]] if len(best) > 1 else 1
            found.append(Run(start, step, len(best), int(sources[start]), int(source_step),
                             key))
            taken = set(best)
            left = [o for o in left if o not in taken]
    return found


def lower_resize(lw: Walk, node: Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    shape, out_shape = lw.shape(x), lw.shape(y)
    if len(shape) != 4 or shape[:2] != out_shape[:2]:
        raise unsupported(node, f"it resizes {list(shape)} to {list(out_shape)}; only H and W "
                                f"of an N x C x H x W map lower")
    attrs = int8_attrs(node)
    if attrs["mode"] == "nearest":  # copies, each plane of an int16 value (`Walk.copy_view`)
        lower_index_map(lw, node, evenly)
        return
    if lw.g.type_of(x).dtype == "int16":
        raise unsupported(node, "a linear Resize of int16 codes (its ADDs weigh int8 codes "
                                "over Views)")
    roi, scales, sizes = ([lw.g.values[n].const if n else None for n in node.inputs[1:]]
                          + [None] * 3)[:3]
    source, target = _ends(lw, node)
    if tuple(out_shape) == tuple(shape):  # the kernel returns its input, whatever scales
        _copy(lw, node, source, target, ())
        return
    _, scales = ref.resize_scales(shape, scales, sizes, attrs["axes"],
                                  attrs["keep_aspect_ratio_policy"])
    rows, cols = (_linear_runs(shape[axis], out_shape[axis], scales[axis],
                               attrs["coordinate_transformation_mode"]) for axis in _AXES)
    _two_passes(lw, node, source, target, rows, cols)


def lower_index_map(lw: Walk, node: Node, cut: Callable[[np.ndarray], list[Run]]) -> None:
    """A node whose every output row and column is a copy of an input one (a nearest Resize;
    an edge, reflect or wrap Pad of H and W): which one is the fp32 reference run on
    coordinates, cut into runs by `cut`. Both axes at once when that is no more copies than
    two passes."""
    shape = lw.shape(node.inputs[0])
    consts = [lw.g.values[n].const if n else None for n in node.inputs[1:]]
    rows, cols = (cut(_sources(node, shape, consts, axis)) for axis in _AXES)
    source, target = _ends(lw, node)
    if len(rows) * len(cols) <= len(rows) + len(cols):
        for row in rows:
            for col in cols:
                _copy(lw, node, source, target, ((1, row), (2, col)))
        return
    _two_passes(lw, node, source, target, rows, cols)


def _ends(lw: Walk, node: Node):
    """The input's (tensor, View) and the output's, the output placed (in its Concat's part)."""
    x, y = node.inputs[0], node.outputs[0]
    x_view = lw.need_view(node, x)
    buffer, y_view = lw.place(y)
    lw.alias(y, buffer, y_view)
    return (lw.source(node, x), x_view), (buffer, y_view)


def _two_passes(lw: Walk, node: Node, source, target, rows, cols) -> None:
    """H (when `rows`) into a tensor of the node's own, then W (when `cols`) into `target`."""
    shape, out_shape = lw.shape(node.inputs[0]), lw.shape(node.outputs[0])
    passes = [(axis, axis_runs) for axis, axis_runs in ((1, rows), (2, cols)) if axis_runs]
    if not passes:
        _copy(lw, node, source, target, ())
    for i, (axis, axis_runs) in enumerate(passes):
        step_target = target
        if i < len(passes) - 1:  # H resized into a tensor of the node's own, W not yet
            middle_shape = (*shape[:2], out_shape[2], shape[3])
            step_target = (f"{node.name}/rows", View.dense(block_shape(middle_shape)))
            lw.scratch(step_target[0], step_target[1].size, Layout.channels_last(middle_shape),
                       source[0] in lw.planes)
        _resize_axis(lw, node, source, step_target, axis, axis_runs)
        source = step_target


def evenly(sources: np.ndarray) -> list[Run]:
    """A nearest map's runs: outputs whose inputs advance evenly (a whole factor's phases)."""
    return runs(sources, [None] * len(sources))


def border_runs(sources: np.ndarray) -> list[Run]:
    """A Pad's runs: its longest stretch of consecutive inputs (the map itself, or what a crop
    keeps of it) as one run, every border position as a run of its own (borders are a few
    pixels wide; an edge border repeats one input, a reflected one walks back)."""
    best, start = (0, 1), 0
    for o in range(1, len(sources) + 1):
        if o == len(sources) or sources[o] != sources[o - 1] + 1:
            if o - start > best[1] - best[0]:
                best = (start, o)
            start = o
    lo, hi = best
    found = [Run(lo, 1, hi - lo, int(sources[lo]), 1)]
    return found + [Run(o, 1, 1, int(sources[o]), 1) for o in range(len(sources))
                    if not lo <= o < hi]


def _sources(node: Node, shape, consts, axis: int) -> np.ndarray:
    """The input row (axis 2) or column (3) each output row or column copies, from the fp32
    reference run on coordinates."""
    grid = np.broadcast_to(np.arange(shape[axis], dtype=np.float32).reshape(
        [-1 if a == axis else 1 for a in range(4)]), shape)
    picked = run_fp32(node, [grid, *consts])[0]
    return picked[tuple(slice(None) if a == axis else 0 for a in range(4))].astype(np.int64)


def _linear_runs(in_len: int, out_len: int, scale, ctm: str) -> list[Run] | None:
    """The runs of one axis's linear taps, or None when the int8 kernel leaves it as it is."""
    if out_len == in_len and scale == 1:
        return None
    taps = linear_resize_taps(in_len, out_len, scale, ctm)
    return runs([lo for lo, _, _ in taps], [rescales for _, _, rescales in taps])


def _resize_axis(lw: Walk, node: Node, source, target, axis: int, axis_runs) -> None:
    """One layer per run along block axis `axis` (1: H, 2: W), the other axis whole."""
    (tensor, view), (out_tensor, out_view) = source, target
    for run in axis_runs:
        if run.rescales is None:
            _copy(lw, node, source, target, ((axis, run),))
            continue
        y = run.outputs(out_view, axis)
        multipliers, shifts = run.rescales
        lw.layers.append(AddLayer(node.name, tensor, tensor, out_tensor, y.size, 0, 0,
                                  tuple(multipliers), tuple(shifts), 0, (-128, 127),
                                  (run.inputs(view, axis), run.inputs(view, axis, tap=1), y)))


def _copy(lw: Walk, node: Node, source, target, axis_runs) -> None:
    """An identity LUT of the input rows or columns that runs, (block axis, Run) pairs, take
    into their outputs; axes without a run are copied whole."""
    (tensor, view), (out_tensor, out_view) = source, target
    for axis, run in axis_runs:
        view, out_view = run.inputs(view, axis), run.outputs(out_view, axis)
    lw.copy_view(node, tensor, view, out_tensor, out_view)
