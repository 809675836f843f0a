"""The demo's steps, each printing what it did; `ember demo` runs them in order.

Each step runs the same code as the command a user would type, so the demo is also the
shortest proof that the flow works on a fresh machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from compiler.frontend.onnx import import_model, load_model
from compiler.graph.evaluate import evaluate
from compiler.graph.printer import format_graph
from compiler.pipeline import optimize
from ember import ort
from ember.accuracy import Evaluation, measure
from ember.compare import max_relative_error
from ember.errors import EmberError
from ember.files import atomic_path, write_text
from ember.reports.performance import PerformanceReport
from quantizer.options import QuantOptions

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"


def run_demo(ctx: click.Context, out_dir: Path, console: Console | None = None) -> list[Path]:
    console = console or Console()
    model_path, calib_path, eval_path = (EXAMPLE / "model.onnx", EXAMPLE / "calib.npz",
                                         EXAMPLE / "eval.npz")
    for path in (model_path, calib_path, eval_path):
        if not path.is_file():
            raise EmberError(f"{path}: missing; regenerate it with `ember examples build`")
    written: list[Path] = []

    console.rule("[bold]1. import and fp32 graph passes  (ember show)")
    graph = _import_step(console, model_path, out_dir, written)

    console.rule("[bold]2. fp32 reference interpreter against onnxruntime  (ember run)")
    _reference_step(console, graph, model_path, eval_path)

    console.rule("[bold]3. profile over the calibration set  (ember quantize-profile)")
    from ember.commands.profile import quantize_profile
    profile_path = out_dir / "digits.profile.json"
    ctx.invoke(quantize_profile, model=str(model_path), data=str(calib_path),
               output=str(profile_path))
    written.append(profile_path)

    console.rule("[bold]4. quantize and compile for the default target  (ember compile --int8)")
    from ember.commands.compile import compile_
    program_path = out_dir / "digits.ember"
    ctx.invoke(compile_, model=str(model_path), profile_path=str(profile_path),
               output=str(program_path))
    written.append(program_path)

    console.rule("[bold]5. simulate one held-out image  (ember simulate, ember report --html)")
    from ember.commands.simulate import simulate
    sample_path = out_dir / "sample.npz"
    with np.load(eval_path) as data:
        _save_npz(sample_path, input=data["input"][:1])
    perf_path, trace_path, outputs_path = (out_dir / "perf.json", out_dir / "trace.json",
                                           out_dir / "outputs.npz")
    ctx.invoke(simulate, program=str(program_path), data=str(sample_path),
               output=str(outputs_path), report=str(perf_path), trace_path=str(trace_path))
    perf_html = out_dir / "perf.html"  # what `ember report perf.json --html perf.html` writes
    write_text(perf_html, PerformanceReport.from_report(
        json.loads(perf_path.read_text()), str(perf_path)).html())
    written += [sample_path, outputs_path, perf_path, perf_html, trace_path]

    console.rule("[bold]6. int8 program against fp32 onnxruntime, every held-out image  "
                 "(ember accuracy --per-layer)")
    report = measure(str(model_path), str(profile_path),
                     Evaluation(data=str(eval_path), per_layer=True,
                                program=str(program_path)), QuantOptions())
    report.print(console)
    html_path, json_path = out_dir / "accuracy.html", out_dir / "accuracy.json"
    write_text(html_path, report.html())
    write_text(json_path, json.dumps(report.to_json(), indent=1) + "\n")
    written += [html_path, json_path]

    console.rule("[bold]files written")
    for path in written:
        console.print(f"  {path}", soft_wrap=True, highlight=False)
    return written


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def _import_step(console: Console, model_path: Path, out_dir: Path, written: list[Path]):
    imported = import_model(model_path)
    graph = optimize(imported)
    console.print(f"{model_path.name}: {len(imported.nodes)} nodes imported, "
                  f"{len(graph.nodes)} after the passes "
                  f"({', '.join(f'{k}×{v}' for k, v in graph.op_counts().items())})")
    ir_path = out_dir / "digits.ir.txt"
    write_text(ir_path, format_graph(graph) + "\n")
    written.append(ir_path)
    return graph


def _reference_step(console: Console, graph, model_path: Path, eval_path: Path) -> None:
    with np.load(eval_path) as data:
        images, labels = data["input"], data["labels"]
    session = ort.session(load_model(model_path))
    (input_name,), (output_name,) = graph.inputs, graph.outputs
    worst, ours_correct, ort_correct = 0.0, 0, 0
    for i in range(len(images)):
        feeds = {input_name: images[i:i + 1]}
        ours = evaluate(graph, feeds)[output_name]
        theirs = ort.run(session, feeds)[output_name]
        worst = max(worst, max_relative_error(ours, theirs))
        ours_correct += int(ours.argmax() == labels[i])
        ort_correct += int(theirs.argmax() == labels[i])
    table = Table(title=f"digits CNN, {len(images)} held-out images")
    for col in ("runtime", "top-1 accuracy", "max rel. error vs onnxruntime"):
        table.add_column(col, justify="right")
    table.add_row("onnxruntime fp32", f"{ort_correct / len(images):.2%}", "—")
    table.add_row("ember fp32 reference", f"{ours_correct / len(images):.2%}", f"{worst:.2e}")
    console.print(table)
