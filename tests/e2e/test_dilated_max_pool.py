"""A dilated MaxPool on the vector unit, without a new instruction: one dense max pool per
output phase, over strided Views of its input and output, bit-exactly on the edge and default
presets (with ceil_mode, pads, auto_pad and strides that share a factor with the dilation)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.graph.reference import resolve_pads
from tests.e2e.flow import compile_and_check
from tests.onnx_builder import model, weights

C = 10  # two channel blocks on the edge preset (8 lanes), a partial one on default (16)


def conv_max_pool(shape, seed: int = 0, **attrs):
    """x → Conv → MaxPool(attrs)."""
    rng = np.random.default_rng(seed)
    n, _, h, w = shape
    _, out, _, _ = resolve_pads((h, w), attrs["kernel_shape"], attrs.get("strides"),
                                attrs.get("dilations"), attrs.get("pads"),
                                attrs.get("auto_pad", "NOTSET"), attrs.get("ceil_mode", 0))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("MaxPool", ["c"], ["y"], name="pool", **attrs)]
    return model(nodes, {"x": list(shape)}, {"y": [n, C, *out]},
                 {"w": weights(rng, C, shape[1], 3, 3)})


WINDOWS = {
    "3x3-d2": dict(kernel_shape=[3, 3], dilations=[2, 2]),
    "d3x2-s2x1-pads": dict(kernel_shape=[2, 3], dilations=[3, 2], strides=[2, 1],
                           pads=[1, 2, 1, 0]),
    "d2-s2x3-pads-ceil": dict(kernel_shape=[2, 3], dilations=[2, 2], strides=[2, 3],
                              pads=[1, 1, 0, 2], ceil_mode=1),
    "d2-s4-ceil": dict(kernel_shape=[3, 3], dilations=[2, 2], strides=[4, 4],
                       pads=[1, 1, 1, 1], ceil_mode=1),
    "d3-s2-same-upper": dict(kernel_shape=[3, 3], dilations=[3, 3], strides=[2, 2],
                             auto_pad="SAME_UPPER"),
    "d2x1": dict(kernel_shape=[3, 2], dilations=[2, 1], pads=[2, 0, 2, 1]),
}


@pytest.mark.parametrize("preset", ["edge", "default"])
@pytest.mark.parametrize("window", list(WINDOWS))
def test_a_dilated_max_pool_runs_on_the_vector_unit(preset: str, window: str) -> None:
    compiled, _ = compile_and_check(conv_max_pool((2, 3, 11, 9), **WINDOWS[window]), preset)
    assert compiled.program.host_segments == ()
