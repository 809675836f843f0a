"""Regenerates the bundled example models; `ember examples build` is the command line for it.

Layout under the output directory, the same for the source tree (the default) and for `--out`:
  digits/model.onnx, digits/calib.npz, digits/eval.npz   trained CNN and its data (committed)
  models/resnet18.onnx, models/mobilenetv2.onnx, ...     seeded random weights (not committed)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from examples.zoo import MODELS
from simulator.program import output_mode

EXAMPLES_DIR = Path(__file__).resolve().parent
# The trained digits CNN, then every model of the zoo (so that a zoo model is always buildable).
NAMES = ("digits", *MODELS)


@dataclass(frozen=True)
class Written:
    path: Path
    size_bytes: int
    summary: str


def write_atomic(path: Path, data: bytes) -> None:
    """Writes to a temporary name in the same directory, then renames: never a half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(temp_name, output_mode())  # mkstemp makes it private; give open()'s mode
        os.replace(temp_name, path)
    except BaseException:
        os.unlink(temp_name)
        raise


def build_digits(out_dir: Path) -> list[Written]:
    from examples.digits import (
        train,  # imports scikit-learn; only this example needs it
    )

    result = train.build()
    summaries = {
        "model.onnx": f"eval top-1: numpy {result.accuracy_numpy:.2%}, "
                      f"onnxruntime {result.accuracy_onnxruntime:.2%}",
        "calib.npz": f"input ({result.calib_count},1,8,8) float32",
        "eval.npz": f"input ({result.eval_count},1,8,8) float32, labels int64",
    }
    return [_write(out_dir / "digits" / name, data, summaries[name])
            for name, data in result.files.items()]


def build_zoo_model(name: str, out_dir: Path) -> list[Written]:
    model = MODELS[name]()
    path = out_dir / "models" / f"{name}.onnx"
    return [_write(path, model.SerializeToString(), _describe(model))]


def _describe(model: onnx.ModelProto) -> str:
    """One line: parameter count and the shapes in and out."""
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)

    def shape(value: onnx.ValueInfoProto) -> str:
        return "x".join(str(d.dim_value) for d in value.type.tensor_type.shape.dim)

    graph = model.graph
    return f"{params / 1e6:.2f} M params, {shape(graph.input[0])} -> {shape(graph.output[0])}"


def _write(path: Path, data: bytes, summary: str) -> Written:
    write_atomic(path, data)
    return Written(path, len(data), summary)


def build_all(out_dir: Path | str = EXAMPLES_DIR, which: Iterable[str] = NAMES) -> list[Written]:
    """Builds the named examples in order and returns what was written."""
    unknown = sorted(set(which) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown example(s) {unknown}; expected some of {list(NAMES)}")
    written = []
    for name in which:
        if name == "digits":
            written += build_digits(Path(out_dir))
        else:
            written += build_zoo_model(name, Path(out_dir))
    return written


def print_table(written: list[Written]) -> None:
    """The results as a small table on stdout; long paths fold rather than lose characters."""
    from rich import box
    from rich.console import Console
    from rich.table import Column, Table

    table = Table(Column("file", overflow="fold"), "size", "summary", box=box.SIMPLE_HEAD)
    for item in written:
        table.add_row(_display_path(item.path), _human_size(item.size_bytes), item.summary)
    Console().print(table)


def _display_path(path: Path) -> str:
    """Relative to the working directory when under it, as a user would type it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _human_size(size_bytes: int) -> str:
    if size_bytes < 1000:
        return f"{size_bytes} B"
    if size_bytes < 1_000_000:
        return f"{size_bytes / 1e3:.1f} kB"
    return f"{size_bytes / 1e6:.1f} MB"


def zoo_model_path(name: str) -> Path:
    """examples/models/NAME.onnx, built the first time it is asked for (it is not committed)."""
    path = EXAMPLES_DIR / "models" / f"{name}.onnx"
    if not path.is_file():
        path.parent.mkdir(exist_ok=True)
        build_zoo_model(name, EXAMPLES_DIR)
    return path
