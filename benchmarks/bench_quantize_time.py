"""Quantization time: an fp32 ONNX model and its profile to ember's int8 graph, step by step.

    python benchmarks/bench_quantize_time.py            # digits, ResNet-18, MobileNetV2
    python benchmarks/bench_quantize_time.py --quick    # fewer calibration samples, 1 run
    python benchmarks/bench_quantize_time.py --models resnet18 --runs 5

The profile is built once per model beforehand (not timed here beyond a footer line); then
each step of `ember.flow.quantize_model` is timed separately, median of --runs runs:

- load: `load_model` (onnx.load + checker) + `profile_format.load` + `check_matches` +
  `fix_input_shapes`
- import: `compiler.frontend.onnx.import_model`
- optimize: `compiler.pipeline.optimize` (constant folding, BatchNorm folding, fusion, ...)
- quantize: `quantizer.quantize.quantize` with the default options (per-channel weights),
  including its checks and the final int8 verification

then `quantize` alone with the other calibration methods, whose range search over each
tensor's histogram is part of quantizing. The issue's target: ResNet-18 from a profile in
< 5 s (import + optimize + quantize, default options).

Models: the digits CNN (its calibration data) and ResNet-18 / MobileNetV2 from
`examples/zoo.py` (seeded, untrained weights) profiled on synthetic smooth images.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from compiler.frontend.onnx import fix_input_shapes, import_model, load_model
from compiler.pipeline import optimize
from examples import zoo
from examples.synthetic_images import smooth_images
from profiler import format as profile_format
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources.arrays import ArrayFile
from quantizer import calibrate
from quantizer.options import QuantOptions
from quantizer.quantize import quantize

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("digits", "resnet18", "mobilenetv2")
CALIB = {"digits": 256, "resnet18": 16, "mobilenetv2": 16}
QUICK_CALIB = {"digits": 64, "resnet18": 2, "mobilenetv2": 2}
DEFAULT_METHOD = QuantOptions().calibration
OTHER_METHODS = tuple(m for m in calibrate.METHODS if m != DEFAULT_METHOD)
TARGET_S = 5.0


def prepare(name: str, samples: int, folder: Path) -> tuple[Path, Path, float, int]:
    """(model path, profile path, seconds to profile, graph nodes)."""
    if name == "digits":
        model_path = ROOT / "examples" / "digits" / "model.onnx"
        with np.load(model_path.parent / "calib.npz") as f:
            calib = f["input"][:samples].astype(np.float32)[:, None]
    else:
        model_path = folder / f"{name}.onnx"
        onnx.save(getattr(zoo, name)(), str(model_path))
        calib = smooth_images(samples, seed=1)
    model = onnx.load(str(model_path))
    specs = input_specs(model, {})
    data = folder / f"{name}-calib.npz"
    np.savez(data, **{specs[0].name: calib})
    started = time.perf_counter()
    result = profile(model, ArrayFile(data, specs), specs, RunOptions())
    profile_path = folder / f"{name}.profile.json"
    profile_format.save(result, profile_path)
    return model_path, profile_path, time.perf_counter() - started, len(model.graph.node)


def timed(function):
    started = time.perf_counter()
    result = function()
    return result, time.perf_counter() - started


def one_run(model_path: Path, profile_path: Path) -> dict[str, float]:
    times = {}

    def load():
        proto = load_model(str(model_path))
        prof = profile_format.load(profile_path)
        profile_format.check_matches(prof, proto)
        return fix_input_shapes(proto, {}, str(model_path)), prof

    (fixed, prof), times["load"] = timed(load)
    imported, times["import"] = timed(lambda: import_model(fixed))
    graph, times["optimize"] = timed(lambda: optimize(imported))
    qgraph, times["quantize"] = timed(lambda: quantize(graph, prof, QuantOptions()))
    times["nodes"] = len(graph.nodes)
    times["qnodes"] = len(qgraph.nodes)
    for method in OTHER_METHODS:
        _, times[method] = timed(lambda: quantize(graph, prof, QuantOptions(calibration=method)))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calibration samples, 1 run")
    parser.add_argument("--runs", type=int, help="runs per model (median reported)  "
                                                 "[default: 3, or 1 with --quick]")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated subset of {','.join(MODELS)}")
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {MODELS}")
    runs = args.runs or (1 if args.quick else 3)
    calib = QUICK_CALIB if args.quick else CALIB
    print(f"# ember quantization time from a profile (seconds, median of {runs} runs)")
    head = ["model", "ONNX nodes", "graph nodes", "int8 nodes", "load", "import", "optimize",
            "quantize", "import+optimize+quantize", f"< {TARGET_S:g} s",
            *(f"quantize {m}" for m in OTHER_METHODS)]
    lines = []
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            print(f"{name}: profiling {calib[name]} samples", file=sys.stderr, flush=True)
            model_path, profile_path, profile_s, onnx_nodes = prepare(name, calib[name],
                                                                      Path(tmp))
            notes.append(f"{name}: profile of {calib[name]} calibration samples built in "
                         f"{profile_s:.2f} s beforehand")
            results = []
            for i in range(runs):
                print(f"{name}: run {i + 1}/{runs}", file=sys.stderr, flush=True)
                results.append(one_run(model_path, profile_path))
            med = {k: statistics.median(r[k] for r in results) for k in results[0]}
            # The median of the per-run sums, not the sum of the medians, for the total.
            total = statistics.median(r["import"] + r["optimize"] + r["quantize"]
                                      for r in results)
            lines.append([name, str(onnx_nodes), str(int(med["nodes"])), str(int(med["qnodes"])),
                          f"{med['load']:.2f}", f"{med['import']:.2f}", f"{med['optimize']:.2f}",
                          f"{med['quantize']:.2f}", f"{total:.2f}",
                          "yes" if total < TARGET_S else "NO",
                          *(f"{med[m]:.2f}" for m in OTHER_METHODS)])
            print(f"{name}: done", file=sys.stderr, flush=True)
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
    for line in lines:
        print("| " + " | ".join(line) + " |")
    print()
    for note in notes:
        print(f"- {note}")
    print(f"- quantize = default options ({DEFAULT_METHOD} calibration, per-channel weights, "
          "int8 activations); the `quantize <method>` columns change only the calibration method")
    print("- ResNet-18 and MobileNetV2: examples/zoo.py, seeded untrained weights, profiled on "
          "synthetic smooth images; digits: examples/digits")


if __name__ == "__main__":
    main()
