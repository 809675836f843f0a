"""Loading a model for a command: import, fix shapes, optimize — with the CLI's options."""

from __future__ import annotations

from typing import Sequence

from compiler.frontend.onnx import import_model, parse_input_shapes
from compiler.graph.ir import Graph
from ember.flow import optimized_graph


def load_graph(model_path: str, input_shapes: Sequence[str] = (), optimized: bool = True) -> Graph:
    shapes = parse_input_shapes(input_shapes)
    return optimized_graph(model_path, shapes) if optimized else import_model(model_path, shapes)
