"""Quantization techniques against their cost: cross-layer equalization and bias correction on
the zoo's ReLU6 networks, per-tensor and per-channel, in output SQNR and in cycles.

    python benchmarks/bench_techniques.py                       # mobilenetv2, efficientnet_lite0
    python benchmarks/bench_techniques.py --models mobilenetv2 --calib 8 --samples 8

Per model (examples/zoo.py, seeded weights; synthetic smooth images, calibration and evaluation
from different seeds): one profile per equalization mode (`--channel-means` on, so each serves
the bias-corrected rows too), then for each row the program for the default preset, its cycles
from the simulator (timing depends on the program alone) and the output SQNR of ember's integer
reference, which the program matches bit for bit, against fp32 onnxruntime on the model as
given.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from compiler.backend.program import BackendOptions
from ember import ort as ember_ort
from ember.flow import CompileOptions, compile_model, profile_model
from ember.reports.metrics import ErrorStats
from examples.build import zoo_model_path
from examples.synthetic_images import smooth_images
from profiler import format as profile_format
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources.arrays import ArrayFile
from quantizer.equalize import equalize
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from simulator.machine import Machine

MODELS = ("mobilenetv2", "efficientnet_lite0")
ROWS = (  # (label, per-channel, equalize, bias correction)
    ("per-tensor", False, "off", False),
    ("per-tensor, --equalize relu6", False, "relu6", False),
    ("per-tensor, --bias-correction", False, "off", True),
    ("per-tensor, both", False, "relu6", True),
    ("per-channel (default)", True, "off", False),
    ("per-channel, --equalize relu6", True, "relu6", False),
    ("per-channel, --bias-correction", True, "off", True),
)


def measure(name: str, calib: int, samples: int, folder: Path) -> list[tuple]:
    path = zoo_model_path(name)
    proto = onnx.load(str(path))
    specs = input_specs(proto, {})
    data = folder / f"{name}-calib.npz"
    np.savez(data, **{specs[0].name: smooth_images(calib, 1)})
    evaluation = smooth_images(samples, 2)
    session = ember_ort.session(str(path))
    reference = [session.run(None, {specs[0].name: x})[0] for x in evaluation]
    profiles = {}
    for mode in ("off", "relu6"):
        equalized = equalize(proto, mode)
        profiles[mode] = folder / f"{name}-{mode}.profile.json"
        profile_format.save(profile_model(equalized, ArrayFile(data, input_specs(equalized, {})),
                                          input_specs(equalized, {}),
                                          RunOptions(channel_means=True)), profiles[mode])
    rows = []
    for label, per_channel, mode, corrected in ROWS:
        options = CompileOptions(quant=QuantOptions(per_channel=per_channel, equalize=mode,
                                                    bias_correction=corrected),
                                 backend=BackendOptions())
        started = time.perf_counter()
        built = compile_model(path, profiles[mode], options)
        compile_s = time.perf_counter() - started
        cycles = Machine(built.compiled.program).stats.cycles
        error = ErrorStats()
        output = built.qgraph.outputs[0]
        for x, ref in zip(evaluation, reference):
            error.add(ref, run_int8(built.qgraph, {specs[0].name: x})[output])
        rows.append((label, error.sqnr_db, cycles, compile_s,
                     len(built.compiled.program.host_segments)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--calib", type=int, default=16, help="calibration images")
    parser.add_argument("--samples", type=int, default=16, help="evaluation images")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            print(f"\n## {name} ({args.calib} calibration / {args.samples} evaluation images)\n")
            print("| configuration | output SQNR dB | cycles | vs per-channel default | "
                  "host segments | compile s |")
            print("|---|---:|---:|---:|---:|---:|")
            rows = measure(name, args.calib, args.samples, Path(tmp))
            base = next(r[2] for r in rows if r[0] == "per-channel (default)")
            for label, sqnr, cycles, compile_s, host in rows:
                print(f"| {label} | {sqnr:.2f} | {cycles:,} | {cycles / base - 1:+.1%} | "
                      f"{host} | {compile_s:.1f} |", flush=True)


if __name__ == "__main__":
    main()
