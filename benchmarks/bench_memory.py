"""Activation memory and copy elimination: what the layer order, the DRAM placement and the
Concat-in-place lowering buy, on the zoo models (seeded, untrained weights).

    python benchmarks/bench_memory.py                      # ResNet-18, MobileNetV2, SqueezeNet
    python benchmarks/bench_memory.py --models squeezenet --presets default,edge

Table 1, per model: the DRAM activation arena of first-fit placement in the graph's layer order,
then after `compiler.backend.layer_order.order_for_memory` and with the planner's choice of first fit
or greedy-by-size (`compiler.backend.memory.plan_dram`), each beside the lower bound (the most bytes
live at one layer). Table 2, per model with Concats and preset: the program with each Concat
input written in place by its producer against the same program with every input copied
(`compiler.backend.lower.walk.plan_concats` returning nothing), simulated bit-exact on one sample:
layers, cycles and DRAM bytes moved.
"""

from __future__ import annotations

import argparse

import numpy as np

import compiler.backend.lower.walk as lowering_walk
import compiler.backend.memory as memory
from compiler.backend.layer_order import order_for_memory
from compiler.backend.lower import lower
from compiler.pipeline import compile_int8
from ember.accuracy import BitExactness
from ember.flow import quantize_model
from examples import zoo
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources.arrays import RandomData
from quantizer.reference import run_int8
from simulator.arch import Arch

_NO_LIMIT = 1 << 62


def _first_fit(lowered) -> int:
    greedy = memory.greedy_by_size
    memory.greedy_by_size = lambda ranges, sizes: ({}, _NO_LIMIT)
    try:
        return memory.plan_dram(lowered, 0, _NO_LIMIT, lowered.graph).peak_bytes
    finally:
        memory.greedy_by_size = greedy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenetv2,squeezenet")
    parser.add_argument("--presets", default="default")
    args = parser.parse_args()
    print("| model | layers | first fit, graph order | first fit, ordered | planned | bound |")
    print("|---|---|---|---|---|---|")
    programs = []
    for name in args.models.split(","):
        proto = zoo.MODELS[name]()
        specs = input_specs(proto, {})
        qgraph = quantize_model(
            proto, profile(proto, RandomData(2, specs, 0), specs, RunOptions())).qgraph
        lowered = lower(qgraph)
        ordered = order_for_memory(lowered)
        plan = memory.plan_dram(ordered, 0, _NO_LIMIT, name)
        print(f"| {name} | {len(lowered.layers)} | {_first_fit(lowered):,} | "
              f"{_first_fit(ordered):,} | {plan.peak_bytes:,} | {plan.lower_bound_bytes:,} |")
        if any(node.op == "Concat" for node in qgraph.nodes):
            programs.append((name, qgraph, specs))
    if not programs:
        return
    print()
    print("| model | preset | Concat inputs | layers | cycles | DRAM bytes moved |")
    print("|---|---|---|---|---|---|")
    plan_concats = lowering_walk.plan_concats
    for name, qgraph, specs in programs:
        rng = np.random.default_rng(1)
        sample = {s.name: rng.standard_normal(s.shape).astype(np.float32) for s in specs}
        for preset in args.presets.split(","):
            for label, planner in (("in place", plan_concats), ("copied", lambda graph: {})):
                lowering_walk.plan_concats = planner
                try:
                    compiled = compile_int8(qgraph, Arch.load(preset))
                finally:
                    lowering_walk.plan_concats = plan_concats
                exactness = BitExactness(compiled.program, qgraph)
                stats = exactness.check(run_int8(qgraph, sample, keep_all=True))
                if exactness.first_difference is not None:
                    raise SystemExit(f"{name} on {preset}, {label}: the simulator differs from "
                                     f"the integer reference: {exactness.first_difference}")
                moved = stats.dram_bytes_read + stats.dram_bytes_written
                print(f"| {name} | {preset} | {label} | {compiled.summary.layers} | "
                      f"{stats.cycles:,} | {moved:,} |")


if __name__ == "__main__":
    main()
