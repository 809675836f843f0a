"""`ember compile`: an fp32 ONNX model and its profile → an int8 program (.ember) for a target."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from compiler.backend.program import BackendOptions, Compiled
from compiler.frontend.onnx import parse_input_shapes
from ember import console
from ember.commands.options import (input_shape_option, json_option, model_argument,
                                    quant_options_from, quantization_options, warn_if_synthetic)
from ember.files import InputPath, OutputPath
from ember.flow import CompileOptions, compile_model
from ember.progress import progress_bar
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
@input_shape_option
@json_option
def compile_(model: str, int8: bool, target: str, emit_onnx: str | None, double_buffer: bool,
             allow_host: bool, output: str, input_shapes: tuple[str, ...], as_json: bool,
             **quant_kwargs) -> None:
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

    \b
    Example:
      ember quantize-profile model.onnx --data calib.npz -o model.profile.json
      ember compile model.onnx --int8 --profile model.profile.json --target edge -o model.ember
      ember simulate model.ember -i input.npz --report perf.json
    """
    profile_path = quant_kwargs["profile_path"]
    out = Path(output)
    options = CompileOptions(quant_options_from(quant_kwargs),
                             BackendOptions(double_buffer=double_buffer, allow_host=allow_host),
                             parse_input_shapes(input_shapes))
    with progress_bar() as progress:
        built = compile_model(model, profile_path, options, target, progress)
        # The machine's timing depends on the program alone, so the summary's cycles are
        # exactly those `ember simulate` will report, whatever the inputs.
        progress("timing the program", 0, None)
        cycles = machine.timing(built.compiled.program).cycles
    for name, shape in built.compiled.program.metadata["options"].get("input_shapes", {}).items():
        if name not in options.input_shapes:
            click.echo(f"ember: dynamic input {name!r} compiled as {name}="
                       f"{','.join(map(str, shape))}, from the profile (--input-shape to choose)",
                       err=True)
    warn_if_synthetic(profile_path)
    compiled, arch = built.compiled, built.compiled.program.arch
    if emit_onnx:
        export_qdq(built.qgraph, emit_onnx)
    compiled.program.save(out)
    report = {"model": model, "program": str(out), "target": arch.name, "cycles": cycles,
              **compiled.summary.to_dict()}
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        _print_summary(compiled, cycles, out, arch)


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
