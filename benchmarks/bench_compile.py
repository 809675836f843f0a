"""Compiled programs on the simulator: cycles against the roofline bound, per model and preset,
with double buffering on and off, and how long compiling takes.

Each model is profiled with onnxruntime on a few seeded random samples (the digits model on its
calibration set), quantized with the default options and compiled; the program then runs once on
the simulator, and its int8 outputs are checked against the integer reference (`run_int8`) bit
for bit. Prints one row per (model, preset): compile seconds, instructions, simulated cycles,
the roofline bound max(MACs / array size, compulsory DRAM bytes / DMA bandwidth) with the
model's MACs (the compile summary's), the fraction of the bound achieved, the same with double
buffering off, whether both runs were bit-exact, and the bound with the MACs issued to the
array instead (block-diagonal grouped and depthwise tiles include their zero blocks, so it is
higher for MobileNetV2; equal for models without groups). Then, per (model, preset), the compile
summary's cycles (the machine's timing without data, `simulator.machine.timing`) and its busiest
unit's cycles (perfect overlap: the figure the summary called its estimate before) against the
simulated cycles, with their ratios. Then, for the models named by --layers (on the first
preset, double buffering on), where the cycles go, layer by layer (see `breakdown`).

    .venv/bin/python benchmarks/bench_compile.py
        [--models digits,mlp,squeezenet,resnet18,mobilenetv2] [--presets default,large,edge]
        [--layers digits,mobilenetv2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnx

from compiler.backend.program import BackendOptions
from compiler.pipeline import compile_int8
from ember.accuracy import BitExactness
from ember.flow import quantize_model
from examples.build import zoo_model_path
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources import open_data
from profiler.sources.arrays import RandomData
from profiler.sources.images import ImageOptions
from quantizer.reference import run_int8
from simulator import isa, machine
from simulator.arch import Arch

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"digits": ROOT / "examples" / "digits" / "model.onnx",
          **{name: zoo_model_path(name) for name in ("mlp", "squeezenet", "resnet18",
                                                     "mobilenetv2")}}


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
    return quantize_model(proto, prof).qgraph, sample


def run(name: str, preset: str, double_buffer: bool, qgraph, sample) -> dict:
    arch = Arch.load(preset)
    start = time.perf_counter()
    compiled = compile_int8(qgraph, arch, BackendOptions(double_buffer))
    seconds = time.perf_counter() - start
    program = compiled.program
    exactness = BitExactness(program, qgraph)
    stats = exactness.check(run_int8(qgraph, sample, keep_all=True))
    exact = exactness.first_difference is None
    return {"model": name, "preset": preset, "double_buffer": double_buffer,
            "compile_s": seconds, "instructions": len(program.instructions),
            "cycles": stats.cycles, "bound": compiled.summary.bound_cycles,
            "summary_cycles": machine.timing(program).cycles,
            "busiest_unit": compiled.summary.busiest_unit_cycles,
            "issued_bound": max(stats.bound_cycles, arch.roofline(stats.macs, 0)[0]),
            "of_bound": compiled.summary.bound_cycles / max(stats.cycles, 1), "bit_exact": exact,
            "layers": breakdown(program, stats, compiled.summary)}


def breakdown(program, stats, summary) -> list[dict]:
    """Per layer, in program order: the cycles it adds to the total (its last instruction's
    end minus the previous layer's: the rows sum to the total, and a layer's work that
    overlaps its predecessor counts there), the model's MACs per array MAC slot over its span
    (depthwise layers issue 16x more, zeros included), and how busy the array, the DRAM port
    and the vector unit were over the span (first start to last end). `bound_by` names the
    unit busy for at least half of the span, else "latency": DMA latencies and the
    load -> compute -> vector -> store chain of each tile, which no unit's throughput hides."""
    model_macs = {layer["name"]: layer["macs"] for layer in summary.per_layer}
    arch = program.arch
    port = {}
    for insn, source in zip(program.instructions, program.source):
        if insn.op is isa.LOAD or insn.op is isa.STORE:
            port[source] = port.get(source, 0) + insn.op.transfer(arch, insn)
    rows, previous_end = [], 0
    for layer in stats.layers:
        span = max(layer.end - layer.start, 1)
        busy = {"array": layer.busy.get("array", 0), "DRAM": port.get(layer.name, 0),
                "vector": layer.busy.get("vector", 0)}
        unit, most = max(busy.items(), key=lambda kv: kv[1])
        rows.append({"name": layer.name, "cycles": max(layer.end - previous_end, 0),
                     "macs": model_macs.get(layer.name, 0),
                     "mac_util": model_macs.get(layer.name, 0) / (arch.macs_per_cycle * span),
                     **{f"{k}_busy": v / span for k, v in busy.items()},
                     "bound_by": unit if most >= span / 2 else "latency"})
        previous_end = max(previous_end, layer.end)
    return rows


