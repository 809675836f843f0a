"""The model's data inputs as the profiler feeds them, with dynamic dims fixed on request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from profiler.errors import ProfileError
from profiler.fingerprint import any_size, graph_inputs


@dataclass(frozen=True)
class InputSpec:
    """One model input: element type and shape, with None for a dynamic dimension.

    The first axis is the batch axis; calibration data holds samples along it.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    def __str__(self) -> str:
        return "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"

    @property
    def fixed_batch(self) -> int | None:
        return self.shape[0] if self.shape else None


def input_specs(model: onnx.ModelProto, overrides: dict[str, tuple[int, ...]]) -> list[InputSpec]:
    """Specs of the data inputs; `overrides` (from --input-shape) replace declared shapes."""
    specs = []
    for vi in graph_inputs(model):
        tensor = vi.type.tensor_type
        dtype = _input_dtype(vi.name, tensor.elem_type)
        shape = tuple(d.dim_value if d.HasField("dim_value") and not any_size(d) else None
                      for d in tensor.shape.dim)
        # A size of 0 holds no samples: drawing --random ones until there are enough never ends.
        if any(d is not None and d < 1 for d in shape):
            raise ProfileError(f"model input {vi.name!r} has shape "
                               f"{InputSpec(vi.name, dtype, shape)}: expected positive sizes (or "
                               f"named dynamic dimensions)")
        if vi.name in overrides:
            fixed = overrides[vi.name]
            if len(fixed) != len(shape) or any(d is not None and d != f
                                               for d, f in zip(shape, fixed)):
                raise ProfileError(f"--input-shape {vi.name}={','.join(map(str, fixed))} does "
                                   f"not fit the model's shape {InputSpec(vi.name, dtype, shape)}")
            shape = fixed
        specs.append(InputSpec(vi.name, dtype, shape))
    unknown = set(overrides) - {s.name for s in specs}
    if unknown:
        raise ProfileError(f"--input-shape names '{sorted(unknown)[0]}', which is not an input "
                           f"of the model (inputs: {', '.join(s.name for s in specs)})")
    if not specs:
        raise ProfileError("the model has no data inputs to feed")
    return specs


# The element types data can be fed as: numpy's own numeric types (ml_dtypes' float8 and
# bfloat16 cannot be hashed or written to .npz; strings and complex numbers are no data).
_FEEDABLE = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "float32", "float64")


def _input_dtype(name: str, elem_type: int) -> np.dtype:
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except KeyError:  # UNDEFINED, or no type ONNX defines
        dtype = None
    if dtype is None or dtype.name not in _FEEDABLE:
        kind = onnx.TensorProto.DataType.Name(elem_type) \
            if elem_type in onnx.TensorProto.DataType.values() else f"number {elem_type}"
        raise ProfileError(f"model input {name!r} has element type {kind}: expected one of "
                           f"{', '.join(_FEEDABLE)}")
    return dtype


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`name=1,3,224,224` -> ('name', (1, 3, 224, 224))."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or min(shape) < 1:
        raise ProfileError(f"--input-shape '{text}': expected NAME=D0,D1,... with positive "
                           f"integers, e.g. input=1,3,224,224")
    return name, shape
