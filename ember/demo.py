"""The demo's steps, each printing what it did; `ember demo` runs them in order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from compiler.frontend.onnx import import_model, load_model
from compiler.graph.evaluate import evaluate
from compiler.graph.printer import format_graph
from compiler.pipeline import optimize
from ember import ort
from ember.compare import max_relative_error
from ember.errors import EmberError
from ember.files import write_text

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"


def run_demo(out_dir: Path, console: Console | None = None) -> list[Path]:
    console = console or Console()
    model_path, eval_path = EXAMPLE / "model.onnx", EXAMPLE / "eval.npz"
    for path in (model_path, eval_path):
        if not path.is_file():
            raise EmberError(f"{path}: missing; regenerate it with `ember examples build`")
    written: list[Path] = []

    console.rule("[bold]1. import and fp32 graph passes")
    imported = import_model(model_path)
    graph = optimize(imported)
    console.print(f"{model_path.name}: {len(imported.nodes)} nodes imported, "
                  f"{len(graph.nodes)} after the passes "
                  f"({', '.join(f'{k}×{v}' for k, v in graph.op_counts().items())})")
    ir_path = out_dir / "digits.ir.txt"
    write_text(ir_path, format_graph(graph) + "\n")
    written.append(ir_path)

    console.rule("[bold]2. fp32 reference interpreter against onnxruntime")
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

    console.rule("[bold]files written")
    for path in written:
        console.print(f"  {path}")
    return written
