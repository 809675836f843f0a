"""`ember simulate`: run a program on the simulator; write outputs, a report and a trace."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import click
import numpy as np

from compiler.backend.codegen.host import check_segments, run_segment
from compiler.backend.progress import Progress, quiet
from compiler.frontend.onnx import parse_input_shapes
from ember import checked, console, preprocessing
from ember.commands.options import (
    batch_option,
    data_options,
    image_options_from,
    json_option,
    program_shape_option,
)
from ember.errors import EmberError
from ember.files import InputPath, OutputPath
from ember.loading import check_array_file
from ember.progress import progress_bar
from ember.reports.performance import PerformanceReport
from profiler import batching
from profiler.model_inputs import InputSpec
from profiler.sources import open_data
from profiler.sources.images import ImageOptions
from simulator import machine, trace
from simulator.program import Program, write_atomic
from simulator.stats import Stats


@click.command()
@click.argument("program", type=InputPath(dir_okay=False))
@data_options("-i", "--input", required=True, what="Inputs, every sample run")
@click.option("-o", "--output", type=OutputPath(dir_okay=False),
              help="Write the outputs to this .npz, keyed by output name.")
@click.option("--raw", is_flag=True, help="Write the int8 outputs instead of dequantized floats.")
@click.option("--report", type=OutputPath(dir_okay=False),
              help="Write the JSON performance report here (as `ember report --report`); a "
                   "name ending in .html writes the HTML page instead, as --html does.")
@click.option("--html", "html_path", type=OutputPath(dir_okay=False),
              help="Write the self-contained HTML performance page here (roofline, where the "
                   "cycles go, per-layer table), as `ember report --html` does.")
@click.option("--trace", "trace_path", type=OutputPath(dir_okay=False),
              help="Write a Chrome trace-event timeline (opens in Perfetto) here.")
@click.option("--trace-level", type=click.Choice(trace.LEVELS), default="layer",
              show_default=True, help="One slice per layer run, or per instruction too.")
@click.option("--check-hazards/--no-check-hazards", default=True, show_default=True,
              help="Reject cross-queue accesses to local memory that no dependency token "
                   "orders (a race), even when the timing hides them.")
@click.option("--no-checks", "reuse_checks", is_flag=True,
              help="For speed: skip the race check when this very program passed it before "
                   "(ember remembers each program that passes, by its SHA-256, in "
                   "~/.cache/ember); a program not seen before is checked this once.")
@batch_option
@program_shape_option
@json_option
def simulate(program: str, data: str, samples: int | None, output: str | None, raw: bool,
             report: str | None, html_path: str | None, trace_path: str | None,
             trace_level: str, check_hazards: bool, reuse_checks: bool, batch: int | None,
             input_shapes: tuple[str, ...], as_json: bool, **image_kwargs) -> None:
    """Run PROGRAM (an .ember file) bit-exactly, with cycle-approximate timing.

    Float inputs are quantized with the program's scale and zero point; .npy/.npz arrays of
    its int8 type are taken raw. Samples on a leading axis are runs of the program; samples
    on the model's batch axis run in groups of the program's batch size (the last filled
    with zero-point samples, their outputs dropped), and the outputs hold one row per sample.
    The program is timed once (the timing does not depend on the values; the report times one
    run), then --batch runs execute at once.

    \b
    The report's keys: cycles, time_ms, bound_cycles (roofline: max of the model's MACs / array
    size, compulsory DRAM bytes / DMA bandwidth and the host segments' cycles), macs (issued to
    the array) and mac_utilization, model_macs, peak_macs_per_cycle, dram_bytes_per_cycle,
    utilization (per unit; "host" for host segments), busy_cycles, stall_cycles,
    dram_bytes_read, dram_bytes_written, compulsory_dram_bytes, energy_uj, host_cycles,
    host_segments (name, nodes, cycles, read_bytes, write_bytes, compute_cycles), layers (name,
    unit: accelerator|host, cycles, start_cycle, macs (issued), dram_bytes, bound_cycles, bound_by:
    array|dram|vector|host, busy_cycles and unit_spans per unit), run.
    `ember report perf.json` renders a saved report again.

    \b
    Example:
      ember simulate model.ember -i input.npz -o out.npz --report perf.json --trace trace.json
      ember simulate model.ember -i input.npz --html perf.html
    """
    prog = Program.load(program)
    check_segments(prog, program)
    check_shapes(prog, program, input_shapes)
    feeds = read_inputs(prog, data, image_options_from(image_kwargs), samples)
    if (note := feeds.describe()) is not None:
        click.echo(f"ember: {note}", err=True)
    program_bytes = Path(program).read_bytes()
    passed_before = check_hazards and reuse_checks and checked.passed(program_bytes)
    if reuse_checks and check_hazards and not passed_before:
        click.echo("ember: --no-checks: this program has not passed the race check before; "
                   "checking it this once", err=True)
    ready = machine.Machine(prog, check_hazards=check_hazards and not passed_before,
                            host=run_segment)
    if check_hazards and not passed_before:
        checked.remember(program_bytes)
    with progress_bar() as progress:
        results = run_batches(ready, feeds.runs, batch, progress)
    if output:
        outputs = {}
        for b in prog.outputs:
            values = feeds.outputs(results, b.name)
            outputs[b.name] = values if raw else b.dequantize(values)
        buffer = io.BytesIO()
        np.savez(buffer, **outputs)
        write_atomic(output, buffer.getvalue())
    perf = performance_doc(program, data, feeds, ready.stats,
                           {"raw": raw, "trace_level": trace_level,
                            "check_hazards": check_hazards,
                            "race_check": "passed before" if passed_before
                            else "ran" if check_hazards else "off"})
    text = json.dumps(perf, indent=2)
    html_paths = [html_path]
    if report and Path(report).suffix.lower() in (".html", ".htm"):  # the older --html
        html_paths, report = [html_path, report], None
    for page in filter(None, html_paths):
        write_atomic(page, PerformanceReport.from_report(perf, program).html().encode())
    if report:
        write_atomic(report, (text + "\n").encode())
    if trace_path:
        events = trace.chrome_trace(prog, ready.timeline, trace_level)
        write_atomic(trace_path, json.dumps(events, separators=(",", ":")).encode())
    if as_json:
        click.echo(text)
    else:
        PerformanceReport.from_report(perf, program).print(console.results())


def run_batches(ready: machine.Machine, runs: list[dict[str, np.ndarray]],
                batch: int | None, progress: Progress = quiet) -> list[dict[str, np.ndarray]]:
    """Each run's outputs, the runs executed `batch` at a time (None: `Machine.batch`)."""
    size = batch or ready.batch
    results: list[dict[str, np.ndarray]] = []
    progress("simulating", 0, len(runs))
    for start in range(0, len(runs), size):
        group = runs[start:start + size]
        got = ready.outputs({name: np.stack([run[name] for run in group])
                             for name in group[0]}, first=start)
        results.extend({name: values[n] for name, values in got.items()}
                       for n in range(len(group)))
        progress("simulating", len(results), len(runs))
    return results


