"""Transpose and Pad on the accelerator: a Transpose whose input bytes are already in its
output's order is a view (the PicoDet head's [1, C, HW] -> [1, HW, C] of a channels-last map),
any other is an identity-table copy at permuted strides; a Pad no consumer absorbs is a copy
into a View of a buffer holding the pad value. Bit-exact, with no host segment."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.backend.lower import lower
from compiler.errors import CompileError
from tests.e2e.flow import compile_and_check, quantized, samples
from tests.onnx_builder import model, weights

C = 10  # two channel blocks on the edge preset (8 lanes), a partial one on default (16)


def conv_then(nodes, output_shape, inputs=None, seed: int = 0, **inits):
    """x [1, 3, 6, 4] → Conv (C channels, 'c') → `nodes` → y."""
    rng = np.random.default_rng(seed)
    head = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv")]
    return model(head + nodes, {"x": [1, 3, 6, 4], **(inputs or {})}, {"y": output_shape},
                 {"w": weights(rng, C, 3, 3, 3), "b": weights(rng, C), **inits})


def copies(compiled) -> list[dict]:
    """The program's layers other than the Conv (the copies Transpose and Pad lower to)."""
    return [layer for layer in compiled.summary.per_layer if layer["name"] != "conv"]


def head_transpose():
    """The PicoDet head: Conv → Reshape [1, C, HW] → Transpose [0, 2, 1] → output."""
    return conv_then([helper.make_node("Reshape", ["c", "shape"], ["r"], name="flat"),
                      helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1], name="t")],
                     [1, 24, C], shape=np.array([1, C, 24], np.int64))


TRANSPOSES = {
    # A view: no layer at all.
    "head": (head_transpose, 0),
    # A view read by another op (a Relu over the [1, HW, C] value).
    "interior": (lambda: conv_then(
        [helper.make_node("Reshape", ["c", "shape"], ["r"], name="flat"),
         helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1], name="t"),
         helper.make_node("Relu", ["t"], ["y"], name="relu")],
        [1, 24, C], shape=np.array([1, C, 24], np.int64)), 1),
    # H and W swapped: channels stay contiguous, one strided copy.
    "spatial": (lambda: conv_then(
        [helper.make_node("Transpose", ["c"], ["y"], perm=[0, 1, 3, 2], name="t")],
        [1, C, 4, 6]), 1),
    # The channel axis moves (NCHW -> NHWC as a logical transpose): an element-wise gather.
    "channels": (lambda: conv_then(
        [helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1], name="t")],
        [1, 6, 4, C]), 1),
}


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("form", list(TRANSPOSES))
def test_a_transpose_runs_on_the_accelerator(form: str, preset: str) -> None:
    build, count = TRANSPOSES[form]
    compiled, _ = compile_and_check(build(), preset)
    assert compiled.program.host_segments == ()
    assert len(copies(compiled)) == count


def padded(after: str, pads, value: float | None = None, mode: str = "constant"):
    """Conv → Pad(pads, value) → an output, or an Add or Concat with a second input."""
    inputs = ["c", "pads"] + (["value"] if value is not None else [])
    inits = {"pads": np.array(pads, np.int64)}
    if value is not None:
        inits["value"] = np.array(value, np.float32)
    shape = [1, C + pads[1] + pads[5], 6 + pads[2] + pads[6], 4 + pads[3] + pads[7]]
    pad = helper.make_node("Pad", inputs, ["p" if after != "output" else "y"], name="pad",
                           mode=mode)
    if after == "output":
        return conv_then([pad], shape, **inits)
    if after == "add":
        second = helper.make_node("Add", ["p", "z"], ["y"], name="add")
        return conv_then([pad, second], shape, {"z": shape}, **inits)
    second = helper.make_node("Concat", ["p", "z"], ["y"], axis=1, name="cat")
    return conv_then([pad, second], [1, C + 2, *shape[2:]], {"z": [1, 2, *shape[2:]]}, **inits)


PADS = {
    "output": ("output", (0, 0, 1, 2, 0, 0, 2, 1), None),
    "add": ("add", (0, 0, 1, 1, 0, 0, 1, 1), None),
    "concat": ("concat", (0, 0, 0, 1, 0, 0, 2, 0), None),
    "value": ("output", (0, 0, 1, 1, 0, 0, 0, 1), 1.5),
    "crop": ("add", (0, 0, -1, 2, 0, 0, 1, -1), -0.5),
}


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("form", list(PADS))
def test_a_pad_runs_on_the_accelerator(form: str, preset: str) -> None:
    after, pads, value = PADS[form]
    compiled, _ = compile_and_check(padded(after, pads, value), preset)
    assert compiled.program.host_segments == ()
    assert [layer["kind"] for layer in copies(compiled)
            if layer["name"] == "pad"] == ["Pool"]


BORDERS = {
    "edge": ("output", (0, 0, 2, 1, 0, 0, 1, 3)),
    "reflect": ("add", (0, 0, 1, 2, 0, 0, 3, 1)),
    "wrap": ("concat", (0, 0, 2, 0, 0, 0, 0, 2)),
}


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("mode", list(BORDERS))
def test_a_border_copying_pad_runs_on_the_accelerator(mode: str, preset: str) -> None:
    """Edge, reflect and wrap Pads are copies of input rows and columns: the interior one run,
    each border row or column a copy of its own."""
    after, pads = BORDERS[mode]
    compiled, _ = compile_and_check(padded(after, pads, mode=mode), preset)
    assert compiled.program.host_segments == ()
    kinds = [layer["kind"] for layer in copies(compiled) if layer["name"] == "pad"]
    assert kinds and set(kinds) == {"Lut"}
    assert len(kinds) <= sum(pads) + 2


def test_an_edge_pad_after_a_crop_runs_on_the_accelerator() -> None:
    compiled, _ = compile_and_check(padded("output", (0, 0, -1, 2, 0, 0, 1, -1), mode="edge"),
                                    "edge")
    assert compiled.program.host_segments == ()


def test_a_pad_of_the_channels_is_named_and_refused() -> None:
    proto = padded("output", (0, 1, 0, 0, 0, 1, 0, 0), mode="edge")
    qgraph = quantized(proto, samples({"x": [1, 3, 6, 4]}, 4))
    with pytest.raises(CompileError, match="node 'pad' \\(Pad\\): it pads the batch or "
                                           "channel axis \\(only H and W lower\\)"):
        lower(qgraph)


def test_a_pad_wider_than_the_load_pad_field_is_named_and_refused() -> None:
    proto = padded("output", (0, 0, 300, 0, 0, 0, 0, 0))
    qgraph = quantized(proto, samples({"x": [1, 3, 6, 4]}, 4))
    with pytest.raises(CompileError, match="node 'pad' \\(Pad\\): it pads 300 pixels; a LOAD "
                                           "pads at most 255"):
        lower(qgraph)
