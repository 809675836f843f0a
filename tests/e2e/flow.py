"""The whole int8 flow for tests: profile → `ember.flow` → simulate, and the oracle
(`run_int8`) beside it, compared bit for bit on the raw int8 outputs."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx

from compiler.backend.codegen.host import run_segment
from compiler.backend.program import BackendOptions, Compiled
from compiler.graph.ir import Graph
from ember.accuracy import BitExactness
from ember.flow import CompileOptions, compile_model, optimized_graph, quantize_model
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from compiler.graph.evaluate import evaluate
from simulator import isa, machine, numerics
from tests.quantizer.util import profile_of


def output_sqnr_db(graph: Graph, qgraph: Graph, feeds: Sequence[Mapping[str, np.ndarray]],
                   output: str) -> float:
    """SQNR in dB of the integer reference's `output` against the fp32 graph's, over `feeds`
    (the signal and the noise summed over all of them)."""
    from compiler.graph.evaluate import evaluate
    signal = noise = 0.0
    for sample in feeds:
        want = evaluate(graph, sample)[output].astype(np.float64)
        got = run_int8(qgraph, sample)[output].astype(np.float64)
        signal, noise = signal + (want ** 2).sum(), noise + ((want - got) ** 2).sum()
    return 10 * np.log10(signal / noise)


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
    """Run the samples as one batch on the simulator (host segments by
    `compiler.backend.codegen.host.run_segment`) from the oracle's own quantized inputs; the
    raw int8 outputs, and float32 ones the host computes, must be equal bit for bit. The last
    sample runs alone too, and must give what it gave in the batch. Returns that run."""
    exactness = BitExactness(compiled.program, qgraph, batch=len(feeds))
    envs = [run_int8(qgraph, sample, keep_all=True) for sample in feeds]
    for env in envs:
        exactness.add(env)
    exactness.flush()
    assert exactness.first_difference is None, \
        f"the simulator differs from run_int8: {exactness.first_difference}"
    alone = machine.run(compiled.program, exactness.program_inputs(envs[-1]), host=run_segment)
    for name, want in exactness.expected_outputs(envs[-1]).items():
        got = alone.outputs[name].reshape(want.shape)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), \
            f"output {name!r}: the last sample alone differs from its run in the batch"
    return alone


def model_samples(proto: onnx.ModelProto, count: int, seed: int = 0) -> list[dict]:
    """Samples for each of the model's inputs: normal(0, 1) floats; integers in [0, 10) (the
    profiler's random source's), all ones for an input named like a mask."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(count):
        sample = {}
        for value in proto.graph.input:
            shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            if dtype.kind == "f":
                sample[value.name] = rng.standard_normal(shape).astype(dtype)
            elif "mask" in value.name:
                sample[value.name] = np.ones(shape, dtype)
            else:
                sample[value.name] = rng.integers(0, 10, shape).astype(dtype)
        found.append(sample)
    return found


def compile_and_check(proto: onnx.ModelProto, preset: str, count: int = 2, seed: int = 0,
                      double_buffer: bool = True) -> tuple[Compiled, machine.Result]:
    profile = profile_of(proto, model_samples(proto, 8, seed), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(backend=BackendOptions(double_buffer)),
                          preset)
    return built.compiled, check_bit_exact(built.qgraph, built.compiled,
                                           model_samples(proto, count, seed + 1))


def value_sqnr_db(graph: Graph, qgraph: Graph, name: str, feeds: Sequence[Mapping],
                  stored: bool = True, coded: str | None = None) -> float:
    """SQNR against fp32 of value `name` over `feeds`: with `stored`, of fp32's own values
    quantized in its integer value's parameters (`coded`, or the same name) and back (what
    its type alone loses: rounding, and clipping outside the calibrated range); else of the
    integer reference's codes, dequantized (what the whole integer model before it loses
    too)."""
    value = qgraph.values[coded or name]
    params, dtype = value.type.quant, value.type.dtype
    signal = noise = 0.0
    for sample in feeds:
        want = evaluate(graph, sample, keep_all=True)[name].astype(np.float64)
        codes = numerics.quantize(want, params.scale[0], params.zero_point[0], dtype=dtype,
                                  arithmetic=np.float64) if stored else \
            run_int8(qgraph, sample, keep_all=True)[coded or name]
        got = numerics.dequantize(codes, params.scale[0], params.zero_point[0],
                                  arithmetic=np.float64)
        signal, noise = signal + (want ** 2).sum(), noise + ((want - got) ** 2).sum()
    return 10 * np.log10(signal / noise)


def compute_cycles(program, node: str) -> int:
    """The array cycles of node `node`'s COMPUTE instructions."""
    arch = program.arch
    return sum(isa.COMPUTE.cycles(arch, i) for i, source in
               zip(program.instructions, program.source) if i.op is isa.COMPUTE and source == node)


def assert_busy_is_own_cycles(program, node: str, unit: str, queue: str):
    """The simulator's busy time of `unit` for layer `node` is exactly the cycles of the
    layer's own instructions on `queue` (no stall or other layer's work counted in it).
    Returns the run (its stats, for further checks)."""
    result = machine.run(program, {b.name: np.zeros(b.shape, b.dtype) for b in program.inputs})
    busy = next(layer for layer in result.stats.layers if layer.name == node).busy
    own = sum(i.op.cycles(program.arch, i) for i, source in
              zip(program.instructions, program.source) if source == node and i.queue == queue)
    assert busy[unit] == own
    return result
