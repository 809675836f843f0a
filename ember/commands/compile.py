"""`ember compile`: an fp32 ONNX model and its profile → an int8 program (.ember) for a target."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource
from rich.table import Table

from compiler.backend.program import BackendOptions, Compiled
from compiler.frontend.onnx import parse_input_shapes
from ember import console
from ember.accuracy import Evaluation
from ember.budget import Budget, BudgetMissed, Choice, Equalization, choose
from ember.cluster import Where
from ember.errors import EmberError
from ember.commands.options import (class_axes_from, class_axis_option, cluster_option,
                                    ctc_blank_option, data_options, decisions_from,
                                    metric_option,
                                    threshold_option, image_options_from,
                                    input_shape_option, json_option, model_argument,
                                    quant_options_from, quantization_options, warn_if_synthetic)
from ember.files import InputPath, OutputPath
from ember.flow import CompileOptions, compile_model
from ember.progress import progress_bar
from ember.task_metric import MetricSpec
from profiler import format as profile_format
from quantizer.qdq import export_qdq
from simulator import machine
from simulator.arch import Arch
from simulator.errors import listing


@click.command("compile")
@model_argument
@click.option("--int8", "int8", is_flag=True, default=True,
              help="Quantize weights and activations to int8 for the accelerator: the default "
                   "and only precision, so the flag may be left out (accepted, as trtexec's "
                   "--int8 is, so that scripts say what they build).")
@quantization_options
@click.option("--target", default="default", show_default=True, metavar="PRESET|ARCH.toml",
              type=InputPath(),
              help="A preset (default, large, edge) or an architecture TOML file.")
@click.option("--emit-onnx", "emit_onnx", type=OutputPath(dir_okay=False),
              help="Also write the quantized model as standard QDQ ONNX (onnxruntime runs it, "
                   "Netron shows each node's scale and zero point).")
@click.option("--double-buffer/--no-double-buffer", default=True, show_default=True,
              help="Ping-pong local buffers so that DMA overlaps compute.")
@click.option("--allow-host/--no-allow-host", default=False, show_default=True,
              help="Run what the accelerator cannot (nodes kept with --keep-fp32, operators "
                   "it lacks) on the host CPU, in host segments; without it they are errors.")
@click.option("-o", "--output", type=OutputPath(dir_okay=False, beside=("model", ".ember")),
              help="Program to write.  [default: MODEL with .ember]")
@click.option("--min-sqnr", type=float, metavar="DB",
              help="Accuracy budget: raise the fewest tensors and layers' weights above int8 "
                   "(int16 on the accelerator; with --allow-host, fp32 on the host as a last "
                   "resort), in the order the sensitivity analysis ranks them, until every "
                   "output's SQNR on --data is at least DB, then drop the costliest in cycles "
                   "that it does not need; exit 3 if no configuration gets there.")
@click.option("--max-drop", type=click.FloatRange(min=0), metavar="POINTS",
              help="Accuracy budget, as --min-sqnr: top-1 accuracy on --data's labels at most "
                   "POINTS below fp32's.")
@click.option("--min-agreement", type=click.FloatRange(0, 100), metavar="PERCENT",
              help="Accuracy budget, as --min-sqnr: each classifier output's top-1 agrees "
                   "with fp32's on at least PERCENT of --data's samples (no labels needed); "
                   "of its positions for an output --class-axis names (a sequence's steps).")
@data_options("--data", what="Evaluation data for --min-sqnr, --max-drop and --min-agreement")
@click.option("--labels", "labels_path", type=InputPath(dir_okay=False),
              help="Labels for --max-drop (one class index per sample, or one-hot rows; with "
                   "--ctc-blank, one row of class indices per sample; with --metric, whatever "
                   "rows it reads), when --data holds none.")
@metric_option
@class_axis_option
@ctc_blank_option
@threshold_option
@input_shape_option
@cluster_option
@json_option
def compile_(model: str, int8: bool, target: str, emit_onnx: str | None, double_buffer: bool,
             allow_host: bool, output: str, min_sqnr: float | None, max_drop: float | None,
             min_agreement: float | None, data: str | None, samples: int | None,
             labels_path: str | None, class_axes: tuple[str, ...], ctc_blank: int | None,
             thresholds: tuple[str, ...], metric: MetricSpec | None, input_shapes: tuple[str, ...],
             cluster: Where, as_json: bool, **quant_kwargs) -> None:
    """Quantize MODEL with its profile and compile it into a bit-exact int8 program.

    The program's outputs equal the quantizer's integer reference bit for bit. Inputs and
    outputs stay float at the program's boundary: their scale and zero point are in the
    program header, and `ember simulate` quantizes float inputs with them. With --allow-host,
    what the accelerator cannot run runs on the host in host segments (still bit-exact); the
    summary lists each segment's nodes and cost.

    A dynamic input is compiled at the shape it was profiled at (batch 1 if the data chose
    the batch size), or at the one --input-shape gives, which may differ only on the batch
    axis: a profile made at batch 1 serves a program for batch 8, which tiles the batch like
    any other axis. The header records the shape.

    With --min-sqnr, --max-drop or --min-agreement and evaluation --data, the fewest tensors
    and layers' weights are raised above int8 until the budget holds (mixed precision), then
    those costing the most cycles per dB of expected gain are dropped while it still holds
    (each drop measured); the summary lists what stays raised, each item's estimated cycles,
    and what the choice costs in cycles and DRAM bytes against the all-int8 program. The
    search measures many configurations: --cluster local:N runs each one's samples, and the
    ranking's runs, in N processes (the choice is the same).

    With --equalize left out, an int8 model that misses the budget is also tried equalized
    (--equalize all): profiled again on the calibration data its profile records (found where
    the profile says, or beside it, and checked by its digest) and measured: if it meets the
    budget with nothing raised, it is the choice, and its profile is written beside the
    program (PROGRAM.equalized.profile.json), for `ember accuracy`; else the search raises
    tensors of the model as it is. --equalize off skips the trial.

    \b
    Examples:
      ember quantize-profile model.onnx --data calib.npz -o model.profile.json
      ember compile model.onnx --int8 --profile model.profile.json --target edge -o model.ember
      ember simulate model.ember -i input.npz --report perf.json
      ember compile model.onnx --profile model.profile.json --data eval.npz --max-drop 0.5
      ember compile crnn.onnx --profile crnn.profile.json --data eval.npz \\
          --min-agreement 99 --class-axis -1
      ember compile crnn.onnx --profile crnn.profile.json --data eval_with_texts.npz \\
          --max-drop 0.5 --class-axis -1 --ctc-blank 0
      ember compile detector.onnx --profile detector.profile.json --data pages.npz \\
          --max-drop 0.5 --metric my_metrics.py:box_f1
    """
    profile_path = quant_kwargs["profile_path"]
    out = Path(output)
    images = image_options_from(quant_kwargs)
    budget = Budget(min_sqnr, max_drop, min_agreement)
    if data is None and budget.given:
        raise click.UsageError("--min-sqnr, --max-drop and --min-agreement are measured on "
                               "evaluation samples: give --data")
    if data is not None and not budget.given:
        raise click.UsageError("--data on compile is the evaluation data of an accuracy "
                               "budget: give --min-sqnr, --max-drop or --min-agreement (or "
                               "drop --data)")
    if labels_path is not None and max_drop is None:
        raise click.UsageError("--labels is for --max-drop")
    if metric is not None and max_drop is None:
        raise click.UsageError("--metric is the task metric --max-drop holds: give --max-drop")
    if ctc_blank is not None and max_drop is None:
        raise click.UsageError("--ctc-blank says how texts are scored against labels: it is "
                               "for --max-drop")
    if class_axes and min_agreement is None and max_drop is None:
        raise click.UsageError("--class-axis says where top-1 is read: it is for "
                               "--min-agreement and --max-drop")
    if thresholds and min_agreement is None and max_drop is None:
        raise click.UsageError("--threshold says which outputs are yes/no decisions: it is "
                               "for --min-agreement and --max-drop")
    axes = class_axes_from(class_axes)
    options = CompileOptions(quant_options_from(quant_kwargs),
                             BackendOptions(double_buffer=double_buffer, allow_host=allow_host),
                             parse_input_shapes(input_shapes))
    choice = None
    # An equalized choice's profile is staged beside the program and named once the program is
    # written: a failure leaves neither.
    staged = equalized = None
    try:
        with progress_bar() as progress:
            if data is not None:
                # --equalize left out: the budget may try `all` itself (`budget._equalized`).
                try_equalize = click.get_current_context().get_parameter_source("equalize") \
                    is ParameterSource.DEFAULT
                choice = _within_budget(model, profile_path, options, budget, allow_host,
                                        Evaluation(data=data, labels=labels_path, samples=samples,
                                                   images=images,
                                                   class_axes=axes, ctc_blank=ctc_blank,
                                                   metric=metric,
                                                   decisions=decisions_from(thresholds)),
                                        progress, cluster, target, try_equalize)
                baseline = compile_model(model, profile_path, options, target, progress)
                options = dataclasses.replace(options, quant=choice.options)
                if choice.equalization is not None and choice.equalization.chosen:
                    staged, equalized = _stage_equalized(choice.equalization, out, model,
                                                         profile_path)
                    profile_path = str(staged)
            built = compile_model(model, profile_path, options, target, progress)
            # The machine's timing depends on the program alone, so the summary's cycles are
            # exactly those `ember simulate` will report, whatever the inputs.
            progress("timing the program", 0, None)
            cycles = machine.timing(built.compiled.program).cycles
            if choice is not None:
                spent = _cost(choice, baseline, machine.timing(baseline.compiled.program).cycles,
                              None if equalized is None else str(equalized),
                              built, cycles)
        shapes = built.compiled.program.metadata["options"].get("input_shapes", {})
        for name, shape in shapes.items():
            if name not in options.input_shapes:
                click.echo(f"ember: dynamic input {name!r} compiled as {name}="
                           f"{','.join(map(str, shape))}, from the profile (--input-shape to "
                           f"choose)", err=True)
        warn_if_synthetic(profile_path)
        compiled, arch = built.compiled, built.compiled.program.arch
        if emit_onnx:
            export_qdq(built.qgraph, emit_onnx)
        compiled.program.save(out)
        if staged is not None:  # the program's profile, under its name once the program is there
            os.replace(staged, equalized)
        report = {"model": model, "program": str(out), "target": arch.name, "cycles": cycles,
                  **compiled.summary.to_dict()}
        if choice is not None:
            report["budget"] = spent
        if as_json:
            click.echo(json.dumps(report, indent=1))
        else:
            _print_summary(compiled, cycles, out, arch)
            if choice is not None:
                _print_budget(spent)
    finally:
        if staged is not None:
            staged.unlink(missing_ok=True)


def _within_budget(model: str, profile_path: str, options: CompileOptions, budget: Budget,
                   allow_host: bool, evaluation: Evaluation, progress, where: Where,
                   target: str, try_equalize: bool) -> Choice:
    """The search's choice; a missed budget is exit 3 with the best measured, no program."""
    try:
        return choose(model, profile_path, evaluation, options.quant, budget, allow_host,
                      options.input_shapes, progress, where, target, try_equalize)
    except BudgetMissed as missed:
        click.echo(f"ember: budget not met, no program written: {missed}", err=True)
        sys.exit(3)


