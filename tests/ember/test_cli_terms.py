"""Errors and warnings in the user's words: flags as typed (`--keep-fp32`), the model's path,
numbers formatted, long lists shortened with a count, onnxruntime's own log silent unless
--debug, and unsupported operators announced by `quantize-profile` before compile."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from quantizer.errors import QuantizeError, QuantizeWarning
from quantizer.requant import ratio
from simulator.errors import listing
from tests.cli import DIGITS, invoke
from tests.onnx_builder import model

MODEL = DIGITS / "model.onnx"


def test_listing_shortens_long_lists_with_a_count() -> None:
    assert listing(["a", "b"]) == "a, b"
    assert listing([f"n{i}" for i in range(40)], limit=3) == "n0, n1, n2, ... (40 in all)"
    assert listing(["x"], quote=True) == "'x'"


def test_an_unknown_keep_fp32_node_names_the_flag_and_lists_the_nodes(digits_profile) -> None:
    result = invoke("compile", MODEL, "--profile", digits_profile, "--keep-fp32", "nope")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "ember: error: --keep-fp32 nope: no such node in graph 'digits_cnn' after the fp32 "
        "passes; its nodes: conv1, relu1, conv2, relu2, pool, flatten, fc")


def test_keep_fp32_without_allow_host_names_the_kept_node_first(digits_profile) -> None:
    """Not the DequantizeLinear the quantizer put before it, which comes first in the graph."""
    result = invoke("compile", MODEL, "--profile", digits_profile, "--keep-fp32", "relu1")
    assert result.exit_code == 2
    assert result.output.startswith("ember: error: node 'relu1' (Relu) cannot run on the "
                                    "accelerator"), result.output
    assert "DequantizeLinear" not in result.output
    assert result.output.rstrip().endswith("or without --keep-fp32 relu1")


@pytest.fixture
def unsupported(tmp_path) -> Path:
    """Relu, then Hardmax: an operator ember does not know."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Hardmax", ["r"], ["y"], name="hm", axis=1)]
    path = tmp_path / "hm.onnx"
    onnx.save(model(nodes, {"x": [1, 10]}, {"y": [1, 10]}), path)
    return path


def test_compile_names_the_model_file_not_model(unsupported, tmp_path) -> None:
    profile = tmp_path / "p.json"
    assert invoke("quantize-profile", unsupported, "--random", 2, "-o", profile).exit_code == 0
    result = invoke("compile", unsupported, "--profile", profile, "-o", tmp_path / "m.ember")
    assert result.exit_code == 2
    assert result.output.startswith(f"ember: error: {unsupported}: node 'hm' has unsupported "
                                    f"operator Hardmax"), result.output


def test_quantize_profile_warns_of_an_operator_compile_will_refuse(unsupported,
                                                                   tmp_path) -> None:
    result = invoke("quantize-profile", unsupported, "--random", 2, "-o", tmp_path / "p.json")
    assert result.exit_code == 0 and (tmp_path / "p.json").is_file()
    assert result.stderr.startswith(f"ember: warning: {unsupported}: node 'hm' has "
                                    f"unsupported operator Hardmax")
    assert "with or without --allow-host" in result.stderr


