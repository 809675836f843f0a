"""Tap packing for an int16 model input: a stem Conv reading few channels (an RGB image) packs
kernel columns into K (`tiling.packed_taps`) when its input is int16 too, alone or through
int16 weights. Each plane has its own pre-padded DRAM copy, bordered by that plane's byte of
the zero point (`numerics.split_wide`), and the host writes the int16 binding inside both.
Bit-exact on every preset for 3x3 and 5x5 kernels, strides 1 and 2; the stem's array time
twice (input) and four times (both) the int8 program's, as the cost model says."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

from compiler.backend.lower import lower
from compiler.backend.tiling import conv_array_cycles, tile
from compiler.pipeline import INT8_PASSES, optimize
from quantizer.errors import QuantizeWarning
from quantizer.options import QuantOptions
from simulator import isa, numerics
from simulator.arch import Arch
from tests.e2e.flow import assert_busy_is_own_cycles, check_bit_exact, compute_cycles
from tests.e2e.test_int16_weights import build, samples
from tests.onnx_builder import model

PRESETS = ("default", "edge", "large")
# (kernel, stride, pads): a stem's shapes, uneven padding among them.
STEMS = {"3x3/1": (3, 1, (1, 1, 1, 1)), "3x3/2": (3, 2, (0, 0, 1, 1)),
         "5x5/1": (5, 1, (2, 2, 2, 2)), "5x5/2": (5, 2, (1, 2, 2, 1))}
# The int16 options and how many passes each weight tile takes (`numerics.wide_passes`).
WIDE = {"input": (QuantOptions(int16_tensors=("x",)), 2),
        "both": (QuantOptions(int16_tensors=("x",), int16_weights=("stem",)), 4)}


def stem(kernel: int, stride: int, pads: tuple[int, ...]):
    """x (2 images, RGB, 17 x 15) -> Conv (12 channels) -> Relu -> y."""
    rng = np.random.default_rng(kernel * 10 + stride)
    h, w = 17, 15
    oh = (h + pads[0] + pads[2] - kernel) // stride + 1
    ow = (w + pads[1] + pads[3] - kernel) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="stem",
                              strides=[stride, stride], pads=list(pads)),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return model(nodes, {"x": [2, 3, h, w]}, {"y": [2, 12, oh, ow]},
                 {"w": rng.normal(0, .3, (12, 3, kernel, kernel)).astype(np.float32),
                  "b": rng.normal(0, .1, 12).astype(np.float32)})


def _build(proto, options: QuantOptions, preset: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizeWarning)
        return build(proto, options, preset)


def _stem_layer(built):
    return next(layer for layer in lower(optimize(built.qgraph, INT8_PASSES)).layers
                if layer.node == "stem")


def _packed_lanes(program) -> set[int]:
    """The K of the stem's COMPUTEs: several kernel columns of 3 channels when packed (the
    last slice of a row may hold fewer)."""
    return {i.args["k"] for i, source in zip(program.instructions, program.source)
            if i.op is isa.COMPUTE and source == "stem"}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("wide", WIDE)
@pytest.mark.parametrize("shape", STEMS)
def test_an_int16_stem_packs_taps_bit_exactly(shape: str, wide: str, preset: str) -> None:
    """The int16 input lives in two padded copies (its binding int16, at the padded map's
    strides, `plane` the copy's size); the stem's COMPUTEs take packed K slices; three samples
    in one batch, then the last alone (`check_bit_exact`)."""
    proto = stem(*STEMS[shape])
    options, passes = WIDE[wide]
    built = _build(proto, options, preset)
    layer = _stem_layer(built)
    assert layer.x_plane and layer.weight_passes == passes // 2
    arch = Arch.load(preset)
    assert tile(layer, arch, packable=True).packed_taps > 1
    assert max(_packed_lanes(built.compiled.program)) > layer.in_channels
    (binding,) = built.compiled.program.inputs
    assert binding.dtype == "int16" and binding.strides and binding.plane
    check_bit_exact(built.qgraph, built.compiled, samples(proto, 3, 1))


def test_each_plane_is_bordered_by_its_byte_of_the_zero_point() -> None:
    """The padded copies in the DRAM image: the high plane's border is the zero point's high
    byte, the low plane's its low byte less 128 (-128 for the zero point 0)."""
    proto = stem(*STEMS["5x5/1"])
    built = _build(proto, WIDE["input"][0], "default")
    program = built.compiled.program
    (binding,) = program.inputs
    zero_point = _stem_layer(built).x_zero_point
    high, low = (int(v) for v in numerics.split_wide(zero_point))
    image = np.frombuffer(program.dram_image, np.int8)
    first = binding.dram - (binding.strides[2] * 2 + binding.strides[3] * 2)  # top=left=2
    for start, border in ((first, high), (first + binding.plane, low)):
        assert image[start] == border and image[start + binding.plane - 1] == border


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("shape", STEMS)
def test_the_stem_takes_two_and_four_times_the_int8_array_time(shape: str, preset: str) -> None:
    """Packed, an int16 input costs its two planes' passes and int16 weights their two
    parts', no more: the stem's COMPUTE cycles are 2x and 4x the int8 program's where the
    tiler picks the same tiles (and within a tenth where the input's doubled rows shrink
    them), equal to the cost model's (`conv_array_cycles`) where tiles divide the output; the
    simulator's array time is the instructions' own (PRELOADs with the COMPUTEs)."""
    proto = stem(*STEMS[shape])
    arch = Arch.load(preset)
    narrow = _build(proto, QuantOptions(), preset)
    narrow_tiles = tile(_stem_layer(narrow), arch, packable=True)
    assert narrow_tiles.packed_taps > 1
    base = compute_cycles(narrow.compiled.program, "stem")
    for wide, (options, factor) in WIDE.items():
        built = _build(proto, options, preset)
        layer = _stem_layer(built)
        t = tile(layer, arch, packable=True)
        assert t.packed_taps == narrow_tiles.packed_taps
        cycles = compute_cycles(built.compiled.program, "stem")
        if t.tile_hw == narrow_tiles.tile_hw:
            assert cycles == factor * base, wide
        else:
            assert abs(cycles / (factor * base) - 1) < 0.1, wide
        (oh, ow), (th, tw) = layer.out_hw, t.tile_hw
        if oh % th == 0 and ow % tw == 0:
            assert cycles == conv_array_cycles(layer, t, arch)
        assert_busy_is_own_cycles(built.compiled.program, "stem", "array", "compute")


def test_the_int8_stem_still_reads_an_int8_padded_copy() -> None:
    """Without int16 options the padded copy is one plane and the binding int8, as before."""
    built = _build(stem(*STEMS["3x3/2"]), QuantOptions(), "default")
    (binding,) = built.compiled.program.inputs
    assert binding.dtype == "int8" and binding.strides and binding.plane == 0
