"""`ember round-weights`: weight codes chosen for each layer's output on calibration data."""

from __future__ import annotations

import json

import click
from rich.table import Table

from compiler.frontend.onnx import parse_input_shapes
from ember import console
from ember.commands.options import (data_options, image_options_from, input_shape_option,
                                    json_option, model_argument, quant_options_from,
                                    quantization_options)
from ember.errors import EmberError
from ember.files import OutputPath
from ember.progress import progress_bar
from ember.rounding import INPUTS, round_weights


@click.command("round-weights")
@model_argument
@quantization_options
@data_options("--data", what="Calibration data (the inputs each layer's codes are chosen for)",
              required=True)
@click.option("-o", "--output",
              type=OutputPath(dir_okay=False, beside=("model", ".rounding.npz")),
              help="Rounding file to write.  [default: MODEL with .rounding.npz]")
@click.option("--inputs", type=click.Choice(INPUTS), default="fp32", show_default=True,
              help="Fit each layer to its inputs in the fp32 model, or in the quantized model "
                   "(the layers before it already rounded, the activations quantized), or "
                   "to those with the fp32 layer's output as the target (matched).")
@input_shape_option
@json_option
def round_weights_(model: str, data: str, samples: int | None, output: str,
                   input_shapes: tuple[str, ...], inputs: str, as_json: bool,
                   **kwargs) -> None:
    """Choose MODEL's int8 weight codes for each layer's output on calibration data.

    Nearest rounding minimizes each weight's own error, not what the layer computes: this
    runs the model over --data, takes each Conv's, Gemm's and MatMul's inputs, and rounds its
    weights one column at a time, pushing each rounding error onto the columns not yet
    rounded (error-compensated rounding, GPTQ; AdaRound's objective). With --inputs fp32,
    each layer is fitted to the fp32 model's inputs; with quantized, to its inputs in the
    quantized model, the layers before it already rounded; with matched, to those too, so
    that its output there stays near the fp32 layer's. A layer keeps such codes only when codes chosen on half
    the samples also cut its error on the other half (else its inputs have more dimensions
    than the samples show, and it keeps its nearest codes). The scales stay the quantizer's
    for the same options, so programs keep their arithmetic and cycles; `ember compile` and
    `ember accuracy` take the file with --weight-rounding and the same quantizer options.

    \b
    Examples:
      ember round-weights model.onnx --profile model.profile.json --data calib.npz
      ember compile model.onnx --profile model.profile.json \\
          --weight-rounding model.rounding.npz -o model.ember
    """
    profile_path = kwargs["profile_path"]
    images = image_options_from(kwargs)
    options = quant_options_from(kwargs)
    if options.weight_rounding:
        raise click.UsageError("--weight-rounding reads a rounding file; round-weights writes "
                               "one (-o)")
    with progress_bar() as progress:
        done = round_weights(model, profile_path, data, options, output,
                             parse_input_shapes(input_shapes), samples, images, progress,
                             inputs)
    if not done.layers:
        raise EmberError(f"{model}: nothing rounded")
    if as_json:
        click.echo(json.dumps({
            "model": model, "output": output, "inputs": inputs, "samples": done.samples,
            "seconds": done.seconds,
            "layers": [{"weight": r.weight, "node": r.node, "groups": r.groups,
                        "rows": r.rows, "columns": r.columns,
                        "nearest_error": r.nearest_error, "chosen_error": r.chosen_error,
                        "gain_db": r.gain_db, "compensated": r.compensated}
                       for r in done.layers]}, indent=1))
        return
    shown = sorted(done.layers, key=lambda r: -r.gain_db)
    compensated = sum(r.compensated for r in done.layers)
    table = Table(title=f"ember round-weights → {output}: {compensated} of {len(done.layers)} "
                        f"weights compensated, on {done.samples} samples in {done.seconds:.1f} "
                        f"s (largest gain on the samples first)")
    for col in ("weight", "node", "groups x rows x columns", "output error, nearest",
                "chosen", "gain dB"):
        table.add_column(col, justify="left" if col in ("weight", "node") else "right")
    for r in shown[:20]:
        table.add_row(r.weight, r.node, f"{r.groups} x {r.rows} x {r.columns}",
                      f"{r.nearest_error:.4g}", f"{r.chosen_error:.4g}",
                      f"{r.gain_db:+.2f}" if r.compensated else "nearest (check failed)")
    console.results().print(table)
    if len(shown) > 20:
        click.echo(f"... and {len(shown) - 20} more (--json for all)")
