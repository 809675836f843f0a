"""`ember accuracy` end to end on the digits CNN, its gates and its bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from ember.accuracy import BitExactness
from ember.flow import CompileOptions, quantize_model
from profiler import format as profile_format
from quantizer.reference import run_int8
from simulator.program import Program
from tests.cli import DIGITS, assert_one_line_error, invoke
from tests.onnx_builder import model


def test_digits_int8_stays_within_half_a_point_of_fp32(digits_profile, tmp_path) -> None:
    html, qdq = tmp_path / "report.html", tmp_path / "q.onnx"
    result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile, "--data",
                    DIGITS / "eval.npz", "--per-layer", "--json", "--html", html,
                    "--emit-onnx", qdq)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["samples"] == 450
    assert report["top1_accuracy_fp32"] - report["top1_accuracy_int8"] <= 0.005
    assert report["top1_agreement"] >= 0.99 and report["sqnr_db"] > 30
    names = {layer["name"] for layer in report["layers"]}
    assert {"relu1", "relu2", "pool"} <= names
    layer = report["layers"][0]
    assert layer["own_sqnr_db"] >= layer["accumulated_sqnr_db"] - 1e-9
    assert "<svg" in html.read_text()
    exported = onnx.load(qdq)
    onnx.checker.check_model(exported, full_check=True)
    meta = {n.name: {p.key: p.value for p in n.metadata_props} for n in exported.graph.node}
    assert any("sqnr_db" in m for m in meta.values())


def test_per_layer_covers_every_tensor_the_output_included(digits_profile) -> None:
    """The classifier's own row is there (its accumulated SQNR is the output's), and the
    tensors without an int8 value of their own (BatchNorm outputs fused away) are named."""
    result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile, "--data",
                    DIGITS / "eval.npz", "--samples", "20", "--per-layer", "--json")
    report = json.loads(result.output)
    layers = {layer["name"]: layer for layer in report["layers"]}
    assert set(layers) == {"input", "relu1", "relu2", "pool", "flatten", "logits"}
    assert layers["logits"]["op"] == "Gemm"
    assert layers["logits"]["accumulated_sqnr_db"] == pytest.approx(report["sqnr_db"])
    # Each requantizing kernel (the Convs with their ReLUs fused, the Gemm) and the MaxPool
    # round once: no loss beyond their output's rounding; a view and the input have no kernel.
    for name in ("relu1", "relu2", "pool", "logits"):
        assert layers[name]["kernel_loss_db"] < 0.01 and layers[name]["kernel_sqnr_db"] > 35
    assert layers["flatten"]["kernel_sqnr_db"] is None is layers["input"]["kernel_sqnr_db"]
    assert report["lossy_kernels"] == []
    assert any("2 of the 8 tensors" in note and note.endswith("bn1, bn2")
               for note in report["notes"])


def test_accuracy_gate_exits_3_and_still_reports(digits_profile) -> None:
    result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile, "--data",
                    DIGITS / "eval.npz", "--samples", "20", "--min-sqnr", "200", "--json")
    assert result.exit_code == 3
    assert json.loads(result.stdout)["samples"] == 20
    assert "accuracy gate failed" in result.stderr


def test_profile_of_another_model_is_rejected(digits_profile, tmp_path) -> None:
    other = tmp_path / "other.onnx"
    proto = onnx.load(DIGITS / "model.onnx")
    weight = proto.graph.initializer[0]
    weight.CopyFrom(onnx.numpy_helper.from_array(
        onnx.numpy_helper.to_array(weight) * 1.5, weight.name))
    onnx.save(proto, other)
    result = invoke("accuracy", other, "--profile", digits_profile, "--data",
                    DIGITS / "eval.npz")
    assert result.exit_code == 2
    assert "does not match the model: different weights" in result.output


def test_evaluation_data_of_the_wrong_shape_names_the_input(digits_profile, tmp_path) -> None:
    np.savez(tmp_path / "bad.npz", input=np.zeros((3, 1, 9, 9), np.float32))
    result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile, "--data",
                    tmp_path / "bad.npz")
    assert result.exit_code == 2
    assert "input" in result.output and "9" in result.output


def test_a_non_classifier_output_omits_top1_and_says_so(tmp_path) -> None:
    proto = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": [1, 2, 3]},
                  {"y": [1, 2, 3]})
    path = tmp_path / "relu.onnx"
    onnx.save(proto, path)
    data = tmp_path / "data.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((8, 2, 3)).astype(np.float32))
    profile = tmp_path / "relu.profile.json"
    assert invoke("quantize-profile", path, "--data", data, "-o", profile).exit_code == 0
    result = invoke("accuracy", path, "--profile", profile, "--data", data, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["top1_agreement"] is None and report["sqnr_db"] > 30
    assert any("not a classifier" in note for note in report["notes"])
    table = invoke("accuracy", path, "--profile", profile, "--data", data)
    assert "not a classifier ([batch, classes])" in " ".join(table.output.split())


@pytest.fixture(scope="module")
def digits_program(digits_profile, tmp_path_factory) -> Path:
    # Non-default options: accuracy must take them from the program to stay bit-exact.
    path = tmp_path_factory.mktemp("prog") / "digits.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "--calibration", "percentile", "--per-tensor", "--emit-onnx",
                    path.with_suffix(".qdq.onnx"), "-o", path)
    assert result.exit_code == 0, result.output
    onnx.checker.check_model(onnx.load(path.with_suffix(".qdq.onnx")), full_check=True)
    return path


def test_the_program_equals_the_integer_reference_on_every_sample(digits_profile,
                                                                   digits_program) -> None:
    result = invoke("accuracy", DIGITS / "model.onnx", digits_program, "--profile",
                    digits_profile, "--data", DIGITS / "eval.npz", "--samples", "25", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["bit_exact"] is True and report["first_difference"] is None
    assert report["options"]["program"] == str(digits_program)
    assert report["options"]["calibration"] == "percentile"
    assert report["options"]["per_channel"] is False


def test_a_program_with_another_profile_is_rejected(digits_program, tmp_path) -> None:
    other = tmp_path / "other.profile.json"
    assert invoke("quantize-profile", DIGITS / "model.onnx", "--data", DIGITS / "calib.npz",
                  "--samples", "16", "-o", other).exit_code == 0
    result = invoke("accuracy", DIGITS / "model.onnx", digits_program, "--profile", other,
                    "--data", DIGITS / "eval.npz", "--samples", "2")
    assert result.exit_code == 2
    assert "compiled with another profile" in result.output


def test_simulate_takes_an_evaluation_file_with_labels(digits_program, tmp_path) -> None:
    with np.load(DIGITS / "eval.npz") as data:
        np.savez(tmp_path / "three.npz", input=data["input"][:3], labels=data["labels"][:3])
    out = tmp_path / "out.npz"
    result = invoke("simulate", digits_program, "-i", tmp_path / "three.npz", "-o", out)
    assert result.exit_code == 0, result.output
    assert np.load(out)["logits"].shape == (3, 1, 10)


def _eight_samples(tmp_path) -> tuple[Path, np.ndarray]:
    with np.load(DIGITS / "eval.npz") as data:
        np.savez(tmp_path / "eight.npz", input=data["input"][:8])
        return tmp_path / "eight.npz", data["labels"][:8]


@pytest.mark.parametrize("change,message", [
    (lambda y: np.where(np.arange(8) == 3, 10, y), "label 10 at sample 3"),
    (lambda y: np.where(np.arange(8) == 0, -1, y), "label -1 at sample 0"),
    (lambda y: np.where(np.arange(8) == 5, 6.5, y), "label 6.5 at sample 5"),
    (lambda y: np.full(8, np.nan), "label nan at sample 0"),
    (lambda y: np.eye(10)[y] * 2, "labels of shape [8, 10] are not one-hot"),
    (lambda y: np.ones((8, 10)), "labels of shape [8, 10] are not one-hot"),
    (lambda y: np.eye(3)[y % 3], "labels of shape [8, 3]"),
    (lambda y: y.astype(str), "labels of type <U"),
    (lambda y: np.int64(3), "labels of shape []"),
])
def test_labels_that_are_not_one_class_per_sample_are_refused(digits_profile, tmp_path, change,
                                                             message) -> None:
    data, labels = _eight_samples(tmp_path)
    np.save(tmp_path / "labels.npy", change(labels))
    result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile, "--data",
                    data, "--labels", tmp_path / "labels.npy")
    assert result.exit_code == 2, result.output
    assert f"labels.npy: {message}" in result.output
    assert "expected one class index in [0, 10) per sample" in result.output
    assert result.output.strip().count("\n") == 0


def test_one_hot_labels_count_as_their_class(digits_profile, tmp_path) -> None:
    data, labels = _eight_samples(tmp_path)
    found = []
    for stored in (labels, labels.astype(np.float32)[:, None], np.eye(10, dtype=np.uint8)[labels]):
        np.save(tmp_path / "labels.npy", stored)
        result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile, "--data",
                        data, "--labels", tmp_path / "labels.npy", "--json")
        assert result.exit_code == 0, result.output
        found.append(json.loads(result.stdout)["top1_accuracy_fp32"])
    assert found[0] == found[1] == found[2] > 0.5


def test_a_profile_of_random_data_is_named_in_a_one_line_warning(tmp_path) -> None:
    synthetic = tmp_path / "random.profile.json"
    assert invoke("quantize-profile", DIGITS / "model.onnx", "--random", 4, "-o",
                  synthetic).exit_code == 0
    result = invoke("accuracy", DIGITS / "model.onnx", "--profile", synthetic, "--data",
                    DIGITS / "eval.npz", "--samples", "10", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["samples"] == 10
    assert result.stderr.count("\n") == 1 and "synthetic --random data" in result.stderr


def test_batches_of_samples_give_the_report_of_one_at_a_time(digits_profile,
                                                              digits_program) -> None:
    """25 samples in batches of 4 (the last short) and one at a time: the same report."""
    reports = []
    for batch in ("4", "1"):
        result = invoke("accuracy", DIGITS / "model.onnx", digits_program, "--profile",
                        digits_profile, "--data", DIGITS / "eval.npz", "--samples", "25",
                        "--batch", batch, "--json")
        assert result.exit_code == 0, result.output
        reports.append(json.loads(result.output))
    assert reports[0]["bit_exact"] is True
    assert reports[0] == reports[1]


def test_a_difference_in_a_batch_names_its_sample(digits_profile, digits_program) -> None:
    """The first difference counts samples across batches: sample 6 is the third of the
    second batch of 4."""
    program = Program.load(digits_program)
    built = quantize_model(DIGITS / "model.onnx", profile_format.load(digits_profile),
                           CompileOptions.from_header(program.metadata["options"]).quant)
    exactness = BitExactness(program, built.qgraph, batch=4)
    with np.load(DIGITS / "eval.npz") as data:
        inputs = data["input"][:9]
    for n, x in enumerate(inputs):
        env = dict(run_int8(built.qgraph, {"input": x[None]}, keep_all=True))
        if n == 6:  # the reference says otherwise for this sample
            raw = exactness.raw_output["logits"]
            env[raw] = env[raw].copy()
            env[raw].flat[3] += 1
        exactness.add(env)
    exactness.flush()
    assert exactness.samples == 9
    assert exactness.first_difference["sample"] == 6
    assert exactness.first_difference["element"] == [0, 3]


def test_simulate_runs_samples_in_batches(digits_program, tmp_path) -> None:
    """Seven samples in batches of 3 give the outputs of one at a time, in order."""
    with np.load(DIGITS / "eval.npz") as data:
        np.savez(tmp_path / "seven.npz", input=data["input"][:7])
    outputs = []
    for batch in ("3", "1"):
        out = tmp_path / f"out{batch}.npz"
        result = invoke("simulate", digits_program, "-i", tmp_path / "seven.npz", "-o", out,
                        "--raw", "--batch", batch)
        assert result.exit_code == 0, result.output
        outputs.append(np.load(out)["logits"])
    assert outputs[0].shape == (7, 1, 10)
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert len({row.tobytes() for row in outputs[0]}) == 7  # each its own sample's


def test_compare_calibrations_scores_every_method_on_the_same_data(digits_profile) -> None:
    from quantizer.calibrate import METHODS
    args = ("accuracy", DIGITS / "model.onnx", "--profile", digits_profile, "--data",
            DIGITS / "eval.npz", "--samples", 40, "--compare-calibrations")
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert list(doc["calibrations"]) == list(METHODS)
    sqnr = {m: r["outputs"][0]["sqnr_db"] for m, r in doc["calibrations"].items()}
    assert doc["best"] == max(sqnr, key=sqnr.get)
    assert len(set(sqnr.values())) > 1  # the methods really differ
    table = invoke(*args)
    assert table.exit_code == 0, table.output
    assert f"{doc['best']} (best)" in table.output and "(default)" in table.output
    refused = invoke(*args, "--per-layer")
    assert_one_line_error(refused, "--compare-calibrations", "--per-layer")
