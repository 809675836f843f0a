"""`ember demo`: the whole flow on the bundled digits model, in one command."""

from __future__ import annotations

from pathlib import Path

import click

from ember.demo import run_demo


@click.command()
@click.pass_context
@click.option("-o", "--out", "out_dir", default="out/demo", show_default=True,
              type=click.Path(file_okay=False),
              help="Directory for everything the demo writes.")
def demo(ctx: click.Context, out_dir: str) -> None:
    """Run ember end to end on the bundled 8x8-digits CNN (examples/digits).

    \b
    Today the flow is:
      1. import the ONNX model and run the fp32 graph passes (ember show);
      2. ember's fp32 reference interpreter against onnxruntime (ember run);
      3. profile the calibration set (ember quantize-profile);
      4. quantize and measure int8 against fp32 onnxruntime, per layer too
         (ember accuracy), with an HTML report.
    It lists the files it wrote at the end.
    """
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    run_demo(ctx, Path(out_dir))