def _stage_equalized(equalization: Equalization, out: Path, model: str,
                     profile_path: str) -> tuple[Path, Path]:
    """The equalized model's profile written beside the program under a staging name, and the
    name it takes once the program is written (PROGRAM.equalized.profile.json: the program's
    header holds its digest, and `ember accuracy` takes it with the program)."""
    path = out.with_name(f"{out.stem}.equalized.profile.json")
    if path.resolve() in (Path(model).resolve(), Path(profile_path).resolve()):
        raise EmberError(f"{path}: the budget's equalized profile would overwrite an input; "
                         f"name the program otherwise (-o)")
    staged = path.with_name(f".{path.name}.staged")
    profile_format.save(equalization.profile, staged)
    return staged, path


def _cost(choice: Choice, baseline, baseline_cycles: int, equalized_profile: str | None,
          built, cycles: int) -> dict:
    """What the search raised and what it costs against the all-int8 program."""
    def figures(report, summary, cycles):
        return {"cycles": cycles, "dram_bytes_moved": summary.dram_bytes_moved,
                "dram_image_bytes": summary.dram_image_bytes,
                "outputs": [{"name": o.name, "sqnr_db": o.sqnr_db,
                             "top1_accuracy": o.top1_accuracy_int8,
                             "top1_accuracy_fp32": o.top1_accuracy_fp32,
                             "top1_agreement": o.top1_agreement,
                             "top1_per_position": o.top1_per_position,
                             "accuracy_name": o.accuracy_name}
                            for o in report.outputs],
                "task_metric": None if report.task is None else dataclasses.asdict(report.task)}
    estimated = choice.estimated_cycles
    return {"met": choice.met, "evaluations": choice.evaluations, "pruned": choice.pruned,
            "estimated_cycles": {"int8": estimated[0], "chosen": estimated[1]}
            if estimated else None,
            "budget": dataclasses.asdict(choice.budget) if choice.budget else None,
            "samples": choice.report.samples,
            "raised": [r.to_json() for r in choice.raised],
            "passed_over": [{"tensor": t, "why": why} for t, why in choice.passed_over],
            "int8": figures(choice.baseline, baseline.compiled.summary, baseline_cycles),
            "chosen": figures(choice.report, built.compiled.summary, cycles),
            "equalization": None if choice.equalization is None else {
                "note": choice.equalization.note, "chosen": choice.equalization.chosen,
                "profile": equalized_profile}}


