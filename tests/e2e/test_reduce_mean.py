"""ReduceMean over H, W or both of a feature map runs on the vector unit as an average pool of
that window (squeeze-and-excitation's and classifier heads' global mean), bit-exactly."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.backend.lower import lower
from compiler.errors import CompileError
from tests.e2e.flow import compile_and_check, quantized, samples
from tests.onnx_builder import model, weights


def conv_mean(axes, keepdims: int, out_shape, seed: int = 0):
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r", "axes"], ["y"], keepdims=keepdims,
                              name="mean")]
    return model(nodes, {"x": [1, 3, 6, 10]}, {"y": out_shape},
                 {"w": weights(rng, 20, 3, 3, 3), "b": weights(rng, 20),
                  "axes": np.array(axes, np.int64)}, opset=18)


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("axes, keepdims, out_shape", [
    ([2, 3], 1, [1, 20, 1, 1]),
    ([-1, -2], 0, [1, 20]),
    ([2], 1, [1, 20, 1, 10]),
    ([3], 1, [1, 20, 6, 1]),
])
def test_a_spatial_mean_runs_on_the_vector_unit(preset, axes, keepdims, out_shape) -> None:
    compiled, _ = compile_and_check(conv_mean(axes, keepdims, out_shape), preset)
    assert compiled.program.host_segments == ()


def test_a_mean_over_channels_is_named_and_stays_on_the_host() -> None:
    proto = conv_mean([1], 1, [1, 1, 6, 10])
    qgraph = quantized(proto, samples({"x": [1, 3, 6, 10]}, 4))
    with pytest.raises(CompileError, match="'mean' \\(ReduceMean\\).*averages axes \\[1\\]"):
        lower(qgraph)
    assert any(type(layer).__name__ == "HostLayer"
               for layer in lower(qgraph, allow_host=True).layers)
