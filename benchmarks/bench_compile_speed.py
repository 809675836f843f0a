"""How fast the backend compiles, stage by stage, so the slow stage is visible.

Per (model, preset): the seconds of each stage of `compiler.pipeline.compile_int8`, as its
progress reports name them (lowering, tiling, keeping activations on chip, code generation,
scheduling, summarizing), then encoding the program to its file's bytes; the instructions
emitted, and instructions per second of the whole compile. Each model is profiled on 4 seeded
random samples and quantized with the default options first (not timed).

    .venv/bin/python benchmarks/bench_compile_speed.py [--models resnet18] [--presets default,edge]
"""

from __future__ import annotations

import argparse
import time

import onnx

from compiler.pipeline import compile_int8
from ember.flow import profile_model, quantize_model
from examples.build import zoo_model_path
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources.arrays import RandomData
from simulator.arch import Arch


def quantized(name: str):
    proto = onnx.load(zoo_model_path(name))
    specs = input_specs(proto, {})
    return quantize_model(proto, profile_model(proto, RandomData(4, specs, 0), specs,
                                               RunOptions(batch=1))).qgraph


class StageClock:
    """A progress callback that times each stage: a new name starts a new stage."""

    def __init__(self):
        self.stages: dict[str, float] = {}
        self.current, self.since = None, time.perf_counter()

    def __call__(self, what: str, done: int, total: int | None) -> None:
        if what != self.current:
            self.stop()
            self.current = what

    def stop(self) -> None:
        now = time.perf_counter()
        if self.current is not None:
            self.stages[self.current] = self.stages.get(self.current, 0.0) + now - self.since
        self.since = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18")
    parser.add_argument("--presets", default="default,edge")
    args = parser.parse_args()
    for name in args.models.split(","):
        qgraph = quantized(name)
        for preset in args.presets.split(","):
            clock = StageClock()
            start = time.perf_counter()
            compiled = compile_int8(qgraph, Arch.load(preset), progress=clock)
            clock.stop()
            compile_s = time.perf_counter() - start
            encode = time.perf_counter()
            compiled.program.to_bytes()
            encode = time.perf_counter() - encode
            count = len(compiled.program.instructions)
            print(f"\n{name} on {preset}: {count:,} instructions, compiled in {compile_s:.2f} s "
                  f"({count / compile_s:,.0f} instructions/s), encoded in {encode:.2f} s")
            print("| stage | seconds | share |")
            print("|---|---|---|")
            for stage, seconds in clock.stages.items():
                print(f"| {stage} | {seconds:.2f} | {seconds / compile_s:.0%} |")
            print(f"| encode | {encode:.2f} | |")


if __name__ == "__main__":
    main()
