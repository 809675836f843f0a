"""Bias correction (`--bias-correction`): each Conv/Gemm bias less (W_int8 - W) times its input's
per-channel means, from a profile made with `--channel-means`; the mean error it removes, and
the clear error without the means."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.pipeline import optimize
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources.arrays import ArrayFile
from quantizer.errors import QuantizeError
from quantizer.quantize import QuantOptions, quantize
from quantizer.reference import run_int8
from tests.cli import assert_one_line_error, invoke
from tests.onnx_builder import model


def _offset_conv() -> onnx.ModelProto:
    """x (channel means far from zero) → Conv 16→8 3x3, zero padded → y: per-tensor int8
    weights with one wide channel round the others coarsely, and the rounding's sum over the
    channels' means is a bias of its own (less where a tap reads the padding)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.1
    w[0] *= 40  # one channel sets the per-tensor scale
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1] * 4)]
    return model(nodes, {"x": [1, 16, 8, 8]}, {"y": [1, 8, 8, 8]}, {"w": w})


def _samples(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = np.linspace(-3, 3, 16).reshape(1, 16, 1, 1)
    return (rng.standard_normal((n, 1, 16, 8, 8)) * 0.5 + means).astype(np.float32)


def _profile(proto, tmp_path, channel_means: bool):
    path = tmp_path / "calib.npz"
    np.savez(path, x=_samples(16, 1)[:, 0])
    specs = input_specs(proto, {})
    return profile(proto, ArrayFile(path, specs), specs, RunOptions(channel_means=channel_means))


def test_bias_correction_removes_the_weights_mean_error(tmp_path) -> None:
    proto = _offset_conv()
    graph = optimize(import_model(proto))
    prof = _profile(proto, tmp_path, channel_means=True)
    evaluation = _samples(8, 2)
    errors = {}
    for corrected in (False, True):
        qgraph = quantize(graph, prof, QuantOptions(per_channel=False,
                                                    bias_correction=corrected))
        diff = np.stack([run_int8(qgraph, {"x": x})["y"] - evaluate(graph, {"x": x})["y"]
                         for x in evaluation])
        # Each output channel's mean error (over samples and positions) and the total error.
        errors[corrected] = (np.abs(diff.mean(axis=(0, 1, 3, 4))[1:]).max(),
                             float(np.mean(diff ** 2)))
    (bias_before, mse_before), (bias_after, mse_after) = errors[False], errors[True]
    # Measured: the worst channel's mean error 0.431 -> 0.027, the squared error 0.202 -> 0.114
    # (with each tap weighted by where it reads the padding; 0.145 without).
    assert bias_after < 0.1 * bias_before, errors
    assert mse_after < 0.7 * mse_before, errors


def test_without_the_means_it_says_how_to_get_them(tmp_path) -> None:
    proto = _offset_conv()
    prof = _profile(proto, tmp_path, channel_means=False)
    with pytest.raises(QuantizeError, match="--channel-means"):
        quantize(optimize(import_model(proto)), prof, QuantOptions(bias_correction=True))


def test_the_options_from_the_command_line(tmp_path) -> None:
    path = tmp_path / "conv.onnx"
    onnx.save(_offset_conv(), str(path))
    plain, means = tmp_path / "plain.json", tmp_path / "means.json"
    assert invoke("quantize-profile", path, "--random", 2, "-o", plain).exit_code == 0
    made = invoke("quantize-profile", path, "--random", 2, "--channel-means", "-o", means)
    assert made.exit_code == 0, made.output
    refused = invoke("compile", path, "--int8", "--profile", plain, "--bias-correction",
                     "-o", tmp_path / "a.ember")
    assert_one_line_error(refused, "--channel-means", "'x'")
    result = invoke("compile", path, "--int8", "--profile", means, "--bias-correction",
                    "-o", tmp_path / "b.ember")
    assert result.exit_code == 0, result.output
