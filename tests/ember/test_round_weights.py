"""Error-compensated weight rounding (#16 part 4: AdaRound's objective, solved as GPTQ does):
`ember round-weights` chooses each layer's int8 codes for its output on calibration data and
writes them once; `--weight-rounding FILE` on compile and accuracy uses them. The codes are on
the quantizer's own scales, so the program is as fast and as bit-exact as before, and closer to
fp32."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.graph.ir import Node
from compiler.graph.reference import conv
from ember.rounding import _as_rows, _columns, _from_rows
from quantizer.rounding import (Moments, compensated_codes, load_rounding, output_error,
                                quantized_codes, quantized_output_error, save_rounding,
                                target_weights)
from tests.cli import assert_one_line_error, invoke
from tests.onnx_builder import model


def test_compensated_codes_shrink_the_output_error_on_correlated_inputs() -> None:
    """Inputs with correlated columns: the chosen codes' output error is well under nearest
    rounding's, every code within [-127, 127], each at most a few steps from the nearest."""
    rng = np.random.default_rng(0)
    mix = rng.normal(size=(24, 24))
    x = mix @ rng.normal(size=(24, 400))
    h = (x @ x.T)[None]
    w = rng.normal(0, 0.1, (1, 16, 24))
    s = np.abs(w).max(axis=2, keepdims=True) / 127
    chosen = compensated_codes(w, h, s, 127)
    nearest = np.clip(np.rint(w / s), -127, 127)
    assert output_error(w, chosen, s, h) < 0.7 * output_error(w, nearest, s, h)
    assert np.abs(chosen).max() <= 127
    assert np.abs(chosen - nearest).max() <= 8


def test_uncorrelated_inputs_of_equal_energy_leave_the_nearest_codes() -> None:
    """H = I: no column's error can be absorbed by another, so the codes are the nearest."""
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.1, (3, 5, 9))
    s = np.full((3, 5, 1), 0.002)
    chosen = compensated_codes(w, np.broadcast_to(np.eye(9), (3, 9, 9)), s, 127)
    assert np.array_equal(chosen, np.clip(np.rint(w / s), -127, 127))


@pytest.mark.parametrize("op, attrs, w_shape, x_shape", [
    ("Conv", {"pads": [1, 1, 1, 1]}, (6, 4, 3, 3), (2, 4, 7, 7)),
    ("Conv", {"group": 2, "strides": [2, 2], "pads": [0, 1, 1, 0]}, (6, 2, 3, 3), (1, 4, 8, 8)),
    ("Conv", {"group": 4, "dilations": [2, 2], "pads": [2, 2, 2, 2]}, (4, 1, 3, 3),
     (1, 4, 9, 9)),
    ("Conv", {"strides": [2], "pads": [1, 1]}, (5, 3, 4), (2, 3, 11)),
    ("Gemm", {"transB": 1}, (7, 5), (3, 5)),
    ("Gemm", {}, (5, 7), (3, 5)),
    ("MatMul", {}, (5, 7), (2, 3, 5)),
])
def test_the_rows_times_the_columns_are_the_layer(op, attrs, w_shape, x_shape) -> None:
    """Each row of `_as_rows` times `_columns` is the layer's output channel: the rounding
    problem is the layer's, for every convolution form, Gemm and MatMul; `_from_rows` puts
    the codes back in the weight's shape."""
    rng = np.random.default_rng(2)
    w, x = rng.normal(size=w_shape), rng.normal(size=x_shape)
    node = Node(op, "n", ("x", "w"), ("y",), attrs)
    rows, _ = _as_rows(node, w, np.ones(1), None)
    got = np.einsum("grk,gkm->grm", rows, _columns(node, w, x))
    if op == "Conv":
        want = conv(x, w, **attrs)
        want = np.moveaxis(want, 1, 0).reshape(got.shape[0], got.shape[1], -1)
    else:
        matrix = w.T if attrs.get("transB") else w
        want = (x.reshape(-1, x.shape[-1]) @ matrix).T[None]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    assert np.array_equal(_from_rows(node, rows, w.shape), w)


