"""Loading a model for a command: import, fix shapes, optimize — with the CLI's options."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from compiler.frontend.onnx import import_model, parse_input_shapes
from compiler.graph.ir import Graph
from ember.errors import EmberError
from ember.flow import optimized_graph
from profiler.sources.arrays import declared_arrays
from simulator.numerics import oversize


def load_graph(model_path: str, input_shapes: Sequence[str] = (), optimized: bool = True) -> Graph:
    shapes = parse_input_shapes(input_shapes)
    return optimized_graph(model_path, shapes) if optimized else import_model(model_path, shapes)


def check_array_file(path: str | Path) -> None:
    """Before np.load allocates them: refuse an .npy/.npz whose headers declare more bytes than
    the file holds, or an array larger than one tensor may be. Other files are left for
    np.load to reject as it always has."""
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError:
        return
    if magic != b"\x93NUMPY" and not magic.startswith(b"PK"):
        return
    kind = ".npy" if magic == b"\x93NUMPY" else ".npz"
    for name, (shape, dtype) in declared_arrays(path, kind).items():
        if (why := oversize(shape, dtype)) is not None:
            what = f"array {name!r}" if name else "its array"
            raise EmberError(f"{path}: {what} is too large: {why}")
