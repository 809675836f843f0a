"""Batched functional execution: how many samples per second the simulator runs a compiled
program at, in batches against one sample at a time, in the same run.

A program's timing does not depend on the data, so `simulator.machine.Machine` times it (and
checks its races) once and then runs batches of samples, every instruction once for the whole
batch, each sample's outputs bit for bit those of its own run. Per model: the program's
instructions, the batch `Machine.batch` picks, samples per second in those batches, in
batches of 1 (the same machine, one sample at a time), and by a full `machine.run` per sample
(timing and race check again for every sample: how a program was run over a data set before
batching), with the ratios. The first samples of each batched run are checked against their
runs alone, bit for bit.

The models: the digits CNN (the bundled example), ResNet-18 from the zoo (seeded weights) on
the default preset, and an unrolled LSTM (64 steps of 256 units, `examples.zoo.
lstm_classifier`) on the edge preset: over 500,000 small instructions. Each is profiled on 4
seeded random samples, quantized with the default options and compiled; the inputs are
seeded random int8 codes (the speed does not depend on them).

    .venv/bin/python benchmarks/bench_batch.py [--models digits,resnet18,lstm] [--samples N]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
import onnx

from compiler.backend.codegen.host import run_segment
from compiler.pipeline import compile_int8
from ember.flow import profile_model, quantize_model
from examples import zoo
from examples.build import zoo_model_path
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources.arrays import RandomData
from simulator import machine
from simulator.arch import Arch
from simulator.program import Program

ROOT = Path(__file__).resolve().parents[1]
MODELS = {  # name: (model, preset, samples)
    "digits": (lambda: onnx.load(ROOT / "examples" / "digits" / "model.onnx"), "default", 4096),
    "resnet18": (lambda: onnx.load(zoo_model_path("resnet18")), "default", 96),
    "lstm": (lambda: zoo.lstm_classifier(steps=64, features=32, hidden=256), "edge", 256),
}


def program_of(name: str) -> Program:
    make, preset, _ = MODELS[name]
    proto = make()
    specs = input_specs(proto, {})
    prof = profile_model(proto, RandomData(4, specs, 0), specs, RunOptions(batch=1))
    return compile_int8(quantize_model(proto, prof).qgraph, Arch.load(preset)).program


def codes(program: Program, count: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {b.name: rng.integers(-128, 128, (count, *b.shape)).astype(b.dtype)
            for b in program.inputs}


def per_second(ready: machine.Machine, inputs: dict[str, np.ndarray], batch: int) -> float:
    """Samples per second over all of `inputs`, `batch` at a time."""
    count = len(next(iter(inputs.values())))
    start = time.perf_counter()
    for first in range(0, count, batch):
        ready.outputs({k: v[first:first + batch] for k, v in inputs.items()}, first)
    return count / (time.perf_counter() - start)


def measure(name: str, samples: int | None) -> dict:
    program = program_of(name)
    count = samples or MODELS[name][2]
    inputs = codes(program, count, 1)
    start = time.perf_counter()
    ready = machine.Machine(program, host=run_segment)
    prepare = time.perf_counter() - start
    batch = ready.batch
    ready.outputs({k: v[:batch] for k, v in inputs.items()})  # warm: buffers, caches
    batched = per_second(ready, inputs, batch)
    single = per_second(ready, {k: v[:min(count, 16)] for k, v in inputs.items()}, 1)
    full = time.perf_counter()
    for n in range(2):
        machine.run(program, {k: v[n] for k, v in inputs.items()}, host=run_segment)
    full = (time.perf_counter() - full) / 2
    got = ready.outputs({k: v[:3] for k, v in inputs.items()})
    exact = all(np.array_equal(got[b.name][n], machine.run(
        program, {k: v[n] for k, v in inputs.items()}, host=run_segment).outputs[b.name])
        for n in range(3) for b in program.outputs)
    return {"model": name, "preset": program.arch.name,
            "instructions": len(program.instructions), "samples": count, "batch": batch,
            "prepare_s": prepare, "batched": batched, "single": single, "full_s": full,
            "exact": exact}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--samples", type=int, help="samples per model (default: its own)")
    args = parser.parse_args()
    print(f"{platform.node()}: {platform.processor() or platform.machine()}, "
          f"numpy {np.__version__}")
    header = ("| model | preset | instructions | samples | batch | time + check once (s) | "
              "batched samples/s | one at a time samples/s | full run per sample (s) | "
              "batched / one at a time | batched / full run | bit-identical |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name in args.models.split(","):
        r = measure(name, args.samples)
        print(f"| {r['model']} | {r['preset']} | {r['instructions']:,} | {r['samples']} | "
              f"{r['batch']} | {r['prepare_s']:.2f} | {r['batched']:,.1f} | "
              f"{r['single']:,.1f} | {r['full_s']:.3f} | {r['batched'] / r['single']:.1f}x | "
              f"{r['batched'] * r['full_s']:.1f}x | {'yes' if r['exact'] else 'NO'} |",
              flush=True)


if __name__ == "__main__":
    main()
