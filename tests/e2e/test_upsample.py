"""Nearest-neighbour Resize by whole factors on the accelerator: one identity-table copy per
phase into a strided View of the output (or of the Concat that reads it), bit-exact."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.backend.lower import lower
from compiler.errors import CompileError
from tests.e2e.flow import compile_and_check, quantized, samples
from tests.onnx_builder import model, weights


def upsample(scales, concat: bool = False, seed: int = 0, **attrs):
    """x → Conv → Resize(nearest, scales) → Relu, or → Concat with a second input (the
    YOLO neck: the Resize's output written straight into its part of the Concat)."""
    rng = np.random.default_rng(seed)
    height, width = 8 * scales[2], 8 * scales[3]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Resize", ["c", "", "scales"], ["u"], mode="nearest", name="up",
                              **attrs)]
    inputs, outputs = {"x": [1, 3, 8, 8]}, {"y": [1, 4, height, width]}
    if concat:
        nodes.append(helper.make_node("Concat", ["u", "skip"], ["y"], axis=1, name="cat"))
        inputs["skip"] = [1, 2, height, width]
        outputs = {"y": [1, 6, height, width]}
    else:
        nodes.append(helper.make_node("Relu", ["u"], ["y"], name="relu"))
    return model(nodes, inputs, outputs,
                 {"w": weights(rng, 4, 3, 3, 3), "b": weights(rng, 4),
                  "scales": np.array(scales, np.float32)})


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("scales, attrs", [
    ((1, 1, 2, 2), {}),
    ((1, 1, 2, 3), {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    ((1, 1, 1, 2), {}),
])
def test_nearest_upsampling_runs_on_the_accelerator(preset, scales, attrs) -> None:
    compiled, _ = compile_and_check(upsample(scales, **attrs), preset)
    assert compiled.program.host_segments == ()


def test_an_upsample_into_a_concat_writes_its_part_in_place() -> None:
    compiled, _ = compile_and_check(upsample((1, 1, 2, 2), concat=True), "default")
    assert compiled.program.host_segments == ()


def test_a_fractional_resize_is_named_and_stays_on_the_host() -> None:
    proto = upsample((1, 1, 2, 2))
    proto.graph.initializer[-1].CopyFrom(
        helper.make_tensor("scales", 1, [4], [1, 1, 1.5, 1.5]))
    proto.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 12
    proto.graph.output[0].type.tensor_type.shape.dim[3].dim_value = 12
    qgraph = quantized(proto, samples({"x": [1, 3, 8, 8]}, 4))
    with pytest.raises(CompileError, match="'up' \\(Resize\\).*not nearest upsampling by a "
                                           "whole factor"):
        lower(qgraph)
    assert any(layer.__class__.__name__ == "HostLayer"
               for layer in lower(qgraph, allow_host=True).layers)
