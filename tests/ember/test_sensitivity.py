"""`ember accuracy --per-layer --sensitivity`: each tensor's effect on the output, kept at full
precision in its range and alone quantized (`ember.sensitivity`), ranked by the output SQNR it
gains. On a model built with one bad layer (a convolution whose output carries one channel a
hundred times the others, which the next convolution reads whole) that layer ranks first, and
keeping it in fp32 (its node and its reader) lifts the output where keeping the layer the
accumulated SQNR ranks worst would not."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from ember.flow import optimized_graph
from quantizer.options import QuantOptions
from tests.cli import assert_one_line_error, invoke
from tests.e2e.flow import output_sqnr_db, quantized
from tests.onnx_builder import model

C = 8


def one_bad_layer():
    """x → conv a (ReLU) → conv bad (channel 3 x100) → conv c → y."""
    rng = np.random.default_rng(4)
    bad = rng.normal(0, 0.3, (C, C, 3, 3)).astype(np.float32)
    bad[3] *= 100.0
    tail = rng.normal(0, 0.3, (C, C, 3, 3)).astype(np.float32)
    tail[:, 3] /= 100.0
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ra"], name="relu_a"),
             helper.make_node("Conv", ["ra", "wb"], ["b"], name="conv_bad", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["b", "wc"], ["y"], name="conv_c", pads=[1, 1, 1, 1])]
    inits = {"wa": rng.normal(0, 0.3, (C, 3, 3, 3)).astype(np.float32), "wb": bad,
             "wc": tail}
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, C, 8, 8]}, inits)


def samples(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(count)]


def test_the_bad_layer_ranks_first_and_keeping_it_pays(tmp_path) -> None:
    proto = one_bad_layer()
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    for name, count, seed in (("calib", 8, 0), ("eval", 4, 1)):
        np.savez(tmp_path / f"{name}.npz", x=np.concatenate([s["x"] for s in samples(count, seed)]))
    assert invoke("quantize-profile", path, "--data", tmp_path / "calib.npz", "-o",
                  tmp_path / "p.json").exit_code == 0
    result = invoke("accuracy", path, "--profile", tmp_path / "p.json", "--data",
                    tmp_path / "eval.npz", "--per-layer", "--sensitivity", "--json",
                    "--html", tmp_path / "a.html")
    assert result.exit_code == 0, result.output
    layers = json.loads(result.stdout)["layers"]
    ranked = [layer for layer in layers if layer["gain_db"] is not None]
    assert ranked[0]["name"] == "b" and ranked[0]["gain_db"] > 5
    assert all(a["gain_db"] >= b["gain_db"] for a, b in zip(ranked, ranked[1:]))
    # The accumulated SQNR's worst is the output itself, which carries b's error: keeping it
    # at full precision gains nothing.
    worst = min(layers, key=lambda layer: layer["accumulated_sqnr_db"])
    assert worst["name"] == "y" and abs(worst["gain_db"]) < 0.5
    assert "largest output gain first" in (tmp_path / "a.html").read_text().lower()
    graph = optimized_graph(proto)
    plain = quantized(proto, samples(8, 0))
    fixed = quantized(proto, samples(8, 0), QuantOptions(keep_fp32=("conv_bad", "conv_c")))
    assert output_sqnr_db(graph, fixed, samples(4, 1), "y") > \
        output_sqnr_db(graph, plain, samples(4, 1), "y") + 10


def test_sensitivity_without_per_layer_is_one_line(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(one_bad_layer(), path)
    np.savez(tmp_path / "d.npz", x=samples(1, 0)[0]["x"])
    assert invoke("quantize-profile", path, "--data", tmp_path / "d.npz", "-o",
                  tmp_path / "p.json").exit_code == 0
    assert_one_line_error(invoke("accuracy", path, "--profile", tmp_path / "p.json", "--data",
                                 tmp_path / "d.npz", "--sensitivity"), "--per-layer")


def one_bad_weight():
    """x → conv a → conv w → y, where each of w's output channels has one tap of 1.0 on a
    channel of a that is all but zero, and its other taps are ~0.02: per-channel int8 fits its
    step to the 1.0 and leaves the taps that make the output a code or two each."""
    rng = np.random.default_rng(5)
    wa = rng.normal(0, 0.3, (C, 3, 3, 3)).astype(np.float32)
    wa[0] *= 1e-3
    ww = rng.normal(0, 0.02, (C, C, 3, 3)).astype(np.float32)
    ww[:, 0, 1, 1] = 1.0
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "ww"], ["y"], name="conv_w", pads=[1, 1, 1, 1])]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, C, 8, 8]}, {"wa": wa, "ww": ww})


def test_the_bad_weight_ranks_first_among_the_weights(tmp_path) -> None:
    """--per-layer lists each layer's weights with their own SQNR; --sensitivity adds the
    output SQNR each gains at full precision, in the JSON, the terminal table and the page."""
    path = tmp_path / "m.onnx"
    onnx.save(one_bad_weight(), path)
    for name, count, seed in (("calib", 8, 0), ("eval", 4, 1)):
        np.savez(tmp_path / f"{name}.npz", x=np.concatenate([s["x"] for s in samples(count, seed)]))
    assert invoke("quantize-profile", path, "--data", tmp_path / "calib.npz", "-o",
                  tmp_path / "p.json").exit_code == 0
    args = ("accuracy", path, "--profile", tmp_path / "p.json", "--data", tmp_path / "eval.npz",
            "--per-layer")
    plain = json.loads(invoke(*args, "--json").stdout)["weights"]
    assert [w["node"] for w in plain] == ["conv_w", "conv_a"]  # the worst own SQNR first
    assert plain[0]["gain_db"] is None and plain[0]["own_sqnr_db"] < plain[1]["own_sqnr_db"]
    result = invoke(*args, "--sensitivity", "--json", "--html", tmp_path / "a.html")
    assert result.exit_code == 0, result.output
    weights = json.loads(result.stdout)["weights"]
    assert weights[0]["node"] == "conv_w" and weights[0]["name"] == "ww"
    assert weights[0]["gain_db"] > 5 > abs(weights[1]["gain_db"])
    assert weights[0]["alone_sqnr_db"] < weights[1]["alone_sqnr_db"]
    assert "Weights, largest output gain first" in (tmp_path / "a.html").read_text()
    table = invoke(*args, "--sensitivity").output
    assert "weights, largest output gain first" in table and "conv_w" in table


@pytest.mark.parametrize("build", ["lstm", "mobile_block"])
def test_weights_dequantized_once_change_no_output(build) -> None:
    """The sensitivity session runs the export with its constants' DequantizeLinear folded
    (onnxruntime dequantized every weight on every run: 80% of a CRNN's time): the outputs
    stay bit for bit those of the export as written, per-channel weights and an unrolled LSTM
    reading one weight at every step included."""
    from ember import ort
    from ember.sensitivity import _constants_dequantized
    from quantizer.qdq import export_qdq
    from tests.e2e import models
    from tests.e2e.test_recurrent import sequence_classifier

    proto = sequence_classifier(hidden=32, steps=6) if build == "lstm" else models.mobile_block()
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in proto.graph.input}
    rng = np.random.default_rng(0)

    def sample():
        return {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}

    export = export_qdq(quantized(proto, [sample() for _ in range(4)]))
    folded = _constants_dequantized(export)
    constants = {i.name for i in folded.graph.initializer}
    assert not [n for n in folded.graph.node if n.op_type == "DequantizeLinear"
                and all(name in constants for name in n.input if name)]
    as_written = ort.session(export, optimize=False)
    dequantized = ort.session(folded, optimize=False, prepack=False)
    for _ in range(8):
        feeds = sample()
        want, got = ort.run(as_written, feeds), ort.run(dequantized, feeds)
        assert all(np.array_equal(want[k], got[k]) for k in want)


def test_a_smoothed_layers_weights_are_listed_with_their_own_floats(tmp_path) -> None:
    """A LayerNorm's smoothing scales its reader's weights into values no model file holds
    (`quantizer.smooth`): they are listed too, measured against the quantizer's own floats
    (their own SQNR an int8 weight's, not the unsmoothed weights' against smoothed codes), so
    the budget can raise them."""
    from ember.accuracy import Evaluation, measure
    from tests.e2e.test_wide_residual import carried_stream
    from tests.e2e.test_wide_residual import samples as stream_samples
    path = tmp_path / "m.onnx"
    onnx.save(carried_stream(), path)
    for name, count, seed in (("calib", 8, 0), ("eval", 2, 1)):
        feeds = stream_samples(count, seed)
        np.savez(tmp_path / f"{name}.npz",
                 **{k: np.concatenate([s[k] for s in feeds]) for k in feeds[0]})
    assert invoke("quantize-profile", path, "--data", tmp_path / "calib.npz", "-o",
                  tmp_path / "p.json").exit_code == 0
    report = measure(str(path), str(tmp_path / "p.json"),
                     Evaluation(str(tmp_path / "eval.npz"), per_layer=True), QuantOptions())
    (weight,) = report.weights
    assert weight.value == "w/smooth" and weight.node == "dense" and weight.own_sqnr_db > 35
