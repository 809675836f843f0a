"""`ember examples build`: regenerates the bundled example models and their data."""

from __future__ import annotations

from pathlib import Path

import click

from ember.errors import EmberError
from examples.build import EXAMPLES_DIR, NAMES, build_all, print_table


@click.group()
def examples() -> None:
    """Bundled example models: a trained digits CNN and standard architectures.

    \b
    Example:
      ember examples build --only digits
    """


@examples.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=EXAMPLES_DIR, show_default="examples/ in the source tree",
              help="Directory to write under; digits/ and models/ are created inside it.")
@click.option("--only", multiple=True, type=click.Choice(NAMES),
              help="Build only this example; repeat the option for several. Default: all.")
def build(out_dir: Path, only: tuple[str, ...]) -> None:
    """Regenerate the example models, then list what was written.

    \b
    Under the output directory:
      digits/model.onnx      CNN trained in numpy on scikit-learn's 8x8 digits (a few seconds),
                             input "input" 1x1x8x8, output "logits" 1x10
      digits/calib.npz       256 training images for calibration: key "input", (N,1,8,8)
      digits/eval.npz        450 held-out images, key "input", and their "labels"
      models/resnet18.onnx   ResNet-18, 1x3x224x224 -> 1x1000 (47 MB)
      models/mobilenetv2.onnx
      models/squeezenet.onnx SqueezeNet 1.1, 1x3x224x224 -> 1x1000 (5 MB)
      models/mlp.onnx        784-512-256-10
      models/mobilenetv3_small.onnx  hard-swish written out, squeeze-and-excitation
      models/yolo.onnx       a small YOLO-style detector, 1x3x256x256 -> box/class maps
      models/unet.onnx       a small U-Net with ConvTranspose, 1x3x128x128 -> 1x2x128x128
      models/efficientnet_lite0.onnx  with dead channels (BN gamma 1e-9), 1x3x224x224 -> 1x1000
    The zoo models have seeded random weights: they are for compiling and benchmarking,
    not for predicting. Builds are deterministic; on one machine, a rebuild gives the same bytes.

    \b
    Example:
      ember examples build --only digits --only mlp --out /tmp/examples
    """
    written = []
    for name in dict.fromkeys(only) or NAMES:
        click.echo(f"building {name} ...", err=True)
        try:
            written += build_all(out_dir, (name,))
        except ImportError as err:
            raise EmberError(f"example {name!r} needs {err.name}: pip install 'ember[examples]'")
        except OSError as err:
            raise EmberError(f"{out_dir}: cannot write example {name!r}: "
                             f"{err.strerror or err}") from None  # not the temporary name
    print_table(written)
