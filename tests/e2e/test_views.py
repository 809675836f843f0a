"""Slice, Split and Concat without copies: slices and Split outputs are views (an offset and
strides over their producer's buffer) that consumers read in place; Concat's producers write
straight into their parts of its buffer. Every model is bit-exact against the integer reference
on the default and edge presets (edge tiles every dimension)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.backend.codegen.emit import Context, relocate
from compiler.backend.layers import LutLayer, View
from compiler.backend.lower import lower
from compiler.backend.steps import Op, Step
from compiler.errors import CompileError
from compiler.pipeline import compile_int8
from simulator import isa
from simulator.arch import Arch
from tests.e2e.flow import compile_and_check, quantized, samples
from tests.onnx_builder import model

PRESETS = ("default", "edge")


def _w(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _conv(name, x, y, w, b, pads=0, **attrs):
    return helper.make_node("Conv", [x, w, b], [y], name=name, pads=[pads] * 4, **attrs)


def fire(seed: int = 0):
    """SqueezeNet's fire module: 1x1 squeeze, 1x1 and 3x3 expands concatenated on channels,
    then a 3x3 convolution reading the Concat; a max-pool branch joins the Concat too, so its
    Rescale (a LUT) writes its part."""
    rng = np.random.default_rng(seed)
    nodes = [_conv("squeeze", "x", "s", "ws", "bs"),
             helper.make_node("Relu", ["s"], ["sr"], name="squeeze_relu"),
             _conv("expand1x1", "sr", "e1", "w1", "b1"),
             helper.make_node("Relu", ["e1"], ["e1r"], name="expand1x1_relu"),
             _conv("expand3x3", "sr", "e3", "w3", "b3", pads=1),
             helper.make_node("Relu", ["e3"], ["e3r"], name="expand3x3_relu"),
             helper.make_node("MaxPool", ["sr"], ["p"], name="pool", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["e1r", "e3r", "p"], ["cat"], name="concat", axis=1),
             _conv("out", "cat", "y", "wo", "bo", pads=1)]
    return model(nodes, {"x": [1, 12, 9, 11]}, {"y": [1, 10, 9, 11]},
                 {"ws": _w(rng, 6, 12, 1, 1), "bs": _w(rng, 6), "w1": _w(rng, 13, 6, 1, 1),
                  "b1": _w(rng, 13), "w3": _w(rng, 11, 6, 3, 3), "b3": _w(rng, 11),
                  "wo": _w(rng, 10, 30, 3, 3, scale=0.1), "bo": _w(rng, 10)})


def split_branches(seed: int = 1):
    """A channel Split into two branches (a 3x3 conv and a Sigmoid), an Add of two channel
    slices, and a Concat that also takes the model input (copied: the host writes it)."""
    rng = np.random.default_rng(seed)
    nodes = [_conv("stem", "x", "s", "w0", "b0", pads=1),
             helper.make_node("Split", ["s", "sizes"], ["a", "b"], name="split", axis=1),
             _conv("branch", "a", "c", "w1", "b1", pads=1),
             helper.make_node("Sigmoid", ["b"], ["d"], name="sigmoid"),
             helper.make_node("Slice", ["s", "st0", "en0", "ax"], ["s0"], name="lo"),
             helper.make_node("Slice", ["s", "st1", "en1", "ax"], ["s1"], name="hi"),
             helper.make_node("Add", ["s0", "s1"], ["e"], name="add"),
             helper.make_node("Concat", ["c", "d", "x", "e"], ["y"], name="concat", axis=1)]
    return model(nodes, {"x": [2, 5, 10, 9]}, {"y": [2, 27, 10, 9]},
                 {"w0": _w(rng, 20, 5, 3, 3), "b0": _w(rng, 20), "sizes": np.array([9, 11]),
                  "w1": _w(rng, 6, 9, 3, 3), "b1": _w(rng, 6),
                  "st0": np.array([0]), "en0": np.array([5]), "st1": np.array([12]),
                  "en1": np.array([17]), "ax": np.array([1])})


def crops(seed: int = 2):
    """Spatial crops (with a row step) read by a convolution and a max-pool, a cropped channel
    slice as a second model output (a strided binding), and a Flatten of a crop (copied)."""
    rng = np.random.default_rng(seed)
    nodes = [_conv("stem", "x", "s", "w0", "b0", pads=1),
             helper.make_node("Slice", ["s", "st", "en", "ax", "sp"], ["crop"], name="crop"),
             _conv("conv", "crop", "c", "w1", "b1", pads=1),
             helper.make_node("MaxPool", ["crop"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Slice", ["s", "st2", "en2", "ax2"], ["part"], name="part"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1)]
    return model(nodes, {"x": [1, 4, 13, 17]},
                 {"c": [1, 7, 5, 14], "y": [1, 6], "part": [1, 3, 13, 7]},
                 {"w0": _w(rng, 9, 4, 3, 3), "b0": _w(rng, 9), "st": np.array([2, 1]),
                  "en": np.array([12, -2]), "ax": np.array([2, 3]), "sp": np.array([2, 1]),
                  "w1": _w(rng, 7, 9, 3, 3), "b1": _w(rng, 7), "wf": _w(rng, 6, 9 * 2 * 7),
                  "bf": _w(rng, 6), "st2": np.array([4, 10]), "en2": np.array([7, 99]),
                  "ax2": np.array([1, 3])})


def dense_concat(seed: int = 3):
    """Two Gemms written into one matrix (a Concat on the feature axis) and a nested Concat on
    the batch axis, read by a Gemm."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Gemm", ["x", "wa", "ba"], ["a"], name="fa", transB=1),
             helper.make_node("Gemm", ["x", "wb"], ["b"], name="fb", transB=1),
             helper.make_node("Relu", ["b"], ["br"], name="relu"),
             helper.make_node("Concat", ["a", "br"], ["ab"], name="features", axis=1),
             helper.make_node("Gemm", ["x", "wc"], ["c"], name="fc", transB=1),
             helper.make_node("Concat", ["ab", "c"], ["abc"], name="batch", axis=0),
             helper.make_node("Gemm", ["abc", "wd", "bd"], ["y"], name="head", transB=1)]
    return model(nodes, {"x": [3, 21]}, {"y": [6, 5]},
                 {"wa": _w(rng, 7, 21), "ba": _w(rng, 7), "wb": _w(rng, 18, 21),
                  "wc": _w(rng, 25, 21), "wd": _w(rng, 5, 25), "bd": _w(rng, 5)})