# The raised tensors the budget's summary names, first in the ranking's order; the rest are
# counted (a detector can raise hundreds; --json lists every one).
SHOWN_RAISED = 20


def _raised_counts(raised: list[dict]) -> str:
    """'237 tensors int16, 63 layers' weights int16 and 1 fp32 on the host', of those given."""
    kinds = (("int16", "tensor", "tensors", "int16"),
             ("int16 weights", "layer's weights", "layers' weights", "int16"),
             ("fp32", "tensor", "tensors", "fp32 on the host"))
    parts = []
    for how, one, many, what in kinds:
        n = sum(1 for r in raised if r["how"] == how)
        if n:
            parts.append(f"{n} {one if n == 1 else many} {what}")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] \
        if parts else "nothing"


def _print_budget(spent: dict) -> None:
    before, after = spent["int8"], spent["chosen"]
    table = Table(title=f"accuracy budget: {_raised_counts(spent['raised'])} raised "
                        f"({spent['evaluations']} configurations measured on "
                        f"{spent['samples']} samples)")
    table.add_column("")
    table.add_column("all int8", justify="right")
    table.add_column("chosen", justify="right")
    for b, a in zip(before["outputs"], after["outputs"]):
        table.add_row(f"{b['name']} SQNR", f"{b['sqnr_db']:.2f} dB", f"{a['sqnr_db']:.2f} dB")
        if b["top1_agreement"] is not None:
            per = "per-position " if b["top1_per_position"] else ""
            table.add_row(f"{b['name']} {per}top-1 agreement with fp32",
                          f"{100 * b['top1_agreement']:.2f}%", f"{100 * a['top1_agreement']:.2f}%")
        if b["top1_accuracy_fp32"] is not None:
            table.add_row(f"{b['name']} {b['accuracy_name']} "
                          f"(fp32 {100 * b['top1_accuracy_fp32']:.2f}%)",
                          f"{100 * b['top1_accuracy']:.2f}%", f"{100 * a['top1_accuracy']:.2f}%")
    task, chosen = before.get("task_metric"), after.get("task_metric")
    if task is not None and task["fp32"] is not None:
        table.add_row(f"task metric {task['name']} (fp32 {100 * task['fp32']:.2f}%)",
                      f"{100 * task['int8']:.2f}%", f"{100 * chosen['int8']:.2f}%")
    for key, label in (("cycles", "cycles"), ("dram_bytes_moved", "DRAM bytes moved"),
                       ("dram_image_bytes", "DRAM image bytes")):
        change = after[key] / before[key] - 1 if before[key] else 0.0
        table.add_row(label, f"{before[key]:,}", f"{after[key]:,} ({change:+.1%})")
    estimated = spent.get("estimated_cycles")
    if estimated:
        change = estimated["chosen"] / estimated["int8"] - 1 if estimated["int8"] else 0.0
        table.add_row("cycles estimated from the graph", f"{estimated['int8']:,}",
                      f"{estimated['chosen']:,} ({change:+.1%})")
    if spent.get("pruned"):
        table.add_row("dropped by the pruning (costliest per dB first)", "",
                      f"{spent['pruned']} of {spent['pruned'] + len(spent['raised'])}")
    for raised in spent["raised"][:SHOWN_RAISED]:
        how = "int16" if raised["how"] == "int16" else \
            f"int16 weights ({raised['nodes'][0]})" if raised["how"] == "int16 weights" else \
            f"fp32 on the host ({', '.join(raised['nodes'])})"
        cost = raised.get("cost_cycles")
        if cost is not None:
            how += f", {cost:+,} cycles est."
        table.add_row(f"raised {raised['tensor']}", f"{raised['gain_db']:+.2f} dB expected", how)
    rest = spent["raised"][SHOWN_RAISED:]
    if rest:
        table.add_row(f"... and {len(rest)} more", "", f"{_raised_counts(rest)} (--json lists "
                                                        f"every one)")
    equalization = spent.get("equalization")
    if equalization is not None and equalization["chosen"]:
        table.add_row("cross-layer equalization", "off", "--equalize all")
    console.results().print(table)
    if equalization is not None:
        said = f"budget: {equalization['note']}"
        if equalization["chosen"]:
            said += (f"; the equalized model's profile is {equalization['profile']} (give it "
                     f"to `ember accuracy` with this program)")
        console.results().print(said, highlight=False)


