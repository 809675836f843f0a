"""Helpers for the quantizer tests: profiles built from fp32 `evaluate`, tiny models."""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import onnx

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.graph.ir import Graph
from profiler.accumulate import Accumulator
from profiler.fingerprint import fingerprint
from profiler.format import Profile
from profiler.histogram import Binner


def profile_of(model: onnx.ModelProto, samples: Iterable[Mapping[str, np.ndarray]],
               graph: Graph | None = None) -> Profile:
    """The profile the profiler would record: every float input and node output, through the
    profiler's own accumulators, from the fp32 reference interpreter on the imported graph."""
    graph = graph if graph is not None else import_model(model)
    accumulators: dict[str, Accumulator] = {}
    binner = Binner()
    count = 0
    # As the profiler: a LayerNorm output's range per channel too (`profiler.session`).
    channels = {node.outputs[0] for node in graph.nodes if node.op == "LayerNormalization"}
    for feeds in samples:
        count += 1
        env = evaluate(graph, feeds, keep_all=True)
        for name, value in env.items():
            if graph.values[name].is_const or np.asarray(value).dtype.kind != "f":
                continue
            kind = "input" if name in graph.inputs else "activation"
            # A value a pass made in place of one that is gone (an Expand sunk past it) is
            # also the ONNX value's, which the profiler records.
            origin = graph.origin.get(name, name)
            for key in {name, origin if origin not in graph.values else name}:
                if key not in accumulators:
                    accumulators[key] = Accumulator(kind, "float32", binner,
                                                    channels=name in channels)
                accumulators[key].add(np.asarray(value))
    return Profile(fingerprint(model), "test", count, (),
                   {name: acc.stats() for name, acc in accumulators.items()})