def print_breakdown(row: dict) -> None:
    total = max(row["cycles"], 1)
    print(f"\n{row['model']} on {row['preset']}: {row['cycles']:,} cycles, where they go "
          f"(busy: fraction of the layer's span)")
    header = (f"{'layer':<28} {'cycles':>10} {'share':>6} {'MAC util':>8} {'array':>6} "
              f"{'DRAM':>6} {'vector':>6}  bound by")
    print(header)
    print("-" * len(header))
    for layer in row["layers"]:
        print(f"{layer['name'][:28]:<28} {layer['cycles']:>10,} "
              f"{layer['cycles'] / total:>6.1%} {layer['mac_util']:>8.0%} "
              f"{layer['array_busy']:>6.0%} {layer['DRAM_busy']:>6.0%} "
              f"{layer['vector_busy']:>6.0%}  {layer['bound_by']}")
    by = {}
    for layer in row["layers"]:
        by[layer["bound_by"]] = by.get(layer["bound_by"], 0) + layer["cycles"]
    print("cycles by what bounds each layer: " + ", ".join(
        f"{k} {v / total:.0%}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,mlp,squeezenet,resnet18,mobilenetv2")
    parser.add_argument("--presets", default="default,large,edge")
    parser.add_argument("--layers", default="digits,mobilenetv2",
                        help="models whose per-layer breakdown to print (first preset)")
    args = parser.parse_args()
    header = (f"{'model':<12} {'preset':<8} {'compile s':>9} {'insns':>8} {'cycles':>12} "
              f"{'bound':>12} {'bound/cyc':>9} {'dbuf off':>12} {'off b/c':>7} {'exact':>6} "
              f"{'issued bound':>12}")
    print(header)
    print("-" * len(header))
    detail, estimates = [], []
    presets = args.presets.split(",")
    for name in args.models.split(","):
        qgraph, sample = quantized(name)
        for preset in presets:
            on, off = (run(name, preset, double_buffer, qgraph, sample)
                       for double_buffer in (True, False))
            print(f"{name:<12} {preset:<8} {on['compile_s']:>9.2f} {on['instructions']:>8,} "
                  f"{on['cycles']:>12,} {on['bound']:>12,} {on['of_bound']:>9.0%} "
                  f"{off['cycles']:>12,} {off['of_bound']:>7.0%} "
                  f"{str(on['bit_exact'] and off['bit_exact']):>6} "
                  f"{on['issued_bound']:>12,}", flush=True)
            estimates.append(on)
            if preset == presets[0] and name in args.layers.split(","):
                detail.append(on)
    print_summary_against_simulated(estimates)
    for row in detail:
        print_breakdown(row)


def print_summary_against_simulated(rows: list[dict]) -> None:
    """The compile summary's cycle figures against the simulated cycles, per (model, preset)."""
    header = (f"{'model':<12} {'preset':<8} {'simulated':>12} {'summary':>12} {'ratio':>6} "
              f"{'busiest unit':>12} {'ratio':>6}")
    print("\ncompile summary against the simulator (double buffering on)")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['model']:<12} {row['preset']:<8} {row['cycles']:>12,} "
              f"{row['summary_cycles']:>12,} {row['summary_cycles'] / row['cycles']:>6.3f} "
              f"{row['busiest_unit']:>12,} {row['busiest_unit'] / row['cycles']:>6.3f}")


if __name__ == "__main__":
    main()
