"""ReduceMean over H, W or both of a feature map runs on the vector unit as an average pool of
that window (squeeze-and-excitation's and classifier heads' global mean); over the channels
(alone or with H and W, of a feature map or of a row-major [N, T, C] or [N, C] tensor) as a
convolution to one channel by a kernel of ones on the array; bit-exactly, keepdims or not."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.backend.lower import lower
from compiler.errors import CompileError
from tests.e2e.flow import compile_and_check, quantized, samples
from tests.onnx_builder import model, weights


def conv_mean(axes, keepdims: int, out_shape, seed: int = 0, batch: int = 1):
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r", "axes"], ["y"], keepdims=keepdims,
                              name="mean")]
    return model(nodes, {"x": [batch, 3, 6, 10]}, {"y": out_shape},
                 {"w": weights(rng, 20, 3, 3, 3), "b": weights(rng, 20),
                  "axes": np.array(axes, np.int64)}, opset=18)


def matmul_mean(axes, keepdims: int, x_shape, out_shape, seed: int = 0):
    """A row-major activation (a MatMul's [..., T, 12]) averaged over `axes`."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["r"], name="matmul"),
             helper.make_node("ReduceMean", ["r", "axes"], ["y"], keepdims=keepdims,
                              name="mean")]
    return model(nodes, {"x": x_shape}, {"y": out_shape},
                 {"w": weights(rng, x_shape[-1], 12), "axes": np.array(axes, np.int64)},
                 opset=18)


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("axes, keepdims, out_shape", [
    ([2, 3], 1, [1, 20, 1, 1]),
    ([-1, -2], 0, [1, 20]),
    ([2], 1, [1, 20, 1, 10]),
    ([3], 1, [1, 20, 6, 1]),
    ([2], 0, [1, 20, 10]),
    ([1], 1, [1, 1, 6, 10]),
    ([1], 0, [1, 6, 10]),
    ([1, 2, 3], 1, [1, 1, 1, 1]),
    ([0, 1, 2, 3], 0, []),
    ([1, 3], 0, [1, 6]),
])
def test_a_mean_of_a_feature_map_runs_on_the_accelerator(preset, axes, keepdims,
                                                         out_shape) -> None:
    compiled, _ = compile_and_check(conv_mean(axes, keepdims, out_shape), preset)
    assert compiled.program.host_segments == ()


def test_a_mean_of_a_whole_large_map_runs_as_one_long_dot_product() -> None:
    """Over C, H and W each image's bytes are one run: a 1x1 convolution over h * w * c input
    channels, split along K, where a kernel spanning the 25 x 17 map needs more scratchpad than
    the edge target has (a random graph found it)."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("ReduceMean", ["c", "axes"], ["y"], keepdims=1, name="mean")]
    proto = model(nodes, {"x": [2, 3, 25, 17]}, {"y": [2, 1, 1, 1]},
                  {"w": weights(rng, 8, 3, 3, 3), "axes": np.array([1, 2, 3], np.int64)},
                  opset=18)
    compiled, _ = compile_and_check(proto, "edge")
    assert compiled.program.host_segments == ()


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("axes, keepdims, x_shape, out_shape", [
    ([-1], 1, [2, 7, 5], [2, 7, 1]),
    ([-1], 0, [2, 7, 5], [2, 7]),
    ([1], 0, [2, 7, 5], [2, 12]),
    ([1, 2], 1, [2, 7, 5], [2, 1, 1]),
    ([1], 1, [6, 5], [6, 1]),
    ([0], 0, [6, 5], [12]),
])
def test_a_mean_of_a_row_major_tensor_runs_on_the_accelerator(preset, axes, keepdims, x_shape,
                                                              out_shape) -> None:
    """The last axis is the channels. The MatMul writes N * T pixels in one row, which a mean
    over T reads as N rows of T: from DRAM, not from the MatMul's on-chip block."""
    compiled, _ = compile_and_check(matmul_mean(axes, keepdims, x_shape, out_shape), preset)
    assert compiled.program.host_segments == ()


def test_a_mean_over_the_batch_is_named_and_stays_on_the_host() -> None:
    proto = conv_mean([0, 1], 1, [1, 1, 6, 10], batch=2)
    qgraph = quantized(proto, samples({"x": [2, 3, 6, 10]}, 4))
    with pytest.raises(CompileError, match="'mean' \\(ReduceMean\\).*averages the batch axis "
                                           "of a rank-4 value \\(axes \\[0, 1\\]\\)"):
        lower(qgraph)
    assert any(type(layer).__name__ == "HostLayer"
               for layer in lower(qgraph, allow_host=True).layers)
