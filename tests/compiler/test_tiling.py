"""Tiling (`compiler.backend.tiling.tile`): one lowered layer and the edge target (Before)
against its tile sizes and local-memory regions (Expected), each number derived in the test's
docstring from the target's sizes: an 8 x 8 array, 4096 scratchpad rows of 8 bytes, 256
accumulator rows of 8 int32."""

from __future__ import annotations

import numpy as np
from onnx import helper

from compiler.backend.layers import Layer
from compiler.backend.lower import lower
from compiler.backend.tiling import ConvTiles, ElementwiseTiles, PoolTiles, Region, tile
from simulator.arch import Arch
from tests.compiler.tiny import quantize_model
from tests.onnx_builder import model, weights

EDGE = Arch.load("edge")


def _layer(node: helper.NodeProto, x: list[int], y: list[int], **constants) -> Layer:
    layer, = lower(quantize_model(model([node], {"x": x}, {"y": y}, constants))).layers
    return layer


def _conv(cin: int, cout: int, size: int, kernel: int) -> Layer:
    """A convolution of a size x size map, `same` padding."""
    pad = kernel // 2
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[pad] * 4)
    w = weights(np.random.default_rng(0), cout, cin, kernel, kernel)
    return _layer(node, [1, cin, size, size], [1, cout, size, size], w=w)


def _sp(base: int, rows: int, count: int = 2) -> Region:
    return Region("scratchpad", base, rows, count)


def _acc(base: int, rows: int, count: int = 2) -> Region:
    return Region("accumulator", base, rows, count)


def test_a_small_conv_is_one_tile_with_every_weight_loaded_once() -> None:
    """3x3 conv, 8 → 8 channels, 6x6: one weight tile's K and N. The whole output is one tile
    (36 pixels); the weights (9 taps x 8 rows) and the parameters (3 rows) load once; the
    input window (8 x 8 rows, padding included), the outputs and the accumulators have two
    buffers each, stacked from row 0."""
    expected = ConvTiles(
        tile_hw=(6, 6), in_block=8, out_block=8, resident_weights=True, whole_layer=True,
        blocked_input=False, packed_taps=1,
        weights=_sp(0, 72, 1), inputs=_sp(72, 64), outputs=_sp(200, 36),
        acc=_acc(3, 36), params=_acc(0, 3, 1))
    assert tile(_conv(8, 8, 6, 3), EDGE) == expected


def test_pixel_tiles_are_whole_rows_balanced_over_the_height() -> None:
    """The same conv over 16x16: the accumulators (3 parameter rows + 2 x pixels <= 256) take
    at most 7 whole rows of 16 pixels; 16 rows in ceil(16 / 7) = 3 tiles are balanced to 6
    rows each, and each tile's input window is (6 + 2) x (16 + 2) rows."""
    tiles = tile(_conv(8, 8, 16, 3), EDGE)
    assert tiles.tile_hw == (6, 16)
    assert (tiles.inputs, tiles.outputs, tiles.acc) == (_sp(72, 144), _sp(360, 96),
                                                        _acc(3, 96))


def test_a_pointwise_conv_loads_all_its_channel_blocks_in_one_tile() -> None:
    """1x1 conv, 16 → 8 channels, 6x6: K is 8, so two K slices. Stride 1 without padding over
    whole rows: the input is blocked (one LOAD of both slices: 2 x 36 rows), and the weights
    are 2 slices x 8 rows."""
    expected = ConvTiles(
        tile_hw=(6, 6), in_block=8, out_block=8, resident_weights=True, whole_layer=True,
        blocked_input=True, packed_taps=1,
        weights=_sp(0, 16, 1), inputs=_sp(16, 72), outputs=_sp(160, 36),
        acc=_acc(3, 36), params=_acc(0, 3, 1))
    assert tile(_conv(16, 8, 6, 1), EDGE) == expected


def test_weights_too_large_to_keep_stream_per_block_in_two_buffers() -> None:
    """3x3 conv, 64 → 64 channels, 16x16: all weights (8 blocks x 576 rows) exceed half the
    scratchpad, so each output-channel block's 9 x 64 rows stream into one of two buffers,
    while the 8 blocks' parameters (24 rows) stay loaded. Pixel tiles stay outermost, so the
    input (8 K slices of 8 x 18 window rows) is read once."""
    tiles = tile(_conv(64, 64, 16, 3), EDGE)
    assert (tiles.whole_layer, tiles.resident_weights) == (True, False)
    assert (tiles.weights, tiles.params) == (_sp(0, 576), _acc(0, 24, 1))
    assert tiles.tile_hw == (6, 16) and tiles.inputs.rows == 8 * 8 * 18


def test_a_lookup_table_keeps_its_table_below_the_tensor_tiles() -> None:
    """Sigmoid over 8 x 6 x 6 bytes: the 256-entry table takes 32 rows of 8 at row 0; the
    tensor's 36 rows fit in one tile, with two buffers for the input and two for the output."""
    node = helper.make_node("Sigmoid", ["x"], ["y"], name="sig")
    expected = ElementwiseTiles(tile_rows=36, a=_sp(32, 36), b=None, outputs=_sp(104, 36),
                                table=_sp(0, 32, 1), params=None)
    assert tile(_layer(node, [1, 8, 6, 6], [1, 8, 6, 6]), EDGE) == expected


def test_max_pooling_tiles_the_output_and_reads_each_window_with_its_halo() -> None:
    """3x3/2 max pooling, 8 channels, 9x9 → 5x5 with padding 1: one tile of the whole output
    reads (5 - 1) * 2 + 3 = 11 x 11 input rows; no parameters (only average pooling has)."""
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[3, 3],
                            strides=[2, 2], pads=[1] * 4)
    expected = PoolTiles(tile_hw=(5, 5), channel_block=8, inputs=_sp(0, 121),
                         outputs=_sp(242, 25), params=None)
    assert tile(_layer(node, [1, 8, 9, 9], [1, 8, 5, 5]), EDGE) == expected
