"""A quantizer that never refuses a real model: dead channels, huge biases, constant and
vanishing tensors get floored scales and clamped ratios, each said in a warning that names the
node, and the program stays bit-exact with the integer reference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

from compiler.graph.evaluate import evaluate
from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.errors import QuantizeWarning
from quantizer.reference import run_int8
from quantizer.requant import RATIO_MAX, RATIO_MIN, ratios
from simulator import numerics
from tests.cli import invoke
from tests.e2e.flow import check_bit_exact, samples
from tests.onnx_builder import model, weights
from tests.quantizer.util import profile_of


def dead_channels():
    """conv: channel 2 dead (weights 1e-9, bias -1.2, as BN folding leaves a pruned channel),
    channel 5 all zero with a bias; conv2: channel 1 with weights 1e-12 and a bias of 3, whose
    code at s_x * s_w (about 4e16) would overflow int32."""
    rng = np.random.default_rng(0)
    w, b = weights(rng, 8, 3, 3, 3), weights(rng, 8)
    w[2], b[2], w[5], b[5] = 1e-9, -1.2, 0.0, 0.7
    w2, b2 = weights(rng, 4, 8, 1, 1), weights(rng, 4)
    w2[1], b2[1] = 1e-12, 3.0
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="conv2")]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]},
                 {"w": w, "b": b, "w2": w2, "b2": b2})


def vanishing_operand():
    """An Add of a conv's output and an input whose calibration range is 1e-30: its ratios
    fall far outside the fixed-point range."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "tiny"], ["y"], name="add")]
    return model(nodes, {"x": [1, 3, 8, 8], "tiny": [1, 4, 8, 8]}, {"y": [1, 4, 8, 8]},
                 {"w": weights(rng, 4, 3, 3, 3), "b": weights(rng, 4) - 5})


def constant_tensors(bias: float):
    """conv: every weight 0, so its output is the constant `bias` everywhere (0: an all-zero
    tensor, a zero range); add: a second input that calibration only ever sees as 0.25."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["d"], name="conv2"),
             helper.make_node("Add", ["d", "level"], ["y"], name="add")]
    return model(nodes, {"x": [1, 3, 8, 8], "level": [1, 4, 8, 8]}, {"y": [1, 4, 8, 8]},
                 {"w": np.zeros((4, 3, 3, 3), np.float32), "b": np.full(4, bias, np.float32),
                  "w2": weights(rng, 4, 4, 1, 1), "b2": weights(rng, 4)})


def _compile(proto, feeds):
    profile = profile_of(proto, feeds, optimized_graph(proto))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = compile_model(proto, profile, CompileOptions(), "default")
    said = [str(w.message) for w in caught if issubclass(w.category, QuantizeWarning)]
    return built, said


def test_dead_channels_and_a_huge_bias_compile_bit_exact_with_warnings_naming_them() -> None:
    proto = dead_channels()
    feeds = samples({"x": [1, 3, 8, 8]}, 8)
    built, said = _compile(proto, feeds)
    assert any("node 'conv' (Conv): weight 'w' has 1 of 8 slices (2)" in s for s in said), said
    assert any("node 'conv2' (Conv): weight 'w2' has 1 of 4 slices (1)" in s for s in said), said
    check_bit_exact(built.qgraph, built.compiled, feeds[:2])
    # The int8 result still follows fp32: the dead channels give their bias, the rest as usual.
    graph = optimized_graph(proto)
    step = built.qgraph.type_of(built.qgraph.nodes[-2].outputs[0]).quant.scale[0]
    for feed in feeds[:2]:
        fp32 = evaluate(graph, feed)["y"]
        int8 = run_int8(built.qgraph, feed)["y"]
        assert np.abs(int8 - fp32)[:, 1].max() <= step  # the floored channel: its bias
        sqnr = 10 * np.log10(np.mean(fp32 ** 2) / np.mean((int8 - fp32) ** 2))
        assert sqnr > 30, sqnr


def test_a_vanishing_operand_clamps_ratios_with_a_warning_and_stays_bit_exact() -> None:
    proto = vanishing_operand()
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
              "tiny": np.full((1, 4, 8, 8), 1e-30, np.float32)} for _ in range(4)]
    built, said = _compile(proto, feeds)
    assert any("node 'add' (Add)" in s and "requantization ratios" in s and "clamped" in s
               for s in said), said
    check_bit_exact(built.qgraph, built.compiled, feeds[:2])


@pytest.mark.parametrize("bias", [0.5, 0.0])
def test_all_constant_tensors_compile_bit_exact_and_follow_fp32(bias: float) -> None:
    """A zero weight tensor, the constant (or all-zero) activation it makes and a constant
    input are represented exactly: no error, and nothing to warn about."""
    proto = constant_tensors(bias)
    feeds = [{"x": s["x"], "level": np.full((1, 4, 8, 8), 0.25, np.float32)}
             for s in samples({"x": [1, 3, 8, 8]}, 4)]
    built, said = _compile(proto, feeds)
    assert said == []
    check_bit_exact(built.qgraph, built.compiled, feeds[:2])
    graph = optimized_graph(proto)
    step = built.qgraph.type_of(built.qgraph.nodes[-2].outputs[0]).quant.scale[0]
    for feed in feeds[:2]:  # within two roundings (conv2's and the add's) and w2's error
        assert np.abs(run_int8(built.qgraph, feed)["y"] - evaluate(graph, feed)["y"]).max() \
            <= 2 * step


@pytest.mark.parametrize("real", [1e-40, 3.9e-33, 2.0**-33, 2.0**31, 2.4e26])
def test_a_clamped_ratio_gives_the_outputs_the_exact_ratio_would(real: float) -> None:
    """Below 2^-32 every int32 accumulator but -2^31 rounds to the zero point at either ratio;
    at 2^30 and above every non-zero one saturates at either ratio."""
    with pytest.warns(QuantizeWarning, match="outside the fixed-point range"):
        (m,), (s,) = ratios([real], "node 'n' (Conv)")
    rng = np.random.default_rng(0)
    acc = np.concatenate([rng.integers(-2**31 + 1, 2**31, 10_000), [0, 1, -1, 2**31 - 1]])
    got = numerics.requantize(acc, m, s, out_offset=3)
    exact = np.clip(np.rint(acc.astype(np.float64) * real) + 3, -128, 127)
    np.testing.assert_array_equal(got, exact.astype(np.int8))


def test_ratios_inside_the_range_are_not_touched_and_not_warned() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inside = (RATIO_MIN, 0.5, RATIO_MAX, 1.9e9)  # 1.9e9: representable, below 2^31
        assert ratios(inside, "n") == tuple(
            zip(*(numerics.quantize_multiplier(r) for r in inside)))


def test_the_cli_prints_the_warning_as_one_line(tmp_path) -> None:
    import onnx
    path = tmp_path / "dead.onnx"
    onnx.save(dead_channels(), path)
    data = tmp_path / "calib.npz"
    np.savez(data, x=np.stack([s["x"] for s in samples({"x": [1, 3, 8, 8]}, 4)]))
    assert invoke("quantize-profile", path, "--data", data, "-o", tmp_path / "p.json") \
        .exit_code == 0
    result = invoke("compile", path, "--int8", "--profile", tmp_path / "p.json",
                    "-o", tmp_path / "m.ember")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("ember: warning:")]
    assert any("node 'conv2' (Conv): weight 'w2' has 1 of 4 slices (1)" in line
               for line in lines), result.output
