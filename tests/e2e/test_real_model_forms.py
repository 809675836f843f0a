"""Forms real exporters write, run whole on the accelerator: an NHWC model's input Transpose
folded into the input DMA, an opset-9 model converted on import, weights in Constant nodes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from compiler.backend.lower import lower
from compiler.errors import CompileError
from tests.cli import invoke
from tests.compiler.test_frontend import opset9_model
from tests.e2e.flow import compile_and_check, quantized, samples
from tests.onnx_builder import model, weights


def nhwc_conv(channels_in: int = 3, stride: int = 1, seed: int = 0) -> onnx.ModelProto:
    """x[1,8,8,C] → Transpose to NCHW → Conv → Relu: how tf2onnx exports a Keras model."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Transpose", ["x"], ["x_nchw"], perm=[0, 3, 1, 2],
                              name="to_nchw"),
             helper.make_node("Conv", ["x_nchw", "w", "b"], ["c"], pads=[1, 1, 1, 1],
                              strides=[stride, stride], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    side = 8 // stride
    return model(nodes, {"x": [1, 8, 8, channels_in]}, {"y": [1, 4, side, side]},
                 {"w": weights(rng, 4, channels_in, 3, 3), "b": weights(rng, 4)})


@pytest.mark.parametrize("preset", ["default", "edge", "large"])
@pytest.mark.parametrize("channels_in, stride", [(3, 1), (3, 2), (16, 1)])
def test_an_input_transpose_is_the_input_dma(preset: str, channels_in: int, stride: int) -> None:
    compiled, _ = compile_and_check(nhwc_conv(channels_in, stride), preset)
    (binding,) = compiled.program.inputs
    assert binding.shape == (1, 8, 8, channels_in)
    assert binding.strides[-1] == 1  # channels stay contiguous: the user's rows, as they are
    assert compiled.program.host_segments == ()


def test_a_transpose_of_rank_five_is_named_as_unsupported() -> None:
    """A Transpose inside the graph lowers (tests/e2e/test_transpose_pad.py) up to rank 4."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 4, 1], name="to_last")]
    proto = model(nodes, {"x": [1, 4, 2, 3, 3]}, {"y": [1, 2, 3, 3, 4]})
    qgraph = quantized(proto, samples({"x": [1, 4, 2, 3, 3]}, 4))
    with pytest.raises(CompileError, match="'to_last' \\(Transpose\\): its output has rank 5 "
                                           "\\(ranks 1 to 4 lower\\)"):
        lower(qgraph)


def test_an_opset_9_model_runs_whole_on_the_accelerator() -> None:
    compiled, _ = compile_and_check(opset9_model(accelerated_only=True), "default")
    assert compiled.program.model_macs > 0


def test_constant_node_weights_compile_with_no_host_segment() -> None:
    rng = np.random.default_rng(0)
    w = weights(rng, 4, 3, 3, 3)
    nodes = [helper.make_node("Constant", [], ["w"], name="w_const",
                              value=numpy_helper.from_array(w, "w")),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    compiled, _ = compile_and_check(model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]}),
                                    "default")
    assert compiled.program.host_segments == ()


def test_the_cli_profiles_and_compiles_an_nhwc_opset_9_file(tmp_path) -> None:
    proto = nhwc_conv()
    proto.opset_import[0].version = 9
    path = tmp_path / "nhwc9.onnx"
    onnx.save(proto, path)
    data = tmp_path / "calib.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((4, 1, 8, 8, 3))
             .astype(np.float32))
    profiled = invoke("quantize-profile", path, "--data", data, "-o", tmp_path / "p.json")
    assert profiled.exit_code == 0, profiled.output
    compiled = invoke("compile", path, "--int8", "--profile", tmp_path / "p.json",
                      "-o", tmp_path / "m.ember")
    assert compiled.exit_code == 0, compiled.output
    ran = invoke("accuracy", path, tmp_path / "m.ember", "--profile", tmp_path / "p.json",
                 "--data", data, "--json")
    assert ran.exit_code == 0, ran.output
    assert '"bit_exact": true' in ran.output


def test_an_explicit_zero_pad_before_a_strided_conv_needs_no_host() -> None:
    """TensorFlow's asymmetric SAME padding, exported as its own Pad node."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad"),
             helper.make_node("Conv", ["p", "w"], ["c"], strides=[2, 2], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    proto = model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 4, 4]},
                  {"pads": np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64),
                   "w": weights(rng, 4, 3, 3, 3)})
    compiled, _ = compile_and_check(proto, "default")
    assert compiled.program.host_segments == ()
