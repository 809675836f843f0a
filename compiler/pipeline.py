"""The compiler's plan, in order: each step is a named pass, and each says why it is there."""

from __future__ import annotations

from typing import Callable

from compiler.graph.ir import Graph, verify
from compiler.passes.eliminate_common import eliminate_common
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_batchnorm import fold_batchnorm
from compiler.passes.fold_constants import fold_constants
from compiler.passes.remove_identity import remove_identity

Pass = Callable[[Graph], Graph]

GRAPH_PASSES: list[Pass] = [
    remove_identity,   # first: Identity/Dropout hide producer-consumer pairs from every rewrite
    fold_constants,    # before BN folding, which needs constant parameters; folds Shape chains
    fold_batchnorm,    # Conv/Gemm + BN → one Conv/Gemm: BN costs nothing on the accelerator
    eliminate_common,  # after folding, equal constant-fed nodes are now visible as equal
    eliminate_dead,    # last: earlier passes leave unread constants and nodes behind
]


def optimize(graph: Graph, passes: list[Pass] | None = None, check: bool = False) -> Graph:
    """Apply the fp32 graph passes in order; with `check`, verify the graph after each."""
    for graph_pass in GRAPH_PASSES if passes is None else passes:
        graph = graph_pass(graph)
        if check:
            verify(graph)
    return graph
