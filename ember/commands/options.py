"""Options shared by several commands, declared once."""

from __future__ import annotations

import click

model_argument = click.argument("model", type=click.Path(dir_okay=False))

input_shape_option = click.option(
    "--input-shape", "input_shapes", multiple=True, metavar="NAME=D0,D1,...",
    help="Fix a dynamic input shape, e.g. --input-shape input=1,3,224,224 (repeatable).")

json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON on stdout instead of a table.")
