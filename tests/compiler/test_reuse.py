"""On-chip reuse (`compiler.backend.reuse.keep_on_chip`): lowered layers and their own tiles on
the edge target (Before) against the tensors kept in the scratchpad, where their blocks sit,
and the rows each layer reserves (Expected)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from compiler.backend.layers import Lowered
from compiler.backend.lower import lower
from compiler.backend.program import packable
from compiler.backend.reuse import OnChip, keep_on_chip
from compiler.backend.tiling import Region, tile
from simulator.arch import Arch
from tests.compiler.tiny import quantize_model
from tests.e2e.models import chain
from tests.onnx_builder import model, weights, with_batch

EDGE = Arch.load("edge")  # 4096 scratchpad rows of 8 lanes


def _keep(lowered: Lowered):
    sole_readers = packable(lowered)
    tiles = [tile(layer, EDGE, layer.node in sole_readers) for layer in lowered.layers]
    return keep_on_chip(lowered, tiles, EDGE, sole_readers)


def test_a_chain_keeps_every_intermediate_tensor_in_stacked_blocks() -> None:
    """Expected: each consumer's whole input window, one slot per channel block of 8, padding
    included, from the top of the scratchpad down:
    - ar (18 channels, 10 x 12): conv2's window (5 - 1) * 2 + 3 = 11 by (6 - 1) * 2 + 3 = 13
      with its padding 1 around (filled with the input zero point, -128 after the Relu);
      3 slots, 429 rows, from 4096 - 429;
    - b (10 channels, 5 x 6): the 1x1 conv3's blocked input, no padding: 2 slots of 30 rows,
      just below;
    - c (12 channels, 5 x 6): the pool's 7 x 7 window with max pooling's -128 padding, 2 slots
      of 49 rows, below that.
    Each layer reserves the rows of the blocks it writes or reads and those above them."""
    lowered = lower(quantize_model(chain()))
    b_zero_point = lowered.layers[2].x_zero_point
    expected = {
        "ar": OnChip("ar", 4096 - 429, slots=3, height=11, width=13, top=1, left=1, block=8,
                     pad_value=-128, image_hw=(10, 12)),
        "b": OnChip("b", 3667 - 60, slots=2, height=5, width=6, top=0, left=0, block=8,
                    pad_value=b_zero_point, image_hw=(5, 6)),
        "c": OnChip("c", 3607 - 98, slots=2, height=7, width=7, top=1, left=1, block=8,
                    pad_value=-128, image_hw=(5, 6)),
    }
    tiles, kept, reserved = _keep(lowered)
    assert kept == expected
    assert reserved == [429, 429 + 60, 429 + 60 + 98, 429 + 60 + 98]
    # Each consumer reads its input from the shared block, which alternating must not move.
    assert [t.inputs for t in tiles[1:]] == [
        Region("scratchpad", block.base, block.rows, 1, fixed=True) for block in kept.values()]


def read_twice():
    """conv1's output feeds conv2 and the Add, and conv2's is also a model output."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="conv1", pads=[1] * 4),
             helper.make_node("Conv", ["a", "w2", "b2"], ["z"], name="conv2", pads=[1] * 4),
             helper.make_node("Add", ["a", "z"], ["y"], name="add")]
    return model(nodes, {"x": [1, 4, 6, 7]}, {"y": [1, 4, 6, 7], "z": [1, 4, 6, 7]},
                 {"w1": weights(rng, 4, 4, 3, 3), "b1": weights(rng, 4),
                  "w2": weights(rng, 4, 4, 3, 3), "b2": weights(rng, 4)})


def test_a_tensor_read_twice_or_a_model_output_stays_in_dram() -> None:
    """Expected: nothing kept, no row reserved, every plan as tiled."""
    lowered = lower(quantize_model(read_twice()))
    sole_readers = packable(lowered)
    own = [tile(layer, EDGE, layer.node in sole_readers) for layer in lowered.layers]
    assert _keep(lowered) == (own, {}, [0, 0, 0])


def test_a_batch_keeps_every_image_in_its_own_block() -> None:
    """Expected: the chain's blocks at batch 2, each holding image 0's block and then image
    1's (twice the rows, from the top of the scratchpad down as at batch 1)."""
    lowered = lower(quantize_model(with_batch(chain(), 2)))
    b_zero_point = lowered.layers[2].x_zero_point
    expected = {
        "ar": OnChip("ar", 4096 - 858, slots=3, height=11, width=13, top=1, left=1, block=8,
                     pad_value=-128, image_hw=(10, 12), images=2),
        "b": OnChip("b", 3238 - 120, slots=2, height=5, width=6, top=0, left=0, block=8,
                    pad_value=b_zero_point, image_hw=(5, 6), images=2),
        "c": OnChip("c", 3118 - 196, slots=2, height=7, width=7, top=1, left=1, block=8,
                    pad_value=-128, image_hw=(5, 6), images=2),
    }
    _, kept, reserved = _keep(lowered)
    assert kept == expected
    assert reserved == [858, 858 + 120, 858 + 120 + 196, 858 + 120 + 196]
    assert expected["ar"].row(0, 0, 8, image=1) == 4096 - 858 + 429 + 143 + 13 + 1
