"""Resize of H and W on the accelerator, bit-exact: nearest at any scale as identity-table
copies of runs of input rows and columns into strided Views of the output (or of the Concat
that reads it), linear as the vector unit's ADD of two neighbours weighed by its rescales."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.backend.lower.resize import Run, runs
from compiler.graph import reference as ref
from compiler.graph.int8 import resize_int8
from compiler.graph.ops import OPS
from tests.cli import assert_one_line_error, invoke
from tests.e2e.flow import compile_and_check
from tests.onnx_builder import model, weights


def upsample(scales, concat: bool = False, seed: int = 0, **attrs):
    """x → Conv → Resize(nearest, scales) → Relu, or → Concat with a second input (the
    YOLO neck: the Resize's output written straight into its part of the Concat)."""
    rng = np.random.default_rng(seed)
    height, width = int(8 * scales[2]), int(8 * scales[3])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Resize", ["c", "", "scales"], ["u"], name="up",
                              **{"mode": "nearest", **attrs})]
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


def resize_to(height: int, width: int, **attrs) -> onnx.ModelProto:
    """x [1, 3, 8, 8] → Conv → Resize(sizes [height, width]) → Relu."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Resize", ["c", "", "", "sizes"], ["u"], name="up", **attrs),
             helper.make_node("Relu", ["u"], ["y"], name="relu")]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, height, width]},
                 {"w": weights(rng, 4, 3, 3, 3), "b": weights(rng, 4),
                  "sizes": np.array([1, 4, height, width], np.int64)})


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("scales, attrs", [
    ((1, 1, 2, 2), {}),
    ((1, 1, 2, 3), {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    ((1, 1, 1, 2), {}),
])
def test_nearest_upsampling_runs_on_the_accelerator(preset, scales, attrs) -> None:
    compiled, _ = compile_and_check(upsample(scales, **attrs), preset)
    assert compiled.program.host_segments == ()


def test_a_linear_resize_that_keeps_the_shape_is_a_copy_whatever_its_scales() -> None:
    compiled, _ = compile_and_check(upsample((1, 1, 1.05, 1.05), mode="linear"), "default")
    assert compiled.program.host_segments == ()


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_a_linear_resize_by_scales_without_a_sizes_input_runs_on_the_accelerator(preset) -> None:
    """Resize(X, roi, scales) with no fourth input, as exporters write a 2x upsampling."""
    compiled, _ = compile_and_check(upsample((1, 1, 2, 2), mode="linear"), preset)
    assert compiled.program.host_segments == ()


def test_an_upsample_into_a_concat_writes_its_part_in_place() -> None:
    compiled, _ = compile_and_check(upsample((1, 1, 2, 2), concat=True), "default")
    assert compiled.program.host_segments == ()


@pytest.mark.parametrize("preset", ["default", "edge"])
@pytest.mark.parametrize("size, attrs", [
    ((12, 12), {"mode": "nearest"}),                                    # 1.5x up
    ((4, 3), {"mode": "nearest", "nearest_mode": "floor"}),             # down, 2x and 8/3
    ((5, 13), {"mode": "nearest", "coordinate_transformation_mode": "align_corners"}),
    ((16, 16), {"mode": "linear"}),                                     # 2x half_pixel
    ((16, 16), {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    ((12, 5), {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ((8, 12), {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}),
])
def test_any_nearest_or_linear_resize_runs_on_the_accelerator(preset, size, attrs) -> None:
    compiled, _ = compile_and_check(resize_to(*size, **attrs), preset)
    assert compiled.program.host_segments == ()


def test_runs_of_a_whole_factor_are_its_phases_and_a_fraction_needs_few() -> None:
    assert runs(np.arange(8) // 2, [None] * 8) == [Run(0, 2, 4, 0, 1), Run(1, 2, 4, 0, 1)]
    assert runs(np.arange(4) * 2, [None] * 4) == [Run(0, 1, 4, 0, 2)]
    # 10 -> 15 (asymmetric floor): three runs, each output o = 3k + r taking input 2k + r'.
    assert len(runs(np.floor(np.arange(15) / 1.5).astype(int), [None] * 15)) == 3


def _sqnr_db(reference: np.ndarray, result: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference ** 2) / np.sum((reference - result) ** 2)))


@pytest.mark.parametrize("size, ctm", [((20, 32), "half_pixel"), ((20, 32), "align_corners"),
                                       ((15, 23), "pytorch_half_pixel"),
                                       ((25, 38), "asymmetric")])
def test_the_linear_int8_kernel_is_within_one_step_of_fp32(size, ctm) -> None:
    """On the same codes, the int8 kernel differs from fp32 only by its rounding after each
    axis: at most one step, SQNR over 35 dB on a random map of ±40-step amplitude."""
    x = np.clip(np.random.default_rng(0).normal(0, 40, (1, 3, 10, 16)), -128, 127)
    x = x.astype(np.int8)
    attrs = {**OPS["Resize"].attrs, "mode": "linear", "coordinate_transformation_mode": ctm}
    sizes = np.array([1, 3, *size], np.int64)
    fp32 = ref.resize(x.astype(np.float32), None, None, sizes, **attrs)
    int8 = resize_int8(x, None, None, sizes, **attrs).astype(np.float32)
    assert np.abs(fp32 - int8).max() <= 1.0
    assert _sqnr_db(fp32, int8) > 35


def test_a_cubic_resize_is_one_line_naming_the_node(tmp_path) -> None:
    path = tmp_path / "cubic.onnx"
    onnx.save(resize_to(16, 16, mode="cubic"), path)
    assert invoke("quantize-profile", path, "--random", "1", "-o",
                  tmp_path / "p.json").exit_code == 0
    result = invoke("compile", path, "--int8", "--profile", tmp_path / "p.json", "-o",
                    tmp_path / "cubic.ember")
    assert_one_line_error(result, "up", "cubic")