def _print_summary(compiled: Compiled, cycles: int, out: Path, arch: Arch) -> None:
    s = compiled.summary
    table = Table(title=f"ember compile → {out} ({arch.name}: {arch.array.rows}x"
                        f"{arch.array.cols} array)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("layers", f"{s.layers}")
    table.add_row("instructions", f"{s.instructions:,} (" + ", ".join(
        f"{q} {n:,}" for q, n in s.per_queue.items()) + f"; {s.syncs} relay SYNCs)")
    table.add_row("MACs, model's (issued)", f"{s.macs:,} ({s.array_macs:,})")
    table.add_row("DRAM image (weights, constants)", f"{s.dram_image_bytes:,} B")
    table.add_row("DRAM activations (peak / lower bound)",
                  f"{s.activation_peak_bytes:,} / {s.activation_lower_bound_bytes:,} B")
    table.add_row("scratchpad (largest layer)", f"{s.scratchpad_peak_bytes:,} of "
                                     f"{arch.scratchpad.size_bytes:,} B")
    table.add_row("accumulator (largest layer)", f"{s.accumulator_peak_bytes:,} of "
                                      f"{arch.accumulator.size_bytes:,} B")
    table.add_row("DRAM bytes moved (compulsory)", f"{s.dram_bytes_moved:,} "
                                                   f"({s.compulsory_dram_bytes:,})")
    table.add_row("cycles (the simulator's timing)", f"{cycles:,}")
    table.add_row("busiest unit (perfect overlap)", f"{s.busiest_unit_cycles:,} cycles "
                                                    f"({s.busiest_unit_cycles / max(cycles, 1):.0%}"
                                                    f" of the cycles)")
    table.add_row("roofline bound", f"{s.bound_cycles:,} cycles "
                                    f"({s.bound_cycles / max(cycles, 1):.0%} of the cycles)")
    for segment in s.host_segments:
        table.add_row(f"host segment {segment['name']}",
                      f"{segment['cycles']:,} cycles ({segment['flops']:,} FLOPs, "
                      f"{segment['read_bytes'] + segment['write_bytes']:,} B): "
                      + listing(segment["nodes"]))  # all of them in --json
    console.results().print(table)