def two_convs():
    """x -> Conv 3x3 (12) -> ReLU -> Conv 3x3 (8) -> y, read with smooth images (neighbouring
    inputs correlated, which error compensation exploits); each of the second Conv's channels
    has one tap of 1.0 beside taps of ~0.03, so its per-channel int8 step is coarse for them."""
    rng = np.random.default_rng(3)
    w2 = rng.normal(0, .03, (8, 12, 3, 3))
    w2[:, 0, 1, 1] = 1.0
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="c2", pads=[1, 1, 1, 1])]
    inits = {"w1": rng.normal(0, .3, (12, 3, 3, 3)), "b1": rng.normal(0, .1, 12),
             "w2": w2, "b2": rng.normal(0, .1, 8)}
    return model(nodes, {"x": [1, 3, 10, 10]}, {"y": [1, 8, 10, 10]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def smooth_images(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=(count, 3, 12, 12))
    blurred = sum(noise[:, :, i:i + 10, j:j + 10] for i in range(3) for j in range(3)) / 3
    return blurred.astype(np.float32)


@pytest.fixture(scope="module")
def rounded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rounding")
    onnx.save(two_convs(), str(folder / "m.onnx"))
    np.savez(folder / "calib.npz", x=smooth_images(32, 0))
    np.savez(folder / "eval.npz", x=smooth_images(16, 1))
    assert invoke("quantize-profile", folder / "m.onnx", "--data", folder / "calib.npz",
                  "-o", folder / "p.json").exit_code == 0
    result = invoke("round-weights", folder / "m.onnx", "--profile", folder / "p.json",
                    "--data", folder / "calib.npz", "-o", folder / "r.npz", "--json")
    assert result.exit_code == 0, result.output
    return folder, json.loads(result.stdout)


def _accuracy(folder, *options):
    result = invoke("accuracy", folder / "m.onnx", *options, "--profile", folder / "p.json",
                    "--data", folder / "eval.npz", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_rounded_weights_bring_the_output_closer_and_the_program_stays_bit_exact(rounded):
    folder, report = rounded
    assert {layer["node"] for layer in report["layers"]} == {"c1", "c2"}
    assert report["samples"] == 32
    assert all(layer["chosen_error"] < layer["nearest_error"] for layer in report["layers"])
    plain = _accuracy(folder)["sqnr_db"]
    better = _accuracy(folder, "--weight-rounding", folder / "r.npz")["sqnr_db"]
    assert better > plain + 1
    for name, extra in (("plain", ()), ("rounded", ("--weight-rounding", folder / "r.npz"))):
        result = invoke("compile", folder / "m.onnx", "--profile", folder / "p.json", *extra,
                        "-o", folder / f"{name}.ember", "--json")
        assert result.exit_code == 0, result.output
    plain_cycles = json.loads(invoke("compile", folder / "m.onnx", "--profile",
                                     folder / "p.json", "-o", folder / "plain.ember",
                                     "--json").stdout)["cycles"]
    rounded_run = invoke("compile", folder / "m.onnx", "--profile", folder / "p.json",
                         "--weight-rounding", folder / "r.npz", "-o", folder / "rounded.ember",
                         "--json")
    assert json.loads(rounded_run.stdout)["cycles"] == plain_cycles  # the same arithmetic
    checked = _accuracy(folder, folder / "rounded.ember")
    assert checked["bit_exact"] is True
    assert checked["sqnr_db"] == pytest.approx(better)
    assert checked["options"]["weight_rounding"] == str(folder / "r.npz")


def test_a_rounding_file_must_be_the_one_the_program_used(rounded, tmp_path) -> None:
    folder, _ = rounded
    assert invoke("compile", folder / "m.onnx", "--profile", folder / "p.json",
                  "--weight-rounding", folder / "r.npz", "-o", tmp_path / "p.ember").exit_code == 0
    copy = tmp_path / "r.npz"
    copy.write_bytes((folder / "r.npz").read_bytes())
    assert invoke("compile", folder / "m.onnx", "--profile", folder / "p.json",
                  "--weight-rounding", copy, "-o", tmp_path / "c.ember").exit_code == 0
    copy.write_bytes(b"not a rounding file")
    assert_one_line_error(invoke("accuracy", folder / "m.onnx", tmp_path / "c.ember",
                                 "--profile", folder / "p.json", "--data",
                                 folder / "eval.npz"), "compiled with another weight-rounding")
    assert_one_line_error(invoke("accuracy", folder / "m.onnx", "--profile", folder / "p.json",
                                 "--data", folder / "eval.npz", "--weight-rounding", copy),
                          "not a readable rounding file", str(copy))


def test_a_rounding_file_for_other_weights_or_scales_is_caught(rounded, tmp_path) -> None:
    """Other float weights (another model): an error naming the weight. Other scales (made
    per channel, used per tensor): a warning, and those weights take their nearest codes."""
    folder, _ = rounded
    other = two_convs()
    w1 = np.zeros((12, 3, 3, 3), np.float32) + 0.1
    other.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w1, "w1"))
    onnx.save(other, str(tmp_path / "other.onnx"))
    assert invoke("quantize-profile", tmp_path / "other.onnx", "--data", folder / "calib.npz",
                  "-o", tmp_path / "other.json").exit_code == 0
    assert_one_line_error(invoke("accuracy", tmp_path / "other.onnx", "--profile",
                                 tmp_path / "other.json", "--data", folder / "eval.npz",
                                 "--weight-rounding", folder / "r.npz"),
                          "weight 'w1' was rounded for other values")
    result = invoke("accuracy", folder / "m.onnx", "--profile", folder / "p.json", "--data",
                    folder / "eval.npz", "--per-tensor", "--weight-rounding", folder / "r.npz")
    assert result.exit_code == 0, result.output
    assert "2 weight(s) were rounded there at other scales" in result.output
    plain = invoke("accuracy", folder / "m.onnx", "--profile", folder / "p.json", "--data",
                   folder / "eval.npz", "--per-tensor", "--json")
    fallback = invoke("accuracy", folder / "m.onnx", "--profile", folder / "p.json", "--data",
                      folder / "eval.npz", "--per-tensor", "--weight-rounding",
                      folder / "r.npz", "--json")
    assert json.loads(plain.stdout)["sqnr_db"] == json.loads(fallback.stdout)["sqnr_db"]


def test_round_weights_usage(rounded, tmp_path) -> None:
    folder, _ = rounded
    result = invoke("round-weights", folder / "m.onnx", "--profile", folder / "p.json",
                    "--data", folder / "calib.npz", "--weight-rounding", folder / "r.npz")
    assert result.exit_code == 2 and "round-weights writes one" in result.output
    help_text = invoke("round-weights", "--help").output
    assert "error-compensated" in help_text and "--weight-rounding" in help_text


def _profiled_and_rounded(folder) -> dict:
    """`quantize-profile` then `round-weights` of folder/m.onnx on folder/calib.npz: the
    rounding's JSON report (its codes in folder/r.npz)."""
    assert invoke("quantize-profile", folder / "m.onnx", "--data", folder / "calib.npz",
                  "-o", folder / "p.json").exit_code == 0
    result = invoke("round-weights", folder / "m.onnx", "--profile", folder / "p.json",
                    "--data", folder / "calib.npz", "-o", folder / "r.npz", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_layer_the_samples_cannot_pin_down_keeps_its_nearest_codes(tmp_path) -> None:
    """A Gemm of 96 inputs read by 4 samples: codes chosen on two of them fit those two and
    fail on the other two, so the layer keeps its nearest codes (the output as without the
    file); a single sample cannot be checked at all, which is an error."""
    rng = np.random.default_rng(5)
    proto = model([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=1)],
                  {"x": [1, 96]}, {"y": [1, 10]},
                  {"w": rng.normal(0, .1, (10, 96)).astype(np.float32)})
    onnx.save(proto, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "calib.npz", x=rng.normal(size=(4, 96)).astype(np.float32))
    np.savez(tmp_path / "eval.npz", x=rng.normal(size=(8, 96)).astype(np.float32))
    (layer,) = _profiled_and_rounded(tmp_path)["layers"]
    assert layer["compensated"] is False and layer["chosen_error"] == layer["nearest_error"]
    plain = invoke("accuracy", tmp_path / "m.onnx", "--profile", tmp_path / "p.json", "--data",
                   tmp_path / "eval.npz", "--json")
    rounded = invoke("accuracy", tmp_path / "m.onnx", "--profile", tmp_path / "p.json",
                     "--data", tmp_path / "eval.npz", "--weight-rounding", tmp_path / "r.npz",
                     "--json")
    assert json.loads(plain.stdout)["sqnr_db"] == json.loads(rounded.stdout)["sqnr_db"]
    assert_one_line_error(invoke("round-weights", tmp_path / "m.onnx", "--profile",
                                 tmp_path / "p.json", "--data", tmp_path / "calib.npz",
                                 "--samples", 1, "-o", tmp_path / "one.npz"),
                          "1 sample(s); rounding needs two batches")


def test_with_exact_inputs_the_quantized_objective_is_the_fp32_one() -> None:
    """X~ = X: the target is W itself, and |W X - W_q X~|^2 is `output_error`."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 10, 300))
    h = np.einsum("gkm,glm->gkl", x, x)
    w = rng.normal(0, .1, (2, 4, 10))
    s = np.abs(w).max(axis=2, keepdims=True) / 127
    same = Moments(h, h, h)
    np.testing.assert_allclose(target_weights(w, same), w, rtol=1e-9, atol=1e-12)
    codes = compensated_codes(w, h, s, 127)
    assert quantized_output_error(w, codes, s, same) == pytest.approx(
        output_error(w, codes, s, h), rel=1e-6)


def test_quantized_codes_absorb_a_linear_error_of_their_inputs() -> None:
    """Inputs that reach the layer as (I + E) X, E the error of an earlier rounded layer:
    codes chosen for |W X - W_q X~| beat both nearest codes and codes that ignore E, and the
    error is what the inputs give directly."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(16, 16)) @ rng.normal(size=(16, 600))
    quantized_x = (np.eye(16) + rng.normal(0, .05, (16, 16))) @ x
    moments = Moments((quantized_x @ quantized_x.T)[None], (quantized_x @ x.T)[None],
                      (x @ x.T)[None])
    w = rng.normal(0, .1, (1, 12, 16))
    s = np.abs(w).max(axis=2, keepdims=True) / 127
    nearest = np.clip(np.rint(w / s), -127, 127)
    ignoring = compensated_codes(w, moments.quantized, s, 127)
    fitted = quantized_codes(w, moments, s, 127, match_fp32_output=True)
    error = quantized_output_error(w, fitted, s, moments)
    assert error == pytest.approx(float(((w[0] @ x - fitted[0] * s[0] @ quantized_x) ** 2)
                                        .sum()), rel=1e-6)
    assert error < 0.5 * quantized_output_error(w, ignoring, s, moments)
    assert error < 0.5 * quantized_output_error(w, nearest, s, moments)


def coarse_convs():
    """`two_convs` whose first Conv also has one tap of 1.0 per channel beside taps of ~0.03:
    its own rounding puts a large error into the second Conv's inputs, which codes fitted to
    the fp32 inputs cannot see."""
    rng = np.random.default_rng(5)
    w1 = rng.normal(0, .03, (12, 3, 3, 3))
    w1[:, 0, 1, 1] = 1.0
    w2 = rng.normal(0, .03, (8, 12, 3, 3))
    w2[:, 0, 1, 1] = 1.0
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="c2", pads=[1, 1, 1, 1])]
    inits = {"w1": w1, "b1": rng.normal(0, .1, 12), "w2": w2, "b2": rng.normal(0, .1, 8)}
    return model(nodes, {"x": [1, 3, 10, 10]}, {"y": [1, 8, 10, 10]},
                 {k: v.astype(np.float32) for k, v in inits.items()})


