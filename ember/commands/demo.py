"""`ember demo`: the whole flow on the bundled digits model, in one command."""

from __future__ import annotations

from pathlib import Path

import click

from ember.demo import run_demo


@click.command()
@click.option("-o", "--out", "out_dir", default="out/demo", show_default=True,
              type=click.Path(file_okay=False),
              help="Directory for everything the demo writes.")
def demo(out_dir: str) -> None:
    """Run ember end to end on the bundled 8x8-digits CNN (examples/digits).

    \b
    Today the flow is:
      1. import the ONNX model, run the fp32 graph passes, print the graph;
      2. run ember's fp32 reference interpreter on the held-out digits and
         compare it with onnxruntime (max relative error, top-1 accuracy).
    It lists the files it wrote at the end.
    """
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    run_demo(Path(out_dir))
