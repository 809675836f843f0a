"""Smoothing a LayerNorm's outlier channels into the Gemms that read it (`quantizer.smooth`):
the profile's per-channel ranges measure the spread, gamma and beta are divided by f and the
weights' rows multiplied by it, so the fp32 function is unchanged and the int8 one gains."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import helper

from compiler.graph.evaluate import evaluate
from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.options import QuantOptions
from quantizer.quantize import quantize
from quantizer.smooth import smooth_norms
from tests.e2e.flow import check_bit_exact, output_sqnr_db
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

S, C, N = 12, 48, 32


def norm_then_dense(outlier: float, reader: str = "MatMul"):
    """out = LayerNorm(x) @ W (+ a Relu of the norm's output beside it with reader="Relu"):
    gamma makes channel 5 `outlier` times the others, as a trained transformer's norms do."""
    rng = np.random.default_rng(3)
    gamma = rng.uniform(0.5, 1.5, C).astype(np.float32)
    gamma[5] = outlier
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], name="norm"),
             helper.make_node("MatMul", ["y", "w"], ["out"], name="dense")]
    outputs = {"out": [1, S, N]}
    if reader == "Relu":
        nodes.append(helper.make_node("Relu", ["y"], ["side"], name="side"))
        outputs["side"] = [1, S, C]
    inits = {"gamma": gamma, "beta": rng.normal(0, 0.1, C).astype(np.float32),
             "w": rng.normal(0, C ** -0.5, (C, N)).astype(np.float32)}
    return model(nodes, {"x": [1, S, C]}, outputs, inits, opset=17)


def samples(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, S, C)).astype(np.float32)} for _ in range(count)]


def sqnr_db(graph, qgraph) -> float:
    return output_sqnr_db(graph, qgraph, samples(4, 9), "out")


def test_an_outlier_norm_is_smoothed_into_its_gemm_and_it_pays() -> None:
    proto = norm_then_dense(outlier=30.0)
    graph = optimized_graph(proto)
    profile = profile_of(proto, samples(8, 0), graph)
    smoothed = quantize(graph, profile)
    plain = quantize(graph, profile, QuantOptions(smooth_norms="never"))
    assert "norm/smooth" in {n.name for n in smoothed.nodes}
    assert "norm/smooth" not in {n.name for n in plain.nodes}
    assert sqnr_db(graph, smoothed) > sqnr_db(graph, plain) + 6


def test_smoothing_keeps_the_fp32_function() -> None:
    """y' = y / f into W' = diag(f) W: the same products in real numbers; the smoothed
    output's range is the channels' ranges divided by f, evened out."""
    proto = norm_then_dense(outlier=30.0)
    graph = optimized_graph(proto)
    profile = profile_of(proto, samples(8, 0), graph)
    rewritten, ranges = smooth_norms(graph, "auto", profile.tensors.get)
    assert list(ranges) == ["y/smooth"]
    stats = profile.tensors["y"]
    lo, hi = ranges["y/smooth"]
    assert hi - lo < (stats.max - stats.min) / 4
    for feeds in samples(2, 5):
        np.testing.assert_allclose(evaluate(rewritten, feeds)["out"],
                                   evaluate(graph, feeds)["out"], rtol=1e-4, atol=1e-4)


def test_no_smoothing_without_outliers_another_reader_or_channel_ranges() -> None:
    even = norm_then_dense(outlier=1.0)
    graph = optimized_graph(even)
    assert smooth_norms(graph, "auto", profile_of(even, samples(8, 0), graph).tensors.get)[1] \
        == {}
    shared = norm_then_dense(outlier=30.0, reader="Relu")  # a Relu reads y as it is
    graph = optimized_graph(shared)
    assert smooth_norms(graph, "auto", profile_of(shared, samples(8, 0), graph).tensors.get)[1] \
        == {}
    proto = norm_then_dense(outlier=30.0)
    graph = optimized_graph(proto)
    tensors = profile_of(proto, samples(8, 0), graph).tensors
    old = {name: dataclasses.replace(stats, channel_min=None, channel_max=None)
           for name, stats in tensors.items()}  # a profile from before channel ranges
    assert smooth_norms(graph, "auto", old.get)[1] == {}
    assert smooth_norms(graph, "never", tensors.get)[1] == {}


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow)])
def test_a_smoothed_norm_runs_bit_exactly(preset: str) -> None:
    proto = norm_then_dense(outlier=30.0)
    profile = profile_of(proto, samples(8, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(), preset)
    assert "norm/smooth" in {n.name for n in built.qgraph.nodes}
    check_bit_exact(built.qgraph, built.compiled, samples(2, 1))


def test_the_cli_flow_smooths_and_the_report_says_so(tmp_path) -> None:
    """`ember quantize-profile` records the norm's channel ranges, `ember compile` smooths it
    (unless --smooth-norms never), and `ember accuracy --per-layer` names the smoothed output
    instead of comparing y / f with y."""
    import json

    import onnx

    from tests.cli import invoke
    onnx.save(norm_then_dense(outlier=30.0), tmp_path / "m.onnx")
    for name, count, seed in (("calib", 8, 0), ("eval", 3, 1)):
        np.savez(tmp_path / f"{name}.npz",
                 x=np.concatenate([s["x"] for s in samples(count, seed)]))
    profile = tmp_path / "p.json"
    assert invoke("quantize-profile", tmp_path / "m.onnx", "--data", tmp_path / "calib.npz",
                  "-o", profile).exit_code == 0
    reports = {}
    for mode in ("auto", "never"):
        program = tmp_path / f"{mode}.ember"
        assert invoke("compile", tmp_path / "m.onnx", "--int8", "--profile", profile,
                      "--smooth-norms", mode, "-o", program).exit_code == 0
        result = invoke("accuracy", tmp_path / "m.onnx", program, "--profile", profile,
                        "--data", tmp_path / "eval.npz", "--per-layer", "--json")
        assert result.exit_code == 0, result.output
        reports[mode] = json.loads(result.stdout)
    auto, never = reports["auto"], reports["never"]
    assert auto["bit_exact"] and auto["options"]["smooth_norms"] == "auto"
    assert any("smoothed" in note and note.endswith(": y") for note in auto["notes"])
    assert not any("smoothed" in note for note in never["notes"])
    assert auto["sqnr_db"] > never["sqnr_db"] + 6
