"""Compiled programs on the simulator: cycles against the roofline bound, per model and preset,
with double buffering on and off, and how long compiling takes.

Each model is profiled with onnxruntime on a few seeded random samples (the digits model on its
calibration set), quantized with the default options and compiled; the program then runs once on
the simulator, and its int8 outputs are checked against the integer reference (`run_int8`) bit
for bit. Prints one row per (model, preset, double buffering): compile seconds, instructions,
simulated cycles, the roofline bound max(MACs / array size, compulsory DRAM bytes / DMA
bandwidth), the fraction of the bound achieved, and whether the outputs were bit-exact.

    .venv/bin/python benchmarks/bench_compile.py [--models digits,resnet18,mobilenetv2]
                                                 [--presets default,large,edge]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnx

from compiler.backend import BackendOptions
from compiler.frontend.onnx import import_model
from compiler.pipeline import compile_int8, optimize
from profiler.arrays import RandomData
from profiler.images import ImageOptions
from profiler.inputs import input_specs
from examples.build import zoo_model_path
from profiler.run import RunOptions, profile
from profiler.sources import open_data
from quantizer.quantize import quantize
from quantizer.reference import run_int8
from simulator import machine
from simulator.arch import Arch

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"digits": ROOT / "examples" / "digits" / "model.onnx",
          **{name: zoo_model_path(name) for name in ("mlp", "resnet18", "mobilenetv2")}}


def quantized(name: str):
    """The int8 graph (profiled by onnxruntime) and one float sample to run."""
    proto = onnx.load(MODELS[name])
    specs = input_specs(proto, {})
    if name == "digits":
        source = open_data(str(ROOT / "examples" / "digits" / "calib.npz"), specs,
                           ImageOptions())
    else:
        source = RandomData(4, specs, 0)
    prof = profile(proto, source, specs, RunOptions())
    rng = np.random.default_rng(1)
    sample = {s.name: rng.standard_normal(s.shape).astype(np.float32) for s in specs}
    return quantize(optimize(import_model(proto)), prof), sample


def run(name: str, preset: str, double_buffer: bool, qgraph, sample) -> dict:
    arch = Arch.load(preset)
    start = time.perf_counter()
    compiled = compile_int8(qgraph, arch, BackendOptions(double_buffer))
    seconds = time.perf_counter() - start
    program = compiled.program
    env = run_int8(qgraph, sample, keep_all=True)
    producers = {n.outputs[0]: n for n in qgraph.nodes}
    quantizers = {n.inputs[0]: n for n in qgraph.nodes if n.op == "QuantizeLinear"}
    result = machine.run(program, {b.name: env[quantizers[b.name].outputs[0]]
                                   for b in program.inputs})
    exact = all(np.array_equal(result.outputs[b.name], env[producers[b.name].inputs[0]])
                for b in program.outputs)
    stats = result.stats
    return {"model": name, "preset": preset, "double_buffer": double_buffer,
            "compile_s": seconds, "instructions": len(program.instructions),
            "cycles": stats.cycles, "bound": stats.bound_cycles,
            "of_bound": stats.bound_cycles / max(stats.cycles, 1), "bit_exact": exact}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,resnet18,mobilenetv2")
    parser.add_argument("--presets", default="default,large,edge")
    args = parser.parse_args()
    header = (f"{'model':<12} {'preset':<8} {'dbuf':<5} {'compile s':>9} {'insns':>8} "
              f"{'cycles':>12} {'bound':>12} {'bound/cyc':>9} {'exact':>6}")
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        qgraph, sample = quantized(name)
        for preset in args.presets.split(","):
            for double_buffer in (True, False):
                row = run(name, preset, double_buffer, qgraph, sample)
                print(f"{row['model']:<12} {row['preset']:<8} {str(row['double_buffer']):<5} "
                      f"{row['compile_s']:>9.2f} {row['instructions']:>8,} {row['cycles']:>12,} "
                      f"{row['bound']:>12,} {row['of_bound']:>9.0%} {str(row['bit_exact']):>6}",
                      flush=True)


if __name__ == "__main__":
    main()
