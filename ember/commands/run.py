"""`ember run`: execute a model with ember's fp32 reference interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from compiler.frontend.onnx import fix_input_shapes, load_model, parse_input_shapes
from compiler.graph.evaluate import evaluate
from compiler.graph.ir import Graph
from ember import ort
from ember.commands.options import input_shape_option, json_option, model_argument
from ember.compare import max_relative_error
from ember.errors import EmberError
from ember.files import InputPath, OutputPath, atomic_path
from ember.loading import check_array_file, load_graph


def read_inputs(path: str | None, graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """One sample: from a .npy (single-input models) or .npz keyed by input name, or random."""
    if path is None:
        rng = np.random.default_rng(seed)
        return {n: rng.standard_normal(graph.type_of(n).shape).astype(graph.type_of(n).dtype)
                for n in graph.inputs}
    file = Path(path)
    if not file.is_file():
        raise EmberError(f"{file}: no such file")
    check_array_file(file)
    try:
        if file.suffix == ".npy":
            if len(graph.inputs) != 1:
                raise EmberError(f"{file}: a .npy feeds one input, but the model takes "
                                 f"{list(graph.inputs)}; use an .npz keyed by input name")
            arrays = {graph.inputs[0]: np.load(file, allow_pickle=False)}
        else:
            with np.load(file, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files if k != "labels"}
    except (ValueError, OSError, EOFError) as err:  # EOFError: an empty file
        raise EmberError(f"{file}: not a readable .npy/.npz file ({err})") from None
    feeds = {}
    for name in graph.inputs:
        if name not in arrays:
            raise EmberError(f"{file}: no array for input {name!r} (found {sorted(arrays)})")
        want, array = graph.type_of(name).shape, arrays[name]
        if array.shape != want and array.shape[1:] == want[1:] and len(array) >= want[0]:
            array = array[:want[0]]  # samples on the first axis: run the first batch
        if array.shape != want:
            raise EmberError(f"{file}: input {name!r}: expected shape {want}, found "
                             f"{array.shape}")
        feeds[name] = array.astype(graph.type_of(name).dtype)
    return feeds


@click.command()
@model_argument
@click.option("-i", "--input", "input_path", type=InputPath(dir_okay=False),
              help="Input data: .npy (one input) or .npz keyed by input name; with samples on "
                   "the first axis the first batch runs. Default: seeded random normal data.")
@click.option("-o", "--output", type=OutputPath(dir_okay=False),
              help="Write the outputs to this .npz, keyed by output name.")
@input_shape_option
@click.option("--optimize/--no-optimize", default=True, show_default=True,
              help="Run the graph after the fp32 passes, or as imported.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Also run onnxruntime on the same input and report the difference.")
@click.option("--seed", default=0, show_default=True, help="Seed for random input data.")
@json_option
def run(model: str, input_path: str | None, output: str | None, input_shapes: tuple[str, ...],
        optimize: bool, check: bool, seed: int, as_json: bool) -> None:
    """Run MODEL with ember's fp32 reference interpreter and compare it with onnxruntime.

    The reference interpreter is the fp32 half of ember's correctness story: it runs the
    imported (and, by default, optimized) graph with numpy, so any disagreement with
    onnxruntime points at the importer, a pass or an operator row.

    \b
    Example:
      ember run examples/digits/model.onnx -i examples/digits/eval.npz
    """
    graph = load_graph(model, input_shapes, optimize)
    feeds = read_inputs(input_path, graph, seed)
    outputs = evaluate(graph, feeds)
    rows = []
    reference = {}
    if check:
        proto = fix_input_shapes(load_model(model), parse_input_shapes(input_shapes), model)
        reference = ort.run(ort.session(proto, name=model), feeds)
    for name, value in outputs.items():
        row = {"name": name, "shape": list(value.shape), "dtype": str(value.dtype),
               "min": float(value.min()) if value.size else 0.0,
               "max": float(value.max()) if value.size else 0.0}
        if check:
            row["max_abs_error"] = float(np.max(np.abs(value - reference[name]))) \
                if value.size else 0.0
            row["max_rel_error"] = max_relative_error(value, reference[name])
        rows.append(row)
    if output:
        with atomic_path(output) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **outputs)
    if as_json:
        click.echo(json.dumps({"model": model, "nodes": len(graph.nodes), "outputs": rows},
                              indent=1))
        return
    table = Table(title=f"{Path(model).name}: fp32 reference, {len(graph.nodes)} nodes")
    for col in ("output", "shape", "min", "max") + (("vs onnxruntime (max rel)",) if check
                                                     else ()):
        table.add_column(col, justify="left" if col in ("output", "shape") else "right")
    for row in rows:
        cells = [row["name"], "x".join(map(str, row["shape"])), f"{row['min']:.4g}",
                 f"{row['max']:.4g}"]
        if check:
            cells.append(f"{row['max_rel_error']:.2e}")
        table.add_row(*cells)
    Console().print(table)
