"""`ember show`: print the imported graph, with shapes and types."""

from __future__ import annotations

import json

import click

from compiler.graph.printer import format_graph, graph_to_json
from ember.commands.options import input_shape_option, json_option, model_argument
from ember.loading import load_graph


@click.command()
@model_argument
@input_shape_option
@click.option("--optimize/--no-optimize", default=True, show_default=True,
              help="Apply the fp32 graph passes (constant and BatchNorm folding, Identity "
                   "removal, CSE, DCE) before printing.")
@json_option
def show(model: str, input_shapes: tuple[str, ...], optimize: bool, as_json: bool) -> None:
    """Print MODEL (an ONNX file) as ember's typed graph IR.

    \b
    Each line is one node:  %out = Op[node name](%input, @constant) {attrs} : type
    %name is a computed value and @name a constant; ONNX names are kept.

    \b
    Example:
      ember show examples/digits/model.onnx
      ember show resnet.onnx --input-shape data=1,3,224,224 --json | jq '.nodes | length'
    """
    graph = load_graph(model, input_shapes, optimize)
    if as_json:
        click.echo(json.dumps(graph_to_json(graph), indent=1))
    else:
        click.echo(format_graph(graph))
