"""`ember run`: execute a model with ember's fp32 reference interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
from rich.table import Table

from compiler.frontend.onnx import fix_input_shapes, load_model, parse_input_shapes
from compiler.graph.evaluate import evaluate
from compiler.graph.ir import Graph
from ember import console, ort, preprocessing
from ember.commands.options import (
    data_options,
    image_options_from,
    input_shape_option,
    json_option,
    model_argument,
)
from ember.compare import max_relative_error
from ember.errors import EmberError
from ember.files import OutputPath, atomic_path
from ember.loading import check_array_file, load_graph
from profiler import batching
from profiler.model_inputs import InputSpec
from profiler.sources import open_data
from profiler.sources.images import ImageOptions


def read_inputs(path: str | None, graph: Graph, seed: int, images: ImageOptions = ImageOptions(),
                limit: int | None = None) -> tuple[list[dict[str, np.ndarray]], int, int]:
    """The model's runs over the samples in `path` (any form `--data` takes; seeded random
    data without it): samples lie on the model's batch axis and run in batches of its size,
    the last filled with zeros. Returns the runs, the number of samples and the fill."""
    if path is None:
        rng = np.random.default_rng(seed)
        return [{n: rng.standard_normal(graph.type_of(n).shape).astype(graph.type_of(n).dtype)
                 for n in graph.inputs}], 0, 0
    file = Path(path)
    if file.suffix in (".npy", ".npz"):
        arrays = _array_file(file, graph)
        preprocessing.warn_if_differs(None, images, None, f"-i {path}")
    else:
        specs = [InputSpec(n, np.dtype(graph.type_of(n).dtype), (None, *graph.type_of(n).shape[1:]))
                 for n in graph.inputs]
        source = open_data(path, specs, images, "-i")
        preprocessing.warn_if_differs(None, images, source, f"-i {path}")
        batches = list(batching.stream(source, specs, 64, False, limit, False,
                                       batching.Tally()))
        if not batches:
            raise EmberError(f"{path}: no samples")
        arrays = {n: np.concatenate([b[n] for b in batches]) for n in graph.inputs}
    counts = set()
    for name in graph.inputs:
        want, array = graph.type_of(name).shape, arrays[name]
        if not want or array.shape[1:] != want[1:]:
            raise EmberError(f"{path}: input {name!r}: expected shape {want}, found "
                             f"{array.shape} (any number of samples on the first axis)")
        dtype = np.dtype(graph.type_of(name).dtype)
        if dtype.kind in "iu" and array.dtype.kind not in "iu":
            raise EmberError(f"{path}: input {name!r} is {array.dtype}: expected integers "
                             f"({dtype})")
        counts.add(len(array) if limit is None else min(len(array), limit))
    if len(counts) > 1:
        raise EmberError(f"{path}: inputs have different numbers of samples {sorted(counts)}")
    count = counts.pop()
    batch = graph.type_of(graph.inputs[0]).shape[0]
    fill = -count % batch
    feeds = {n: np.concatenate([arrays[n][:count], np.zeros((fill, *arrays[n].shape[1:]),
                                                             arrays[n].dtype)])
             .astype(graph.type_of(n).dtype) for n in graph.inputs}
    runs = [{n: a[start:start + batch] for n, a in feeds.items()}
            for start in range(0, count + fill, batch)]
    return runs, count, fill


def _array_file(file: Path, graph: Graph) -> dict[str, np.ndarray]:
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
    for name in graph.inputs:
        if name not in arrays:
            raise EmberError(f"{file}: no array for input {name!r} (found {sorted(arrays)})")
        if arrays[name].ndim == len(graph.type_of(name).shape) - 1:
            arrays[name] = arrays[name][np.newaxis]  # one sample without its batch axis
    return arrays


@click.command()
@model_argument
@data_options("-i", "--input",
              what="Input data, every sample run (without it, seeded random normal data)")
@click.option("-o", "--output", type=OutputPath(dir_okay=False),
              help="Write the outputs to this .npz, keyed by output name.")
@input_shape_option
@click.option("--optimize/--no-optimize", default=True, show_default=True,
              help="Run the graph after the fp32 passes, or as imported.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Also run onnxruntime on the same input and report the difference.")
@click.option("--seed", default=0, show_default=True, help="Seed for random input data.")
@json_option
def run(model: str, data: str | None, samples: int | None, output: str | None,
        input_shapes: tuple[str, ...], optimize: bool, check: bool, seed: int, as_json: bool,
        **image_kwargs) -> None:
    """Run MODEL with ember's fp32 reference interpreter and compare it with onnxruntime.

    The reference interpreter is the fp32 half of ember's correctness story: it runs the
    imported (and, by default, optimized) graph with numpy, so any disagreement with
    onnxruntime points at the importer, a pass or an operator row. Samples run in batches of
    the model's batch size (--input-shape fixes a dynamic one); the last batch is filled with
    zeros, their outputs dropped.

    \b
    Example:
      ember run examples/digits/model.onnx -i examples/digits/eval.npz
    """
    graph = load_graph(model, input_shapes, optimize)
    runs, count, fill = read_inputs(data, graph, seed, image_options_from(image_kwargs),
                                    samples)
    if len(runs) > 1 or fill:
        click.echo(f"ember: {_count(count, 'sample')} in {_count(len(runs), 'run')} of the model's batch "
                   f"{len(runs[0][graph.inputs[0]])}"
                   + (f", the last filled with {fill} zero samples whose outputs are dropped"
                      if fill else ""), err=True)
    outputs = _joined([evaluate(graph, feeds) for feeds in runs], count)
    rows = []
    reference = {}
    if check:
        proto = fix_input_shapes(load_model(model), parse_input_shapes(input_shapes), model)
        session = ort.session(proto, name=model)
        reference = _joined([ort.run(session, feeds) for feeds in runs], count)
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
        click.echo(json.dumps({"model": model, "nodes": len(graph.nodes),
                               "samples": count or len(runs[0][graph.inputs[0]]),
                               "outputs": rows}, indent=1))
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
    console.results().print(table)


def _joined(results: list[dict[str, np.ndarray]], count: int) -> dict[str, np.ndarray]:
    """Each output of every run, joined on the batch axis without the filling samples."""
    joined = {name: np.concatenate([r[name] for r in results]) for name in results[0]}
    return {name: value[:count] if count else value for name, value in joined.items()}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
