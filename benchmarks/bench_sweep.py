"""`ember sweep` at real size: ResNet-18 and MobileNetV2 from the zoo as one workload, on a
random sample of a 1,728-point space, on one process and on two; points per minute and the
speed-up, and a check that both give the same results.

    python benchmarks/bench_sweep.py                   # 500 points (an hour or more on 2 cores)
    python benchmarks/bench_sweep.py --points 40 --processes 1,2
    python benchmarks/bench_sweep.py --compare 32 --seeds 0,1,2 --processes 2   # random vs local

Each point compiles both models for its architecture and times the programs (the timing needs
no data); the models are quantized once per process, with profiles of two synthetic images
(examples/synthetic_images.py; the ranges do not change the cycles much, only the programs'
constants). Points per minute count points of the workload (two programs each).

`--compare N`: random and local search (`--search local`) with the same budget of N points,
for each seed; each run's fronts are scored by their hypervolume (the area they dominate,
axes scaled to [0, 1] over every point any run saw, up to the worst one seen) as a share of
the hypervolume of the best front all runs found together: 1.0 is as good as everything found.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from ember import space as space_file
from ember import sweep
from ember.cluster import Where
from ember.flow import profile_model
from examples.build import zoo_model_path
from examples.synthetic_images import smooth_images
from profiler import format as profile_format
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources.arrays import ArrayFile
from simulator.arch import Arch

MODELS = ("resnet18", "mobilenetv2")
SPACE = """
[space]
"array.rows" = [8, 16, 32]
"array.cols" = [16, 32, 64]
"array.dataflow" = ["weight_stationary", "output_stationary"]
"memory.scratchpad.size_bytes" = {start = 131072, stop = 1048576, factor = 2}
"memory.accumulator.size_bytes" = [65536, 131072, 262144]
"dma.bytes_per_cycle" = [8, 16, 32, 64]
"vector.lanes" = [16, 32]

[constraints]
sram_bytes = {max = 1310720}
"""


def workload(folder: Path) -> list[sweep.Model]:
    models = []
    for name in MODELS:
        path = zoo_model_path(name)
        proto = onnx.load(str(path))
        specs = input_specs(proto, {})
        data = folder / f"{name}-calib.npz"
        np.savez(data, **{specs[0].name: smooth_images(2, 1)})
        profile = folder / f"{name}.profile.json"
        profile_format.save(profile_model(proto, ArrayFile(data, specs), specs, RunOptions()),
                            profile)
        models.append(sweep.Model(str(path), str(profile), name))
    return models


def compare(models, space, budget: int, seeds: list[int], where: Where) -> None:
    runs = {(search, seed): sweep.run(models, space, Arch.load("default"), search, budget,
                                      seed, where)
            for seed in seeds for search in ("random", "local")}
    seen = {p["index"]: p for doc in runs.values() for p in doc["points"]
            if p["status"] == "ok"}
    everything = list(seen.values())
    print(f"\n{budget} points per run, seeds {seeds}: hypervolume as a share of the front "
          f"of all {len(everything)} distinct points found\n")
    print("| front | search | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |")
    print("|---|---|" + "---:|" * (len(seeds) + 1))
    for name, (x, y) in sweep.FRONTS.items():
        box = {k: (min(p[k] for p in everything), max(p[k] for p in everything))
               for k in (x, y)}
        best = sweep.hypervolume(everything, x, y, box)
        for search in ("random", "local"):
            shares = [sweep.hypervolume([p for p in runs[search, seed]["points"]
                                   if p["status"] == "ok"], x, y, box) / best
                      for seed in seeds]
            print(f"| {name} | {search} | " + " | ".join(f"{v:.3f}" for v in shares) +
                  f" | {sum(shares) / len(shares):.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", default="1,2", help="comma-separated local:N to time")
    parser.add_argument("--compare", type=int, metavar="N",
                        help="instead: random against local search, N points each")
    parser.add_argument("--seeds", default="0,1,2", help="with --compare")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        space_path = Path(tmp) / "space.toml"
        space_path.write_text(SPACE)
        space = space_file.load_space(space_path)
        models = workload(Path(tmp))
        if args.compare:
            compare(models, space, args.compare, [int(s) for s in args.seeds.split(",")],
                    Where(None, int(args.processes.split(",")[-1])))
            return
        print(f"space: {space.size:,} points; {args.points} drawn at random (seed {args.seed}); "
              f"workload: {', '.join(MODELS)}\n")
        print("| --cluster | points | failed | excluded | seconds | points/min | speed, vs the first |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        first, first_s = None, None
        for processes in (int(n) for n in args.processes.split(",")):
            started = time.perf_counter()
            doc = sweep.run(models, space, Arch.load("default"), "random", args.points,
                            args.seed, Where(None, processes))
            seconds = time.perf_counter() - started
            first = first or doc
            first_s = first_s or seconds
            assert doc == first, f"local:{processes} gave other results than the first run"
            print(f"| local:{processes} | {len(doc['points'])} | {doc['failed']} | "
                  f"{doc['excluded_by_constraints']} | {seconds:.1f} | "
                  f"{len(doc['points']) / seconds * 60:.1f} | {first_s / seconds:.2f}x |",
                  flush=True)
        by_index = {p["index"]: p for p in first["points"]}
        for name, front in first["pareto"].items():
            print(f"\n{name} front ({len(front)} points):")
            for index in front:
                p = by_index[index]
                print(f"  #{index}: {p['config']} -> {p['cycles']:,} cycles, "
                      f"{p['energy_uj']:.0f} uJ, {p['area_mm2']:.2f} mm2")


if __name__ == "__main__":
    main()
