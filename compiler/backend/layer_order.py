"""Layer order: of the orders that respect the dependencies, one that keeps little activation
memory live at a time (Glow's ChildMemSizeBasedScheduler, `lib/Optimizer/GraphOptimizer/`
`ChildMemSizeBasedScheduler.cpp`).

The graph's node order is one valid order, but an importer's: it may start a second branch before
the first one ends, keeping both branches' large intermediates alive together. Here the layers are
ordered depth first from the outputs: before a layer, the layers producing its inputs, the operand
whose subgraph needs the most memory first, so each branch finishes (and its intermediates die)
before the next starts, and what a branch leaves behind is only its result. Both orders go through
the DRAM planner (`compiler.backend.memory.plan_dram`) and the one with the smaller arena wins, the
graph's own on a tie: the pass never makes the plan worse, and it is deterministic (a function of
the layers alone).
"""

from __future__ import annotations

import dataclasses

from compiler.backend.layers import HostLayer, Lowered
from compiler.backend.memory import plan_dram, reads, writes

_NO_LIMIT = 1 << 62


def _dependencies(lowered: Lowered) -> list[list[int]]:
    """Per layer, the layers it must follow: every writer of a tensor it reads (a Concat's
    buffer has several), and the host segment before it if it is one (kept in their order)."""
    writers: dict[str, list[int]] = {}
    for i, layer in enumerate(lowered.layers):
        for tensor in writes(layer):
            writers.setdefault(tensor, []).append(i)
    deps = [sorted({j for t in reads(layer) for j in writers.get(t, ()) if j != i})
            for i, layer in enumerate(lowered.layers)]
    hosts = [i for i, layer in enumerate(lowered.layers) if isinstance(layer, HostLayer)]
    for before, after in zip(hosts, hosts[1:]):
        deps[after] = sorted(set(deps[after]) | {before})
    return deps


def depth_first(lowered: Lowered) -> list[int]:
    """Layer indices in post order from the outputs, the hungriest operand first."""
    layers, tensors = lowered.layers, lowered.tensors
    deps = _dependencies(lowered)
    # need[i]: the most bytes layer i's subgraph holds at once, estimated as the largest
    # working set (inputs and outputs of one layer) in it.
    need: list[int] = []
    for i, layer in enumerate(layers):  # the graph's order is topological: deps come first
        own = sum(tensors[t].size_bytes for t in (*reads(layer), *writes(layer)) if t in tensors)
        need.append(max([own] + [need[j] for j in deps[i]]))
    used = {j for d in deps for j in d}
    sinks = sorted((i for i in range(len(layers)) if i not in used), key=lambda i: (-need[i], i))
    order: list[int] = []
    done: set[int] = set()
    for sink in sinks:
        stack = [(sink, False)]
        while stack:
            i, expanded = stack.pop()
            if i in done:
                continue
            if expanded:
                done.add(i)
                order.append(i)
                continue
            stack.append((i, True))
            # Pushed in reverse, so the operand that needs the most memory is visited first.
            for j in sorted(deps[i], key=lambda j: (-need[j], j), reverse=True):
                if j not in done:
                    stack.append((j, False))
    return order


def _peak(lowered: Lowered) -> tuple[int, int]:
    plan = plan_dram(lowered, 0, _NO_LIMIT, lowered.graph)
    return plan.peak_bytes, plan.lower_bound_bytes


def order_for_memory(lowered: Lowered) -> Lowered:
    """The layers in the order (the graph's, or depth first) whose DRAM arena is smaller."""
    order = depth_first(lowered)
    if order == list(range(len(lowered.layers))):
        return lowered
    candidate = dataclasses.replace(lowered, layers=tuple(lowered.layers[i] for i in order))
    return candidate if _peak(candidate) < _peak(lowered) else lowered
