"""`ember accuracy`: int8 against fp32 onnxruntime, whole model and layer by layer."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click
from rich.table import Table

from compiler.frontend.onnx import parse_input_shapes
from ember import console
from ember.accuracy import Evaluation, compiles_again_to, measure
from ember.cluster import Where
from ember.commands.options import (QUANT_FIELDS, batch_option, class_axes_from,
                                    class_axis_option, cluster_option, ctc_blank_option,
                                    data_options, decisions_from, metric_option,
                                    threshold_option,
                                    image_options_from,
                                    input_shape_option, json_option, model_argument,
                                    quant_options_from, quantization_options, refuse_conflicts,
                                    warn_if_synthetic)
from ember.errors import EmberError
from ember.files import InputPath, OutputPath, write_text
from ember.progress import progress_bar
from ember.task_metric import MetricSpec
from quantizer.calibrate import METHODS
from quantizer.options import QuantOptions

EXIT_GATE_FAILED = 3


@click.command()
@model_argument
@click.argument("program", required=False, type=InputPath(dir_okay=False))
@quantization_options
@data_options("--data", what="Evaluation data", required=True)
@click.option("--labels", "labels_path", type=InputPath(dir_okay=False),
              help="Ground truth for top-1 accuracy (.npy, or .npz with `labels`): one class "
                   "index in [0, classes) per sample, or one-hot rows [N, classes] (each exactly "
                   "one 1); with --ctc-blank, one row of class indices per sample, padded "
                   "with -1; with --metric, one row per sample of whatever it reads. "
                   "Anything else is refused.")
@class_axis_option
@ctc_blank_option
@threshold_option
@metric_option
@click.option("--per-layer", is_flag=True,
              help="Add every quantized tensor's SQNR against fp32: its own quantization error "
                   "and the error accumulated from the input, worst first; and its integer "
                   "kernel's (against the fp32 op on the inputs it received), flagging kernels "
                   "10 dB or more below one that rounds once.")
@click.option("--sensitivity", is_flag=True,
              help="With --per-layer: also each tensor's effect on the output, kept at full "
                   "precision and alone quantized (the QDQ export run by onnxruntime, once "
                   "per tensor each), ranked by the output SQNR it gains: where a fix pays "
                   "first.")
@click.option("--html", "html_path", type=OutputPath(dir_okay=False),
              help="Also write a self-contained HTML report with a per-layer SQNR plot.")
@click.option("--emit-onnx", "emit_onnx", type=OutputPath(dir_okay=False),
              help="Also write the quantized model as standard QDQ ONNX (onnxruntime runs it, "
                   "Netron shows each node's scale, zero point and, with --per-layer, SQNR).")
@click.option("--compare-calibrations", is_flag=True,
              help="Evaluate every --calibration method on the data instead of one, and print "
                   "them side by side with the best marked (by --metric when given, else by "
                   "the first output's SQNR): no method is best on every model, so measure on "
                   "yours (without PROGRAM, --per-layer, --html or --emit-onnx).")
@click.option("--min-sqnr", type=float,
              help="Exit with code 3 when the first output's SQNR (dB) is below this.")
@click.option("--max-top1-drop", type=float,
              help="Exit with code 3 when int8 top-1 accuracy (or agreement, without labels; "
                   "or the --metric) falls more than this many points below fp32.")
@batch_option
@input_shape_option
@cluster_option
@json_option
def accuracy(model: str, program: str | None, data: str, labels_path: str | None,
             class_axes: tuple[str, ...], ctc_blank: int | None, thresholds: tuple[str, ...],
             metric: MetricSpec | None,
             samples: int | None, per_layer: bool, sensitivity: bool, html_path: str | None, emit_onnx: str | None,
             compare_calibrations: bool, min_sqnr: float | None,
             max_top1_drop: float | None, batch: int | None, input_shapes: tuple[str, ...],
             cluster: Where, as_json: bool, **kwargs) -> None:
    """Measure how close the int8 model stays to fp32 onnxruntime on evaluation data.

    With PROGRAM (an .ember from `ember compile` with the same profile), the simulator also
    runs every sample and must equal the integer reference bit for bit (JSON `bit_exact`,
    and `first_difference` when it does not), --batch samples at a time; the quantizer
    options come from the program, and one given that differs from what the program recorded
    is an error naming both.

    MODEL is quantized with the profile and options given (exactly as `ember compile` would)
    and run by ember's integer reference interpreter, the arithmetic the accelerator
    executes bit for bit; onnxruntime runs the fp32 model on the same samples. Per output:
    top-1 agreement, top-1 accuracy with labels, SQNR, cosine similarity, max |error|. Top-1
    reads [batch, classes] outputs; --class-axis names the class axis of a sequence or map,
    whose top-1 agreement is then per position (each step, token or pixel). --ctc-blank scores
    a CTC head's whole texts against label rows; --threshold reads yes/no scores as decisions;
    --metric scores the outputs with a function of your own against the labels (a detector's
    box F1), beside fp32's.

    Images are preprocessed as --resize, --mean, --std, --layout and --channel-order say; a
    warning names any that differ from the calibration images' (recorded in the profile and
    the program).

    With --cluster local:N or a Dask scheduler's address, shards of the samples run in
    parallel (the workers read the data from its path) and the report is the one a single
    process gives, bit for bit: every sum is kept exactly and merged exactly.

    \b
    Examples:
      ember accuracy examples/digits/model.onnx --profile digits.profile.json \\
          --data examples/digits/eval.npz --per-layer --html accuracy.html
      ember accuracy resnet.onnx resnet.ember --profile resnet.profile.json \\
          --data imagenet_val/ --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225
      ember accuracy crnn.onnx --profile crnn.profile.json --data eval.npz --class-axis -1
      ember accuracy crnn.onnx --profile crnn.profile.json --data texts.npz --class-axis -1 \\
          --ctc-blank 0
      ember accuracy vad.onnx --profile vad.profile.json --data chunks.npz \\
          --threshold speech_probs=0.5
      ember accuracy detector.onnx --profile detector.profile.json --data pages.npz \\
          --metric my_metrics.py:box_f1
    """
    options = quant_options_from(kwargs)
    if sensitivity and not per_layer:
        raise EmberError("--sensitivity ranks the per-layer report's tensors: give --per-layer "
                         "too")
    evaluation = Evaluation(data=data, labels=labels_path, samples=samples, per_layer=per_layer,
                            sensitivity=sensitivity, program=program,
                            images=image_options_from(kwargs), batch=batch,
                            class_axes=class_axes_from(class_axes), ctc_blank=ctc_blank,
                            metric=metric,
                            decisions=decisions_from(thresholds))
    if compare_calibrations:
        given = [name for name, value in (("PROGRAM", program), ("--per-layer", per_layer),
                                          ("--html", html_path), ("--emit-onnx", emit_onnx))
                 if value]
        if given:
            raise EmberError(f"--compare-calibrations evaluates the integer reference once per "
                             f"method; drop {', '.join(given)}")
        _compare_calibrations(model, kwargs["profile_path"], evaluation, options,
                              parse_input_shapes(input_shapes), as_json, cluster)
        return
    with progress_bar() as progress:
        report = measure(model, kwargs["profile_path"], evaluation, options,
                         parse_input_shapes(input_shapes), progress=progress,
                         emit_onnx=emit_onnx, where=cluster,
                         check_program_options=lambda fixed: refuse_conflicts(
                             click.get_current_context(), program,
                             {param: getattr(fixed, field)
                              for param, field in QUANT_FIELDS.items()},
                             "the program was compiled with", "compile the program again"))
    warn_if_synthetic(kwargs["profile_path"])
    if html_path:
        write_text(html_path, report.html())
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
    else:
        report.print(console.results())
    failed = _gate(report, min_sqnr, max_top1_drop)
    if report.bit_exact is False:
        if not compiles_again_to(program, model, kwargs["profile_path"]):
            raise EmberError(f"{program}: the simulator differs from the integer reference "
                             f"({difference_text(report.first_difference)}), and the program is not what ember "
                             f"compiles from {model} with the options and target it records: "
                             f"an edited program, or one from another ember")
        click.echo(f"ember: the simulator differs from the integer reference: "
                   f"{difference_text(report.first_difference)}", err=True)
        sys.exit(1)
    if failed:
        click.echo(f"ember: accuracy gate failed: {failed}", err=True)
        sys.exit(EXIT_GATE_FAILED)


def _compare_calibrations(model: str, profile_path: str, evaluation: Evaluation, options,
                          input_shapes, as_json: bool, where: Where) -> None:
    """Each calibration method's accuracy on the same data, the best (by the task metric of
    --metric, else the first output's SQNR) marked."""
    reports = {}
    with progress_bar() as progress:
        for method in METHODS:
            reports[method] = measure(model, profile_path, evaluation,
                                      replace(options, calibration=method), input_shapes,
                                      progress=lambda what, done, total, m=method:
                                      progress(f"{m}: {what}", done, total), where=where)
    warn_if_synthetic(profile_path)
    # The task metric judges when there is one (--metric), the first output's SQNR after it.
    best = max(reports, key=lambda m: (
        reports[m].task.int8 if reports[m].task and reports[m].task.int8 is not None else 0.0,
        reports[m].outputs[0].sqnr_db))
    if as_json:
        click.echo(json.dumps({"best": best, "calibrations": {
            m: r.to_json() for m, r in reports.items()}}, indent=1))
        return
    first = reports[best].outputs[0]
    table = Table(title=f"{Path(model).name} vs fp32, output {first.name!r}")
    task = reports[best].task
    columns = ["calibration", "SQNR dB", "cosine", "top-1 agree", "int8 accuracy"]
    if task is not None:
        columns.append(f"{task.name} (fp32 {task.fp32:.2%})" if task.fp32 is not None else
                       task.name)
    for column in columns:
        table.add_column(column, justify="left" if column == "calibration" else "right")
    for method, report in reports.items():
        out = report.outputs[0]
        cells = [method + (" (best)" if method == best else "") +
                 (" (default)" if method == QuantOptions().calibration else ""),
                 f"{out.sqnr_db:.2f}", f"{out.cosine:.5f}", out.agreement_text,
                 out.accuracy_text(out.top1_accuracy_int8)]
        if task is not None:
            cells.append("—" if report.task.int8 is None else f"{report.task.int8:.2%}")
        table.add_row(*cells)
    console.results().print(table)


