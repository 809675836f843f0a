"""`ember simulate`: run a program on the simulator; write outputs, a report and a trace."""

from __future__ import annotations

import hashlib
import io
import json
from importlib import metadata
from pathlib import Path

import click
import numpy as np
from rich.console import Console

from compiler.backend.codegen.host import check_segments, run_segment
from ember.commands.options import json_option
from ember.errors import EmberError
from ember.files import InputPath, OutputPath
from ember.loading import check_array_file
from ember.reports.performance import PerformanceReport
from simulator import machine, trace
from simulator.program import Program, write_atomic


@click.command()
@click.argument("program", type=InputPath(dir_okay=False))
@click.option("-i", "--input", "input_path", required=True, type=InputPath(dir_okay=False),
              help="Inputs: a .npy (programs with one input) or a .npz keyed by input name. "
                   "Float arrays are quantized with the program's scale and zero point; int8 "
                   "arrays are taken raw. A leading batch axis runs each sample.")
@click.option("-o", "--output", type=OutputPath(dir_okay=False),
              help="Write the outputs to this .npz, keyed by output name.")
@click.option("--raw", is_flag=True, help="Write the int8 outputs instead of dequantized floats.")
@click.option("--report", type=OutputPath(dir_okay=False),
              help="Write the performance report here: JSON, or the HTML page (roofline, "
                   "where the cycles go, per-layer table) when the name ends in .html.")
@click.option("--trace", "trace_path", type=OutputPath(dir_okay=False),
              help="Write a Chrome trace-event timeline (opens in Perfetto) here.")
@click.option("--trace-level", type=click.Choice(trace.LEVELS), default="layer",
              show_default=True, help="One slice per layer run, or per instruction too.")
@click.option("--check-hazards/--no-check-hazards", default=True, show_default=True,
              help="Reject cross-queue accesses to local memory that no dependency token "
                   "orders (a race), even when the timing hides them.")
@json_option
def simulate(program: str, input_path: str, output: str | None, raw: bool, report: str | None,
             trace_path: str | None, trace_level: str, check_hazards: bool,
             as_json: bool) -> None:
    """Run PROGRAM (an .ember file) bit-exactly, with cycle-approximate timing.

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
      ember simulate model.ember -i input.npz --report perf.html
    """
    prog = Program.load(program)
    check_segments(prog, program)
    samples, batch = read_inputs(prog, input_path)
    results = [machine.run(prog, sample, check_hazards=check_hazards, host=run_segment)
               for sample in samples]
    first = results[0]
    if output:
        outputs = {}
        for b in prog.outputs:
            values = np.stack([r.outputs[b.name] for r in results]) if batch else \
                first.outputs[b.name]
            outputs[b.name] = values if raw else b.dequantize(values)
        buffer = io.BytesIO()
        np.savez(buffer, **outputs)
        write_atomic(output, buffer.getvalue())
    perf = performance_doc(program, input_path, samples, batch, first,
                           {"raw": raw, "trace_level": trace_level,
                            "check_hazards": check_hazards})
    text = json.dumps(perf, indent=2)
    if report and Path(report).suffix.lower() in (".html", ".htm"):
        write_atomic(report, PerformanceReport.from_report(perf, program).html().encode())
    elif report:
        write_atomic(report, (text + "\n").encode())
    if trace_path:
        events = trace.chrome_trace(prog, first.timeline, trace_level)
        write_atomic(trace_path, json.dumps(events, separators=(",", ":")).encode())
    if as_json:
        click.echo(text)
    else:
        PerformanceReport.from_report(perf, program).print(Console())


def performance_doc(program: str, input_path: str, samples: list[dict], batch: int,
                    result: machine.Result, options: dict) -> dict:
    """The JSON performance report of one run, with what reproduces it under "run"."""
    perf = result.stats.to_report()
    perf["run"] = {
        "tool": {"name": "ember", "version": _version()},
        "program": {"path": program, "sha256": _sha256(Path(program).read_bytes())},
        "inputs": {"path": input_path, "batch": batch or 1,
                   "sha256": {name: _sha256(np.ascontiguousarray(a).tobytes())
                              for name, a in sorted(samples[0].items())}},
        "options": options,
    }
    return perf


def read_inputs(prog: Program, path: str) -> tuple[list[dict], int]:
    """Quantized samples keyed by input name, and the batch size (0: no batch axis)."""
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
    batches = set()
    quantized = {}
    for b in prog.inputs:
        a = arrays[b.name]
        if a.shape == b.shape:
            batches.add(0)
        elif a.shape[1:] == b.shape:
            batches.add(a.shape[0])
        elif b.shape and b.shape[0] == 1 and a.ndim == len(b.shape) and a.shape[1:] == b.shape[1:]:
            a = a.reshape((a.shape[0],) + tuple(b.shape))  # samples on the model's batch axis
            batches.add(a.shape[0])
        else:
            raise EmberError(f"{path}: input {b.name!r} has shape {list(a.shape)}, expected "
                             f"{list(b.shape)} (optionally with a leading batch axis)")
        if a.dtype == np.dtype(b.dtype):
            quantized[b.name] = a
        elif np.issubdtype(a.dtype, np.floating):
            quantized[b.name] = b.quantize(a)
        else:
            raise EmberError(f"{path}: input {b.name!r} is {a.dtype}: expected floats to "
                             f"quantize or raw {b.dtype}")
    if len(batches) > 1:
        raise EmberError(f"{path}: inputs disagree on the batch axis")
    batch = batches.pop() if batches else 0
    if not batch:
        return [quantized], 0
    return [{name: a[n] for name, a in quantized.items()} for n in range(batch)], batch


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _version() -> str:
    try:
        return metadata.version("ember")
    except metadata.PackageNotFoundError:
        return "unknown"