def test_quantize_profile_says_what_allow_host_would_run(tmp_path) -> None:
    """A Tile of an activation has no int8 form yet (a Gather of an activation and a
    ReduceMax, this test's nodes before, now run on the accelerator: no warning)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Tile", ["r", "repeats"], ["y"], name="pick")]
    path = tmp_path / "tile.onnx"
    onnx.save(model(nodes, {"x": [1, 10]}, {"y": [1, 20]},
                    {"repeats": np.array([1, 2], np.int64)}), path)
    result = invoke("quantize-profile", path, "--random", 2, "-o", tmp_path / "p.json")
    assert result.exit_code == 0
    assert result.stderr.startswith(f"ember: warning: {path}: the accelerator cannot run 1 "
                                    f"node(s): pick (Tile); `ember compile` refuses "
                                    f"them unless given --allow-host, which runs them on the "
                                    f"host CPU")
    quiet = invoke("quantize-profile", MODEL, "--random", 2, "-o", tmp_path / "d.json")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    clip = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("ReduceMean", ["x"], ["low"], name="mean", keepdims=0),
            helper.make_node("Clip", ["r", "low"], ["y"], name="clip")]
    onnx.save(model(clip, {"x": [1, 10]}, {"y": [1, 10]}), tmp_path / "clip.onnx")
    runs = invoke("quantize-profile", tmp_path / "clip.onnx", "--random", 2,
                  "-o", tmp_path / "c.json")
    assert runs.exit_code == 0 and "cannot run" not in runs.stderr


def test_onnxruntime_logs_only_with_debug(tmp_path, capfd) -> None:
    """A Reshape to a fixed batch of 1 fails the profiler's whole-batch probe, which ember
    handles (it runs one sample at a time); onnxruntime logs that failure itself, on the
    process's stderr."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="flat")]
    path = tmp_path / "rs.onnx"
    onnx.save(model(nodes, {"x": [1, 4, 8, 8]}, {"y": [1, 256]},
                    {"shape": np.array([1, 256], np.int64)}), path)
    np.savez(tmp_path / "d.npz", x=np.ones((4, 1, 4, 8, 8), np.float32))
    line = ["quantize-profile", path, "--data", tmp_path / "d.npz", "-o", tmp_path / "p.json"]
    capfd.readouterr()
    assert invoke(*line).exit_code == 0
    assert "onnxruntime" not in capfd.readouterr().err
    assert invoke("--debug", *line).exit_code == 0
    assert "Reshape" in capfd.readouterr().err
    assert invoke(*line).exit_code == 0  # and silent again without it
    assert "onnxruntime" not in capfd.readouterr().err


def test_a_degenerate_ratio_is_a_formatted_number() -> None:
    with pytest.warns(QuantizeWarning) as said:  # clamped into range, with a warning
        ratio(np.float64(7.71e-12), "node 'conv'")
    assert "np.float64" not in str(said[0].message) and "7.71e-12" in str(said[0].message)
    with pytest.raises(QuantizeError) as caught:
        ratio(np.float64(-7.71e-12), "node 'conv'")
    assert "np.float64" not in str(caught.value) and "-7.71e-12" in str(caught.value)
    assert "quantize_multiplier" not in str(caught.value)


def test_cannot_quantize_names_the_flag_not_python(tmp_path) -> None:
    from compiler.graph.ir import Graph
    from ember.flow import optimized_graph
    from quantizer.checks import check_quantizable
    from quantizer.options import QuantOptions
    # A BatchNormalization of a [1, 4] value: no Conv to fold into, no feature map to become
    # a depthwise convolution, no int8 form.
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                              name="norm")]
    ones = np.ones(4, np.float32)
    graph: Graph = optimized_graph(model(nodes, {"x": [1, 4]}, {"y": [1, 4]},
                                         {"s": ones, "b": ones, "m": ones, "v": ones}))
    with pytest.raises(QuantizeError) as caught:
        check_quantizable(graph, QuantOptions())
    message = str(caught.value)
    assert "--keep-fp32 NODE" in message and "compiler.pipeline" not in message
    assert not re.search(r"\bkeep_fp32\b", message)


def test_profiling_workers_keep_onnxruntime_quiet_too(tmp_path, capfd) -> None:
    """Workers are spawned: they would start at onnxruntime's default, which warns about an
    unused initializer when each one makes its session."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    path = tmp_path / "unused.onnx"
    onnx.save(model(nodes, {"x": [1, 4]}, {"y": [1, 4]}, {"unused": np.ones(3, np.float32)}),
              path)
    np.savez(tmp_path / "d.npz", x=np.ones((8, 1, 4), np.float32))
    capfd.readouterr()
    result = invoke("quantize-profile", path, "--data", tmp_path / "d.npz", "--workers", 2,
                    "--batch", 2, "-o", tmp_path / "p.json")
    assert result.exit_code == 0, result.output
    assert "onnxruntime" not in capfd.readouterr().err


def test_a_difference_from_the_reference_is_said_in_words() -> None:
    from ember.commands.accuracy import difference_text
    text = difference_text({"sample": 3, "output": "logits", "element": [0, 7],
                            "simulator": -12, "reference": -11})
    assert text == "sample 3, output 'logits'[0,7]: the simulator gives -12, the integer " \
                   "reference -11"