def test_codes_fitted_to_the_quantized_inputs_beat_codes_fitted_to_fp32_ones(tmp_path):
    """A bad first layer: the second layer's codes fitted to the fp32 output on its quantized
    inputs (matched) bring the output closer to fp32 than codes chosen on its fp32 inputs (the
    default), all forms beat nearest rounding, the file says which inputs it was fitted to,
    and the program compiled with it stays bit-exact."""
    onnx.save(coarse_convs(), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "calib.npz", x=smooth_images(32, 0))
    np.savez(tmp_path / "eval.npz", x=smooth_images(32, 1))
    assert invoke("quantize-profile", tmp_path / "m.onnx", "--data", tmp_path / "calib.npz",
                  "-o", tmp_path / "p.json").exit_code == 0
    reports = {}
    for inputs, extra in (("fp32", ()), ("quantized", ("--inputs", "quantized")),
                          ("matched", ("--inputs", "matched"))):
        result = invoke("round-weights", tmp_path / "m.onnx", "--profile", tmp_path / "p.json",
                        "--data", tmp_path / "calib.npz", "-o", tmp_path / f"{inputs}.npz",
                        "--json", *extra)
        assert result.exit_code == 0, result.output
        reports[inputs] = json.loads(result.stdout)
        assert reports[inputs]["inputs"] == inputs
        with np.load(tmp_path / f"{inputs}.npz") as data:
            assert json.loads(bytes(data["header"]).decode())["inputs"] == inputs
    assert all(layer["compensated"] for layer in reports["matched"]["layers"])
    sqnr = {"nearest": _accuracy(tmp_path)["sqnr_db"]}
    for inputs in reports:
        sqnr[inputs] = _accuracy(tmp_path, "--weight-rounding", tmp_path / f"{inputs}.npz")[
            "sqnr_db"]
    assert sqnr["matched"] > sqnr["fp32"] + 0.3, sqnr
    assert min(sqnr["fp32"], sqnr["quantized"]) > sqnr["nearest"] + 2, sqnr
    assert invoke("compile", tmp_path / "m.onnx", "--profile", tmp_path / "p.json",
                  "--weight-rounding", tmp_path / "matched.npz",
                  "-o", tmp_path / "m.ember").exit_code == 0
    checked = _accuracy(tmp_path, tmp_path / "m.ember")
    assert checked["bit_exact"] is True
    assert checked["sqnr_db"] == pytest.approx(sqnr["matched"])