def performance_doc(program: str, input_path: str, feeds: Feeds, stats: Stats,
                    options: dict) -> dict:
    """The JSON performance report of one run (the first of `feeds`), with what reproduces it
    under "run": the inputs' `batch` of samples, in `runs` runs."""
    perf = stats.to_report()
    perf["run"] = {
        "tool": {"name": "ember", "version": _version()},
        "program": {"path": program, "sha256": _sha256(Path(program).read_bytes())},
        "inputs": {"path": input_path, "batch": feeds.samples or 1, "runs": len(feeds.runs),
                   "sha256": {name: _sha256(np.ascontiguousarray(a).tobytes())
                              for name, a in sorted(feeds.runs[0].items())}},
        "options": options,
    }
    return perf


def check_shapes(prog: Program, path: str, input_shapes: tuple[str, ...]) -> None:
    """--input-shape given for a program must name its inputs at the shapes it has."""
    names = [b.name for b in prog.inputs]
    for name, shape in parse_input_shapes(input_shapes).items():
        if name not in names:
            raise EmberError(f"{path}: --input-shape names {name!r}, but the program's inputs "
                             f"are {names}")
        compiled = prog.inputs[names.index(name)].shape
        if tuple(compiled) != shape:
            raise EmberError(f"{path}: compiled for {name}={','.join(map(str, compiled))}, not "
                             f"{','.join(map(str, shape))}: a program's shapes are fixed; "
                             f"recompile with `ember compile --input-shape "
                             f"{name}={','.join(map(str, shape))}`")


