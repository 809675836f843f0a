"""The whole int8 flow for tests: profile → `ember.flow` → simulate, and the oracle
(`run_int8`) beside it, compared bit for bit on the raw int8 outputs."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx

from compiler.backend.program import BackendOptions, Compiled
from compiler.graph.ir import Graph
from ember.accuracy import BitExactness
from ember.flow import CompileOptions, compile_model, optimized_graph, quantize_model
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from simulator import machine
from tests.quantizer.util import profile_of


def samples(shapes: Mapping[str, Sequence[int]], count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(shape).astype(np.float32)
             for name, shape in shapes.items()} for _ in range(count)]


def quantized(proto: onnx.ModelProto, calibration: list[dict],
              options: QuantOptions = QuantOptions()) -> Graph:
    """The int8 graph, profiled on `calibration` by the fp32 interpreter."""
    profile = profile_of(proto, calibration, optimized_graph(proto))
    return quantize_model(proto, profile, options).qgraph


def check_bit_exact(qgraph: Graph, compiled: Compiled, feeds: list[dict]) -> machine.Result:
    """Run every sample on the simulator (host segments by `compiler.backend.codegen.host.run_segment`) from
    the oracle's own quantized inputs; the raw int8 outputs, and float32 ones the host
    computes, must be equal bit for bit. Returns the last run."""
    exactness = BitExactness(compiled.program, qgraph)
    result = None
    for sample in feeds:
        result = exactness.check(run_int8(qgraph, sample, keep_all=True))
        assert exactness.first_difference is None, \
            f"the simulator differs from run_int8: {exactness.first_difference}"
    return result


def compile_and_check(proto: onnx.ModelProto, preset: str, count: int = 2, seed: int = 0,
                      double_buffer: bool = True) -> tuple[Compiled, machine.Result]:
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in proto.graph.input}
    profile = profile_of(proto, samples(shapes, 8, seed), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(backend=BackendOptions(double_buffer)),
                          preset)
    return built.compiled, check_bit_exact(built.qgraph, built.compiled,
                                           samples(shapes, count, seed + 1))