def test_the_inputs_option_and_files_that_do_not_record_it(rounded, tmp_path) -> None:
    """--inputs takes fp32 (the default), quantized or matched only; a file written before
    the field (no "inputs" in its header) still loads."""
    folder, report = rounded
    assert report["inputs"] == "fp32"
    result = invoke("round-weights", folder / "m.onnx", "--profile", folder / "p.json",
                    "--data", folder / "calib.npz", "--inputs", "int8")
    assert result.exit_code == 2 and "'fp32', 'quantized', 'matched'" in result.output
    assert "--inputs" in invoke("round-weights", "--help").output
    weights = load_rounding(str(folder / "r.npz"))
    with open(tmp_path / "old.npz", "wb") as handle:
        save_rounding(handle, weights, {"model": "m.onnx", "samples": 32})
    old = load_rounding(str(tmp_path / "old.npz"))
    assert old.keys() == weights.keys()
    assert all(np.array_equal(old[k].codes, weights[k].codes) for k in old)


def test_a_one_dimensional_conv_is_rounded_on_its_own_input(tmp_path) -> None:
    """A Conv1d (silero-vad's STFT and encoder) runs as a 2-D Conv of its input reshaped: the
    rounding reads the input the float node multiplies (the reshaped one), not the value
    before the view, and chooses codes that bring the layer's output closer."""
    rng = np.random.default_rng(6)
    proto = model([helper.make_node("Conv", ["x", "w"], ["h"], name="c1", strides=[2],
                                    pads=[1, 1]),
                   helper.make_node("Relu", ["h"], ["y"], name="relu")],
                  {"x": [1, 4, 40]}, {"y": [1, 8, 20]},
                  {"w": rng.normal(0, .3, (8, 4, 4)).astype(np.float32)})
    onnx.save(proto, str(tmp_path / "m.onnx"))
    mix = rng.normal(size=(4, 4))
    calib = np.einsum("ij,njl->nil", mix, rng.normal(size=(16, 4, 40))).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=calib[:, None])
    (layer,) = _profiled_and_rounded(tmp_path)["layers"]
    assert layer["node"] == "c1" and layer["chosen_error"] <= layer["nearest_error"]