def matmul_crops(seed: int = 5):
    """Row and feature slices of matrices read by MatMuls in place, and a crop of a rank-3
    value, whose rows are not evenly spaced, copied first."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a"], name="m0"),
             helper.make_node("Slice", ["a", "st", "en", "ax"], ["b"], name="crop"),
             helper.make_node("MatMul", ["b", "w1"], ["c"], name="m1"),
             helper.make_node("Reshape", ["c", "shape"], ["d"], name="flat"),
             helper.make_node("Slice", ["d", "st2", "en2", "ax2"], ["e"], name="cols"),
             helper.make_node("MatMul", ["e", "w2"], ["y"], name="m2")]
    return model(nodes, {"x": [2, 5, 6]}, {"y": [4, 2]},
                 {"w0": _w(rng, 6, 9), "st": np.array([1]), "en": np.array([4]),
                  "ax": np.array([1]), "w1": _w(rng, 9, 7), "shape": np.array([6, 7]),
                  "st2": np.array([1, 2]), "en2": np.array([5, 6]), "ax2": np.array([0, 1]),
                  "w2": _w(rng, 4, 2)})


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("build", [fire, split_branches, crops, dense_concat, matmul_crops])
def test_views_and_concat_are_bit_exact(build, preset: str) -> None:
    compile_and_check(build(), preset)


def _lowered(build):
    proto = build()
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in proto.graph.input}
    return lower(quantized(proto, samples(shapes, 4)))


def test_concat_producers_write_into_its_buffer() -> None:
    """No copy: the expands and the max-pool's Rescale store into channel slices of the Concat's
    one buffer, at its channel pitch, and the convolution after it reads that buffer."""
    lowered = _lowered(fire)
    by_node = {layer.node: layer for layer in lowered.layers}
    assert "concat" not in by_node and "e1r" not in lowered.tensors
    pitch = 30 * 9 * 11, 30 * 11, 30
    expected = {"expand1x1": View((1, 9, 11, 13), 0, pitch),
                "expand3x3": View((1, 9, 11, 11), 13, pitch)}
    for name, view in expected.items():
        assert by_node[name].y == "cat" and by_node[name].y_view == view
    rescale = next(layer for layer in lowered.layers if isinstance(layer, LutLayer))
    assert rescale.y == "cat" and rescale.views[1] == View((1, 9, 11, 6), 24, pitch)
    assert by_node["out"].x == "cat" and by_node["out"].x_view is None


def test_slices_are_views_and_uncopyable_inputs_are_copied() -> None:
    lowered = _lowered(split_branches)
    branch = next(layer for layer in lowered.layers if layer.node == "branch")
    assert branch.x == "s" and branch.x_view == View((2, 10, 9, 9), 0, (1800, 180, 20))
    # The Sigmoid reads its channel slice in place; the Add its two slices, and it writes its
    # part of the Concat; the quantizer's Rescales (of the model input, of the Sigmoid) too.
    sigmoid = next(layer for layer in lowered.layers if layer.node == "sigmoid")
    assert sigmoid.x == "s" and sigmoid.views[0] == View((2, 10, 9, 11), 9, (1800, 180, 20))
    add = next(layer for layer in lowered.layers if layer.node == "add")
    assert (add.a, add.b, add.y) == ("s", "s", "y/q") and add.views[2].offset == 22
    assert not any(layer.node == "concat" for layer in lowered.layers)  # nothing to copy


def twice(seed: int = 4):
    """A Concat of one value twice, which another node reads too: both parts are copies."""
    rng = np.random.default_rng(seed)
    nodes = [_conv("stem", "x", "s", "w0", "b0", pads=1),
             helper.make_node("Concat", ["s", "s"], ["c"], name="concat", axis=2),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("Concat", ["c", "r"], ["y"], name="outer", axis=2)]
    return model(nodes, {"x": [1, 3, 6, 7]}, {"y": [1, 19, 18, 7]},
                 {"w0": _w(rng, 19, 3, 3, 3), "b0": _w(rng, 19)})


@pytest.mark.parametrize("preset", PRESETS)
def test_inputs_that_cannot_be_written_in_place_are_copied(preset: str) -> None:
    compile_and_check(twice(), preset)
    lowered = _lowered(twice)
    copies = [layer for layer in lowered.layers if layer.node == "concat"]
    assert len(copies) == 2 and all(c.x == "s" and c.y == "y/q" for c in copies)
    assert [c.views[1].offset for c in copies] == [0, 6 * 7 * 19]


def test_a_view_no_consumer_reads_is_an_error_naming_node_and_input() -> None:
    rng = np.random.default_rng(0)
    nodes = [_conv("stem", "x", "s", "w0", "b0"),
             helper.make_node("Slice", ["s", "st", "en", "ax", "sp"], ["t"], name="every_other"),
             _conv("conv", "t", "y", "w1", "b1")]
    proto = model(nodes, {"x": [1, 3, 5, 5]}, {"y": [1, 2, 5, 5]},
                  {"w0": _w(rng, 8, 3, 1, 1), "b0": _w(rng, 8), "st": np.array([0]),
                   "en": np.array([8]), "ax": np.array([1]), "sp": np.array([2]),
                   "w1": _w(rng, 2, 4, 1, 1), "b1": _w(rng, 2)})
    qgraph = quantized(proto, samples({"x": [1, 3, 5, 5]}, 4))
    with pytest.raises(CompileError, match=r"'every_other' \(Slice\).*channel step of 2"):
        compile_int8(qgraph, Arch.load("edge"))


def test_hazards_are_on_the_bytes_a_view_spans() -> None:
    """Writers of disjoint parts of one buffer (a Concat on height) are not ordered by a false
    write-after-write: each access is its view's span, not the whole buffer."""
    whole = View.dense((1, 6, 7, 19))
    top, bottom = whole.sub(1, 0, 3), whole.sub(1, 3, 3)
    ops = [Op(isa.SYNC, {"queue": 0}, "c", (Context.access("t", True, v),))
           for v in (top, bottom, None)]
    fixed = relocate([Step((), tuple(ops))], {"t": 1000}, {"t": whole.size})[0].body
    assert [op.dram for op in fixed] == [((1000, 1000 + 3 * 7 * 19, True),),
                                         ((1000 + 3 * 7 * 19, 1000 + whole.size, True),),
                                         ((1000, 1000 + whole.size, True),)]


def test_matmul_reads_row_and_feature_slices_in_place_and_copies_uneven_rows() -> None:
    layers = _lowered(matmul_crops).layers
    copy, m1, m2 = layers[1:]
    assert isinstance(copy, LutLayer) and (copy.x, copy.y) == ("a", m1.x) and m1.x_view is None
    assert m2.x == "c" and m2.x_view == View((1, 1, 4, 4), 9, (28, 28, 7))