def difference_text(first: dict) -> str:
    """Where the program first differs from the integer reference, in words."""
    at = ",".join(map(str, first["element"]))
    return (f"sample {first['sample']}, output {first['output']!r}[{at}]: the simulator gives "
            f"{first['simulator']}, the integer reference {first['reference']}")


def _gate(report, min_sqnr: float | None, max_top1_drop: float | None) -> str | None:
    first = report.outputs[0]
    if min_sqnr is not None and first.sqnr_db < min_sqnr:
        return f"SQNR {first.sqnr_db:.2f} dB < --min-sqnr {min_sqnr}"
    task = report.task
    if max_top1_drop is not None and task is not None and task.drop_points is not None:
        if task.drop_points > max_top1_drop:
            return (f"task metric {task.name} drop {task.drop_points:.2f} points > "
                    f"--max-top1-drop {max_top1_drop}")
        return None
    if max_top1_drop is not None and first.classifier:
        if first.top1_accuracy_fp32 is not None:
            drop = 100 * (first.top1_accuracy_fp32 - first.top1_accuracy_int8)
        else:
            drop = 100 * (1 - first.top1_agreement)
        if drop > max_top1_drop:
            return (f"{first.accuracy_name} drop {drop:.2f} points > --max-top1-drop "
                    f"{max_top1_drop}")
    return None