@dataclass(frozen=True)
class Feeds:
    """The program's runs over the samples `-i` gave, and how their outputs go back together.

    Samples on a leading axis run one at a time; samples on the model's own batch axis run
    in groups of the program's batch size, the last group filled with zero-point samples
    (`padded`) whose outputs are dropped.
    """

    runs: list[dict[str, np.ndarray]]  # quantized inputs of each run, keyed by input name
    samples: int  # 0: one set of inputs without a sample axis
    batch: int  # samples per run: the program's batch when samples lie on its batch axis
    padded: int = 0

    def outputs(self, results: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
        """Output `name` of every sample, from each run's outputs."""
        if not self.samples:
            return results[0][name]
        if self.batch == 1:
            return np.stack([r[name] for r in results])
        return np.concatenate([r[name] for r in results])[:self.samples]

    def describe(self) -> str | None:
        """What a reader of one run's report must know, or None for a single run."""
        if len(self.runs) == 1 and not self.padded:
            return None
        filled = (f" (the last filled with {self.padded} zero-point samples, their outputs "
                  f"dropped)" if self.padded else "")
        return (f"{self.samples} samples in {len(self.runs)} runs of {self.batch}{filled}; "
                f"the report times one run: the timing does not depend on the values")


def read_inputs(prog: Program, path: str, images: ImageOptions = ImageOptions(),
                limit: int | None = None) -> Feeds:
    """The runs over the samples in `path`, in any data form `--data` takes: floats (and
    integers wider than a byte) are quantized with the program's scale and zero point, arrays
    of the binding's type (.npy and .npz only) are taken raw."""
    if Path(path).suffix in (".npy", ".npz"):
        arrays = _array_file(prog, path)
        preprocessing.warn_if_differs(None, images, None, f"-i {path}")
    else:
        specs = [InputSpec(b.name, np.dtype(np.int64 if b.dtype == "int32" else np.float32),
                           (None, *b.shape[1:])) for b in prog.inputs]
        source = open_data(path, specs, images, "-i")
        preprocessing.warn_if_differs(preprocessing.recorded_by(prog), images, source,
                                      f"-i {path}")
        batches = list(batching.stream(source, specs, 64, False, limit, False,
                                       batching.Tally()))
        if not batches:
            raise EmberError(f"{path}: no samples")
        arrays = {b.name: np.concatenate([batch[b.name] for batch in batches])
                  for b in prog.inputs}
    forms = set()
    quantized = {}
    for b in prog.inputs:
        a = arrays[b.name]
        if a.shape == b.shape:
            forms.add(("whole", 0))
        elif a.shape[1:] == b.shape:
            forms.add(("leading", a.shape[0]))
        elif b.shape and a.ndim == len(b.shape) and a.shape[1:] == b.shape[1:]:
            forms.add(("batch", a.shape[0]))  # samples on the model's batch axis
        else:
            raise EmberError(f"{path}: input {b.name!r} has shape {list(a.shape)}, expected "
                             f"{list(b.shape)} (optionally with a leading batch axis)")
        if b.dtype == "int32":  # integer indices (token ids) go in as they are
            if a.dtype.kind not in "iu":
                raise EmberError(f"{path}: input {b.name!r} is {a.dtype}: expected integers "
                                 f"(int32 or int64 indices)")
            quantized[b.name] = b.quantize(a)
        elif a.dtype == np.dtype(b.dtype):
            quantized[b.name] = a
        elif np.issubdtype(a.dtype, np.floating) or (a.dtype.kind in "iu" and
                                                      a.dtype.itemsize > 1):
            # Wider integers are values too: a model's integer mask, which it casts to float.
            quantized[b.name] = b.quantize(a)
        else:
            raise EmberError(f"{path}: input {b.name!r} is {a.dtype}: expected values to "
                             f"quantize (floats, or integers of 16 bits or more) or raw "
                             f"{b.dtype}")
    if len(forms) > 1:
        raise EmberError(f"{path}: inputs disagree on the batch axis")
    form, count = forms.pop()
    if limit is not None and form != "whole":
        count = min(count, limit)
    if form == "whole":
        return Feeds([quantized], 0, 1)
    if form == "leading":
        return Feeds([{name: a[n] for name, a in quantized.items()} for n in range(count)],
                     count, 1)
    batch = prog.inputs[0].shape[0]
    padded = -count % batch
    filled = {b.name: np.concatenate([quantized[b.name][:count], np.broadcast_to(
        b.quantize(np.zeros(b.shape[1:], np.int32 if b.dtype == "int32" else np.float32)),
        (padded, *b.shape[1:]))]) for b in prog.inputs}
    return Feeds([{name: a[start:start + batch] for name, a in filled.items()}
                  for start in range(0, count + padded, batch)], count, batch, padded)


def _array_file(prog: Program, path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npy or .npz, keyed by the program's input names."""
    check_array_file(path)
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            arrays = {"": loaded}
        else:
            with loaded:
                arrays = {key: loaded[key] for key in loaded.files}
    except (OSError, ValueError, EOFError) as err:  # EOFError: an empty file
        raise EmberError(f"{path}: cannot read inputs: {err}") from None
    if "" in arrays:
        if len(prog.inputs) != 1:
            raise EmberError(f"{path}: a .npy holds one array but the program takes "
                             f"{len(prog.inputs)} inputs {[b.name for b in prog.inputs]}; "
                             f"use a .npz keyed by input name")
        arrays = {prog.inputs[0].name: arrays[""]}
    names = [b.name for b in prog.inputs]
    if "labels" not in names:
        arrays.pop("labels", None)  # ground truth beside the inputs, never an input
    if sorted(arrays) != sorted(names):
        raise EmberError(f"{path}: has arrays {sorted(arrays)}, the program takes {names}")
    return arrays


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _version() -> str:
    try:
        return metadata.version("ember")
    except metadata.PackageNotFoundError:
        return "unknown"
