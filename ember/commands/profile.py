"""`ember quantize-profile` and `ember profile merge|show`: tensor ranges over calibration data."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from rich.table import Table

from compiler.errors import CompileError
from compiler.graph.ops import OPS, reaches_the_accelerator
from ember import console, preprocessing
from ember.commands.options import (
    cluster_option,
    data_options,
    equalize_option,
    image_options_from,
    input_shape_option,
    json_option,
    model_argument,
)
from ember.cluster import Cluster, Where
from ember.errors import EmberError
from ember.files import InputPath, OutputPath
from ember.flow import optimized_graph, profile_model
from ember.progress import counting
from profiler import format as profile_format
from profiler.model_inputs import input_specs, parse_input_shape
from profiler.run import RunOptions, load_model
from profiler.sources import open_data
from profiler.sources.arrays import RandomData
from quantizer.checks import unquantizable
from quantizer.equalize import equalize as equalize_model
from simulator.errors import listing
from simulator.numerics import oversize


@click.command("quantize-profile")
@model_argument
@data_options("--data", what="Calibration data")
@click.option("--random", "random_samples", type=click.IntRange(min=1), metavar="N",
              help="Profile N synthetic normal(0,1) samples instead of --data: a quick smoke "
                   "run; the profile is marked synthetic.")
@click.option("-o", "--output",
              type=OutputPath(dir_okay=False, beside=("model", ".profile.json")),
              help="Profile to write.  [default: MODEL with .profile.json]")
@click.option("--batch", type=click.IntRange(min=1), default=32, metavar="B", show_default=True,
              help="Most samples per onnxruntime run. A model fixed to batch 1 runs batched "
                   "only if that gives the same values (checked on the first batch); large "
                   "models run one sample at a time, which is faster for them. Memory grows "
                   "with B, never with --samples.")
@cluster_option
@click.option("--workers", type=click.IntRange(min=1), metavar="N",
              help="Short for --cluster local:N.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random.")
@click.option("--allow-nonfinite/--reject-nonfinite", default=False, show_default=True,
              help="Skip (and count) samples with NaN or Inf instead of stopping at the first.")
@click.option("--channel-means", is_flag=True,
              help="Also record, exactly, each channel's sum of every Conv, Gemm and MatMul "
                   "input (3 to 5 ns a value more): the means `compile --bias-correction` "
                   "needs.")
@input_shape_option
@equalize_option
def quantize_profile(model: str, data: str | None, random_samples: int | None,
                     output: str, samples: int | None, batch: int, cluster: Where,
                     workers: int | None,
                     seed: int, allow_nonfinite: bool, channel_means: bool,
                     input_shapes: tuple[str, ...], equalize: str, **image_kwargs) -> None:
    """Run MODEL in fp32 over calibration data and record every tensor's range.

    For each input, weight and node output: min, max, count and a histogram of at least
    2048 bins inside the range, enough for min/max, percentile, entropy (KL) and MSE
    calibration. Data streams in batches, so memory stays flat however many samples.

    \b
    Examples:
      ember quantize-profile model.onnx --data calib.npz
      ember quantize-profile resnet.onnx --data imagenet_val/ --samples 1000 \\
          --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 --cluster local:2
      ember quantize-profile model.onnx --data my_reader.py:make_reader
      ember quantize-profile model.onnx --random 16          # smoke test only
      ember compile model.onnx --int8 --profile model.profile.json

    The profile names the model by a fingerprint of its graph, input shapes and weights;
    compiling another model with it fails and says which of the three differs.

    \b
    Profiles of shards of the data combine exactly, as if made in one run:
      ember profile merge part1.json part2.json -o model.profile.json
    """
    if (data is None) == (random_samples is None):
        raise click.UsageError("give exactly one of --data DATA or --random N")
    out = Path(output)
    overrides = dict(parse_input_shape(text) for text in input_shapes)
    onnx_model = equalize_model(load_model(model), equalize)
    specs = input_specs(onnx_model, overrides)
    for spec in specs:  # one sample of each, before anything is allocated
        if (why := oversize([1 if d is None else d for d in spec.shape], spec.dtype)):
            raise EmberError(f"{model}: input {spec.name!r} is too large: {why}")
    unimportable = _warn_unsupported(model, onnx_model, specs)
    if random_samples is not None:
        source = RandomData(random_samples, specs, seed)
    else:
        images = image_options_from(image_kwargs)
        source = open_data(data, specs, images)
        preprocessing.warn_if_differs(None, images, source, f"--data {data}")
    if workers is not None:
        if cluster != Where():
            raise click.UsageError("give --workers N or --cluster, not both")
        cluster = Where(None, workers)
    options = RunOptions(batch=batch, samples=samples, allow_nonfinite=allow_nonfinite,
                         channel_means=channel_means)
    total = source.count()
    if samples is not None and total is not None:
        total = min(total, samples)
    started = time.perf_counter()
    with counting("profiling samples", total) as advance, Cluster(cluster) as where:
        result = profile_model(onnx_model, source, specs, options, overrides, advance, model,
                               where)
    profile_format.save(result, out)
    if unimportable is not None:
        click.echo(unimportable, err=True)
    _summary(result, out, time.perf_counter() - started)


def _warn_unsupported(model: str, onnx_model, specs) -> str | None:
    """Before profiling, say on stderr which nodes the accelerator cannot run, so that the
    user learns it now rather than from `ember compile` after the profile is made: the
    profile is still written (host segments need it too). A model ember cannot import at all
    gets its warning back, to say once onnxruntime has run it (if onnxruntime cannot either,
    its error alone is the one line the user sees)."""
    shapes = {s.name: tuple(1 if d is None else d for d in s.shape) for s in specs}
    try:
        graph = optimized_graph(onnx_model, shapes, label=model)
    except CompileError as err:
        return (f"ember: warning: {err}; `ember compile` will refuse this model, with or "
                f"without --allow-host")
    host = [f"{node.name} ({node.op})" for node in graph.nodes
            if not reaches_the_accelerator(OPS[node.op]) or unquantizable(graph, node)]
    if host:
        click.echo(f"ember: warning: {model}: the accelerator cannot run {len(host)} node(s): "
                   f"{listing(host)}; `ember compile` refuses them unless given --allow-host, "
                   f"which runs them on the host CPU in host segments (bit-exact, priced in "
                   f"the cycle count)", err=True)
    return None


def _summary(result: profile_format.Profile, out: Path, seconds: float) -> None:
    run = result.runs[0]
    kinds = {k: sum(t.kind == k for t in result.tensors.values()) for k in profile_format.KINDS}
    notes = [f"{run['skipped_nonfinite']} skipped (NaN/Inf)" if run["skipped_nonfinite"] else "",
             f"{run['dropped']} dropped (partial batch)" if run["dropped"] else "",
             "synthetic --random data" if run["data"]["kind"] == "random" else ""]
    table = Table(title=f"profile written to {out}", show_header=False)
    table.add_row("tensors", f"{len(result.tensors)} ({kinds['input']} inputs, "
                             f"{kinds['weight']} weights, {kinds['activation']} activations)")
    table.add_row("samples", ", ".join([str(result.samples), *filter(None, notes)]))
    table.add_row("time", f"{seconds:.2f} s ({result.samples / seconds:.1f} samples/s)")
    ranged = sorted((t.max - t.min, name) for name, t in result.tensors.items()
                    if t.kind != "weight" and t.count)
    for label, picks in (("widest", ranged[::-1][:3]), ("narrowest", ranged[:3])):
        table.add_row(label, "\n".join(_range_text(name, result.tensors[name])
                                       for _, name in picks))
    console.results().print(table)


def _range_text(name: str, t: profile_format.TensorStats) -> str:
    note = "  (constant)" if t.min == t.max else ""
    return f"{name}  [{t.min:.6g}, {t.max:.6g}]{note}"


@click.group("profile")
def profile() -> None:
    """Inspect and combine profiles made by `ember quantize-profile`."""


@profile.command("merge")
@click.argument("profiles", nargs=-1, required=True, type=InputPath(dir_okay=False))
@click.option("-o", "--output",
              type=OutputPath(dir_okay=False, beside=("profiles", ".merged.json")),
              help="Merged profile to write.  [default: the first PROFILE with .merged.json]")
@click.option("--allow-same-data", is_flag=True,
              help="Merge runs over the same data (equal data digests), counting those "
                   "samples twice on purpose; refused by default.")
def merge(profiles: tuple[str, ...], output: str, allow_same_data: bool) -> None:
    """Combine shards of one model's profile, made over disjoint data.

    The result is exactly what one run over all the data would give: histograms share a
    power-of-two grid, so re-binning only adds neighbouring bins. Profiles of different
    models (or batch sizes, or weights) are refused.

    \b
    Example (two machines, then one file):
      ember quantize-profile m.onnx --data part1.npz -o p1.json
      ember quantize-profile m.onnx --data part2.npz -o p2.json
      ember profile merge p1.json p2.json -o m.profile.json
    """
    merged = profile_format.merge([profile_format.load(p) for p in profiles], allow_same_data)
    profile_format.save(merged, output)
    click.echo(f"merged {len(profiles)} profiles ({merged.samples} samples) into {output}")


@profile.command("show")
@click.argument("path", type=InputPath(dir_okay=False))
@json_option
def show(path: str, as_json: bool) -> None:
    """Print each tensor of a profile: kind, range, values counted, histogram bins; and the
    input shapes it was profiled at (? where the data chose)."""
    p = profile_format.load(path)
    rows = {name: {"kind": t.kind, "min": t.min, "max": t.max, "count": t.count,
                   "nonfinite": t.nonfinite, "bins": len(t.hist), "bin_width": t.bin_width,
                   **({} if t.channel_sum is None else
                      {"channel_means": t.channel_means().tolist()})}
            for name, t in p.tensors.items()}
    if as_json:
        click.echo(json.dumps({"fingerprint": p.model.digest, "samples": p.samples,
                               "input_shapes": p.input_shapes, "tensors": rows}, indent=1))
        return
    shapes = ", ".join(f"{name}[{','.join('?' if d is None else str(d) for d in dims)}]"
                       for name, dims in p.input_shapes.items())
    table = Table(title=f"{path}: {p.samples} samples of {shapes or 'the model'}, model "
                        f"{p.model.digest[:12]}")
    for column in ("tensor", "kind", "min", "max", "count", "nonfinite", "bins"):
        table.add_column(column, justify="left" if column in ("tensor", "kind") else "right")
    for name, r in rows.items():
        table.add_row(name, r["kind"], _number(r["min"]), _number(r["max"]), str(r["count"]),
                      str(r["nonfinite"]), str(r["bins"]))
    console.results().print(table)
    means = sum(1 for r in rows.values() if "channel_means" in r)
    click.echo(f"per-channel means (--channel-means, for --bias-correction): "
               f"{f'{means} tensors' if means else 'none'}")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"
