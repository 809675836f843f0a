"""Sharded work (`--cluster`): what local processes gain, and what a Dask shard costs.

    python benchmarks/bench_shards.py                    # every section
    python benchmarks/bench_shards.py --only accuracy    # ember accuracy, local vs local:2
    python benchmarks/bench_shards.py --only overhead    # the scheduler's cost per shard
    python benchmarks/bench_shards.py --quick            # fewer samples, for a smoke run

Sections (one function each, `SECTIONS`):

- accuracy: `ember.accuracy.measure` (what `ember accuracy` runs) over --samples synthetic
  smooth images (`examples/synthetic_images.py`) on a zoo model (ResNet-18 by default, seeded
  untrained weights), profiled on 8 others, with `--cluster local` and each `local:N` of
  --processes: wall time, samples/s, speed-up, and whether the report equals the one-process
  report exactly (it must). The sharded times include starting the worker processes and
  quantizing the model once in each.
- overhead: N empty shards through `ember.cluster.Cluster.run` on a Dask LocalCluster (2
  worker processes, one thread each) and on `local:2`: the time per shard, after 4 shards of
  the same run that start the local processes or send the shared object to the workers
  (timed apart: a run's fixed cost).
- profile: `ember quantize-profile`'s run (`ember.profiling.profile`) over --profile-samples
  synthetic images on each of --profile-models, with `--cluster local` (onnxruntime and the
  binning threads on every core), `local:2` and a Dask LocalCluster of 2 one-thread workers:
  wall time (starting the processes and sending the model included), speed-up, and whether
  the profile equals the one-process profile exactly (it must).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from ember import cluster
from ember.accuracy import Evaluation, measure
from ember.profiling import profile as sharded_profile
from examples.build import zoo_model_path
from examples.synthetic_images import smooth_images
from profiler import format as profile_format
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources.arrays import ArrayFile
from quantizer.options import QuantOptions

CALIB_SEED, EVAL_SEED, CALIB_SAMPLES = 1, 2, 8


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def table(header: tuple[str, ...], rows: list[tuple]) -> None:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths)), flush=True)


def accuracy_section(args, folder: Path) -> None:
    model_path = zoo_model_path(args.model)
    model = onnx.load(str(model_path))
    specs = input_specs(model, {})
    calib, data = folder / "calib.npz", folder / "eval.npz"
    np.savez(calib, **{specs[0].name: smooth_images(CALIB_SAMPLES, CALIB_SEED)})
    np.savez(data, **{specs[0].name: smooth_images(args.samples, EVAL_SEED)})
    profile_path = folder / f"{args.model}.profile.json"
    profile_format.save(profile(model, ArrayFile(calib, specs), specs, RunOptions()),
                        profile_path)
    evaluation = Evaluation(data=str(data))
    print(f"\n## accuracy: {args.model}, {args.samples} samples (ember accuracy, --json)\n")
    rows, first = [], None
    for where in ["local", *(f"local:{n}" for n in args.processes)]:
        log(f"{args.model}: --cluster {where}")
        started = time.perf_counter()
        report = measure(str(model_path), str(profile_path), evaluation, QuantOptions(),
                         where=cluster.parse(where)).to_json()
        seconds = time.perf_counter() - started
        first = first or (report, seconds)
        rows.append((f"--cluster {where}", f"{seconds:.1f}", f"{args.samples / seconds:.2f}",
                     f"{first[1] / seconds:.2f}x", "yes" if report == first[0] else "NO"))
    table(("run", "wall s", "samples/s", "speed-up", "same report"), rows)


def _empty_shard(shared: cluster.Shared, shard: int) -> int:
    return shard


def overhead_section(args, folder: Path) -> None:
    from distributed import LocalCluster

    print(f"\n## overhead: {args.shards} empty shards\n")
    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as dask_cluster:
        for label, where in (("Dask LocalCluster, 2 workers", dask_cluster.scheduler_address),
                             ("local:2", "local:2")):
            with cluster.Cluster(where) as running:
                shared = cluster.Shared(None)
                started = time.perf_counter()
                for _ in running.run(_empty_shard, shared, range(4)):
                    pass  # the first shards start the workers (local) and send them `shared`
                start_s = time.perf_counter() - started
                started = time.perf_counter()
                done = sum(1 for _ in running.run(_empty_shard, shared, range(args.shards)))
                seconds = time.perf_counter() - started
            assert done == args.shards
            rows.append((label, f"{start_s:.2f}", f"{seconds:.2f}",
                         f"{1000 * seconds / args.shards:.2f}"))
    table(("where", "first 4 shards s", f"{args.shards} shards s", "ms per shard"), rows)


def profile_section(args, folder: Path) -> None:
    from distributed import LocalCluster

    samples = args.profile_samples
    print(f"\n## profile: {samples} samples (ember quantize-profile)\n")
    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as dask_cluster:
        for name in args.profile_models:
            model = onnx.load(str(zoo_model_path(name)))
            specs = input_specs(model, {})
            data = folder / f"{name}.calib.npz"
            np.savez(data, **{specs[0].name: smooth_images(samples, CALIB_SEED)})
            first = None
            for where in ("local", "local:2", dask_cluster.scheduler_address):
                log(f"{name}: profile, --cluster {where}")
                started = time.perf_counter()
                with cluster.Cluster(where) as running:
                    made = sharded_profile(running, model, ArrayFile(data, specs), specs,
                                           RunOptions())
                seconds = time.perf_counter() - started
                text = json.dumps(made.to_json(), sort_keys=True)
                first = first or (text, seconds)
                label = "Dask LocalCluster, 2 workers" if where.startswith("tcp") else where
                rows.append((name, f"--cluster {label}", f"{seconds:.1f}",
                             f"{samples / seconds:.1f}", f"{first[1] / seconds:.2f}x",
                             "yes" if text == first[0] else "NO"))
    table(("model", "run", "wall s", "samples/s", "speed-up", "same profile"), rows)


SECTIONS = {"accuracy": accuracy_section, "profile": profile_section,
            "overhead": overhead_section}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SECTIONS), help="Run one section.")
    parser.add_argument("--model", default="resnet18", choices=("resnet18", "mobilenetv2"))
    parser.add_argument("--samples", type=int, default=32, help="Evaluation samples.")
    parser.add_argument("--processes", type=lambda text: [int(n) for n in text.split(",")],
                        default=[2], help="local:N runs to time, e.g. 2,4.")
    parser.add_argument("--profile-samples", type=int, default=64,
                        help="Calibration samples (profile).")
    parser.add_argument("--profile-models", type=lambda text: text.split(","),
                        default=["resnet18", "mobilenetv2"], help="Zoo models (profile).")
    parser.add_argument("--shards", type=int, default=400, help="Empty shards (overhead).")
    parser.add_argument("--quick", action="store_true", help="8 samples, 100 shards.")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.shards, args.profile_samples = 8, 100, 8
    with tempfile.TemporaryDirectory() as folder:
        for name, section in SECTIONS.items():
            if args.only in (None, name):
                section(args, Path(folder))


if __name__ == "__main__":
    main()
