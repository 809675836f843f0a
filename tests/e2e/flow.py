"""The whole int8 flow for tests: profile → optimize → quantize → compile → simulate, and
the oracle (`run_int8`) beside it, compared bit for bit on the raw int8 outputs."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx

from compiler.backend.codegen.host import run_segment
from compiler.backend.program import BackendOptions, Compiled
from compiler.frontend.onnx import import_model
from compiler.graph.ir import Graph
from compiler.pipeline import compile_int8, optimize
from quantizer.options import QuantOptions
from quantizer.quantize import quantize
from quantizer.reference import run_int8
from simulator import machine
from simulator.arch import Arch
from tests.quantizer.util import profile_of


def samples(shapes: Mapping[str, Sequence[int]], count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(shape).astype(np.float32)
             for name, shape in shapes.items()} for _ in range(count)]


def quantized(proto: onnx.ModelProto, calibration: list[dict],
              options: QuantOptions = QuantOptions()) -> Graph:
    graph = optimize(import_model(proto))
    return quantize(graph, profile_of(proto, calibration, graph), options)


def check_bit_exact(qgraph: Graph, compiled: Compiled, feeds: list[dict]) -> machine.Result:
    """Run every sample on the simulator (host segments by `compiler.backend.codegen.host.run_segment`) from
    the oracle's own quantized inputs; the raw int8 outputs, and float32 ones the host
    computes, must be equal bit for bit. Returns the last run."""
    program = compiled.program
    result = None
    for sample in feeds:
        env = run_int8(qgraph, sample, keep_all=True)
        inputs = {}
        for b in program.inputs:
            if b.dtype == "float32":  # read by the host as it is
                inputs[b.name] = env[b.name]
                continue
            node = next(n for n in qgraph.nodes if n.op == "QuantizeLinear"
                        and n.inputs[0] == b.name)
            inputs[b.name] = env[node.outputs[0]]
        result = machine.run(program, inputs, host=run_segment)
        for b in program.outputs:
            node = next(n for n in qgraph.nodes if n.outputs[0] == b.name)
            expected = env[b.name] if b.dtype == "float32" else env[node.inputs[0]]
            got = np.ascontiguousarray(result.outputs[b.name])
            expected = np.ascontiguousarray(expected).reshape(got.shape)
            assert got.dtype == expected.dtype, (b.name, got.dtype, expected.dtype)
            if got.dtype.kind == "f":  # bit for bit: the bytes, so -0.0 and NaNs count too
                got, expected = got.view(np.uint8), expected.view(np.uint8)
            np.testing.assert_array_equal(got, expected,
                                          err_msg=f"output {b.name!r} differs from run_int8")
    return result


def compile_and_check(proto: onnx.ModelProto, preset: str, count: int = 2, seed: int = 0,
                      double_buffer: bool = True) -> tuple[Compiled, machine.Result]:
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in proto.graph.input}
    qgraph = quantized(proto, samples(shapes, 8, seed))
    compiled = compile_int8(qgraph, Arch.load(preset), BackendOptions(double_buffer))
    return compiled, check_bit_exact(qgraph, compiled, samples(shapes, count, seed + 1))
