"""Profiling cost: time against plain onnxruntime inference, and peak memory against
onnxruntime's own calibrators, on the digits CNN, ResNet-18 and MobileNetV2.

    python benchmarks/bench_profile.py            # the full table, a few minutes
    python benchmarks/bench_profile.py --quick    # fewer samples, for a smoke run
    python benchmarks/bench_profile.py --floor    # what producing every tensor costs onnxruntime

Every memory figure comes from a fresh subprocess, so earlier runs do not blur it. It is the
peak resident set (VmHWM): getrusage's ru_maxrss would also count the parent's memory, which
Linux carries across fork and exec. Time is the best of a few interleaved rounds in one process,
since other work on the machine makes single timings noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from ember.cluster import Cluster, Where
from ember.profiling import profile
from examples.build import zoo_model_path
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources.arrays import ArrayFile

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "digits": ROOT / "examples/digits/model.onnx",
    "resnet18": zoo_model_path("resnet18"),
    "mobilenetv2": zoo_model_path("mobilenetv2"),
}
# (samples timed, memory at few samples, memory at many samples) per model. The big models
# use far fewer samples than the digits CNN: onnxruntime's calibrators keep every
# intermediate output of every sample (8-20 M floats per sample here), and the run has to
# finish in a few minutes on two cores.
FULL = {"digits": (2000, 1000, 10000), "resnet18": (20, 10, 50), "mobilenetv2": (20, 10, 50)}
QUICK = {"digits": (500, 200, 2000), "resnet18": (4, 4, 12), "mobilenetv2": (4, 4, 12)}
TOOLS = ("ember", "ort-minmax", "ort-entropy")


def make_data(model: str, n: int, folder: Path) -> Path:
    """n samples as one .npy (samples on the first axis), read lazily by every tool."""
    path = folder / f"{model}-{n}.npy"
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    if model == "digits":
        calib = np.load(ROOT / "examples/digits/calib.npz")["input"]
        base = calib[rng.integers(0, len(calib), n)]
        data = np.clip(base + rng.normal(0, 0.05, base.shape), 0, 1).astype(np.float32)
    else:
        data = rng.standard_normal((n, 3, 224, 224)).astype(np.float32)
    np.save(path, data)
    return path


def samples(data: Path):
    """One sample at a time by plain reads (a memory map would count as the reader's memory)."""
    with open(data, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read_header(f)
        size = int(np.prod(shape[1:])) * dtype.itemsize
        for _ in range(shape[0]):
            yield np.frombuffer(f.read(size), dtype).reshape((1, *shape[1:]))


CHANNEL_MEANS = False  # --channel-means: ember's runs also record them


def run_ember(model_path: Path, data: Path, workers: int = 1) -> None:
    model = onnx.load(str(model_path))
    specs = input_specs(model, {})
    with Cluster(Where(None, workers)) as cluster:
        profile(cluster, model, ArrayFile(data, specs), specs,
                RunOptions(channel_means=CHANNEL_MEANS))


def run_plain(model_path: Path, data: Path) -> None:
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for sample in samples(data):
        session.run(None, {name: sample})


def run_ort_calibrator(model_path: Path, data: Path, method: str) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        create_calibrator,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = samples(data)

        def get_next(self):
            sample = next(self.samples, None)
            return None if sample is None else {"input": sample}

    with tempfile.TemporaryDirectory() as tmp:
        calibrator = create_calibrator(
            str(model_path), augmented_model_path=str(Path(tmp) / "augmented.onnx"),
            calibrate_method={"minmax": CalibrationMethod.MinMax,
                              "entropy": CalibrationMethod.Entropy}[method])
        calibrator.collect_data(Reader())
        calibrator.compute_data()


def child(tool: str, model: str, data: Path) -> None:
    """Run one tool once and print its peak memory; called in a fresh process."""
    started = time.perf_counter()
    if tool == "ember":
        run_ember(MODELS[model], data)
    else:
        run_ort_calibrator(MODELS[model], data, tool.removeprefix("ort-"))
    status = Path("/proc/self/status").read_text()
    peak_kb = int(next(line.split()[1] for line in status.splitlines()
                       if line.startswith("VmHWM:")))
    print(json.dumps({"maxrss_mb": peak_kb / 1024, "seconds": time.perf_counter() - started}))


def peak_memory(tool: str, model: str, data: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", tool, model, str(data)],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def floor_table(models: list[str], rounds: int, runs: int = 20) -> None:
    """What any profiler of every tensor pays before binning: onnxruntime's time per run with
    the model as deployed (default level: BatchNorm and clamps fused into the Conv, NCHWc), at
    the basic level (every BatchNorm and clamp output still a tensor), and with every tensor a
    graph output (as the profiler runs it) at both levels. Best of `rounds` per case."""
    from profiler.session import expose_all

    levels = {"default": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
              "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}
    print("## The floor: onnxruntime alone, ms per run of one sample (ratio to as deployed)")
    print(f"{'model':12} {'as deployed':>11} {'basic level':>17} {'every tensor out, basic':>24} "
          f"{'every tensor out, default':>26} {'values/run':>11}")
    for model in models:
        proto = onnx.load(str(MODELS[model]))
        plain, exposed = proto.SerializeToString(), expose_all(proto, False)
        cases = {(what, level): (plain if what == "plain" else exposed, levels[level])
                 for what in ("plain", "exposed") for level in levels}
        specs = input_specs(proto, {})
        feeds = {s.name: np.random.default_rng(0).standard_normal(s.shape).astype(np.float32)
                 for s in specs}
        sessions = {}
        for key, (bytes_, level) in cases.items():
            options = ort.SessionOptions()
            options.graph_optimization_level = level
            sessions[key] = ort.InferenceSession(bytes_, options,
                                                 providers=["CPUExecutionProvider"])
        best = dict.fromkeys(cases, float("inf"))
        values = 0
        for _ in range(rounds):
            for key, session in sessions.items():
                outputs = session.run(None, feeds)
                started = time.perf_counter()
                for _ in range(runs):
                    session.run(None, feeds)
                best[key] = min(best[key], (time.perf_counter() - started) / runs * 1000)
                if key[0] == "exposed":
                    values = sum(getattr(o, "size", 0) for o in outputs)
        base = best["plain", "default"]
        cell = lambda key: f"{best[key]:.2f} ({best[key] / base:.1f}x)"  # noqa: E731
        print(f"{model:12} {base:11.2f} {cell(('plain', 'basic')):>17} "
              f"{cell(('exposed', 'basic')):>24} {cell(('exposed', 'default')):>26} "
              f"{values / 1e6:10.1f}M", flush=True)


def timed(function) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process and its threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-only", action="store_true", help="skip the peak-memory table")
    parser.add_argument("--channel-means", action="store_true",
                        help="ember's profiles also record the per-channel sums bias correction "
                             "reads (`quantize-profile --channel-means`)")
    parser.add_argument("--floor", action="store_true",
                        help="only what onnxruntime alone takes to produce every tensor")
    parser.add_argument("--child", nargs=3, metavar=("TOOL", "MODEL", "DATA"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]))
        return
    sizes = QUICK if args.quick else FULL
    models = args.models.split(",")
    global CHANNEL_MEANS
    CHANNEL_MEANS = args.channel_means
    if args.floor:
        floor_table(models, args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start "
              f"(other work makes wall times noisy)\n")
        print("## Time: profiling vs plain onnxruntime inference, same samples, same process")
        print("(best of --rounds interleaved rounds; CPU = this process's CPU time, all threads, "
              "which other load on the machine disturbs less than wall time)")
        print(f"{'model':12} {'samples':>7} {'plain wall s':>12} {'ember wall s':>12} "
              f"{'ratio':>6} {'plain CPU s':>11} {'ember CPU s':>11} {'ratio':>6} "
              f"{'ember local:2 wall s':>24}")
        for model in models:
            n = sizes[model][0]
            data = make_data(model, n, folder)
            plain = ember = (float("inf"),) * 2
            ember2 = float("inf")
            for _ in range(args.rounds):  # interleaved, best of each
                plain = tuple(map(min, plain, timed(lambda: run_plain(MODELS[model], data))))
                ember = tuple(map(min, ember, timed(lambda: run_ember(MODELS[model], data))))
                ember2 = min(ember2, timed(lambda: run_ember(MODELS[model], data, 2))[0])
            print(f"{model:12} {n:7} {plain[0]:12.2f} {ember[0]:12.2f} "
                  f"{ember[0] / plain[0]:6.2f} {plain[1]:11.2f} {ember[1]:11.2f} "
                  f"{ember[1] / plain[1]:6.2f} {ember2:24.2f}", flush=True)
        if args.time_only:
            return
        print()
        print("## Peak memory (MB, fresh process each; growth = many / few - 1)")
        print(f"{'model':12} {'tool':12} {'few':>6} {'MB':>8} {'many':>6} {'MB':>8} "
              f"{'growth':>7} {'s (many)':>9}")
        for model in models:
            few, many = sizes[model][1:]
            for tool in TOOLS:
                a = peak_memory(tool, model, make_data(model, few, folder))
                b = peak_memory(tool, model, make_data(model, many, folder))
                if "error" in a or "error" in b:
                    print(f"{model:12} {tool:12} failed: {a.get('error') or b.get('error')}")
                    continue
                growth = b["maxrss_mb"] / a["maxrss_mb"] - 1
                print(f"{model:12} {tool:12} {few:6} {a['maxrss_mb']:8.0f} {many:6} "
                      f"{b['maxrss_mb']:8.0f} {growth:7.1%} {b['seconds']:9.1f}", flush=True)


if __name__ == "__main__":
    main()
