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
    The flow:
      1. import the ONNX model and run the fp32 graph passes (ember show);
      2. ember's fp32 reference interpreter against onnxruntime (ember run);
      3. profile the calibration set (ember quantize-profile);
      4. quantize and compile for the default target (ember compile --int8);
      5. simulate one image with a performance report (JSON, and HTML with a
         roofline: ember report) and a Perfetto timeline (ember simulate
         --report --trace);
      6. run the program on every held-out image against fp32 onnxruntime and,
         bit for bit, against the integer reference (ember accuracy), with an
         HTML report.
    It lists the files it wrote at the end.
    """
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    run_demo(ctx, Path(out_dir))
