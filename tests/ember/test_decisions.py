"""Yes/no outputs (`--threshold [OUTPUT=]T`): a binary classifier's one probability, a voice
detector's speech probability per chunk. Each score above T is a yes; top-1 agreement and
accuracy count decisions, on `ember accuracy` and in a budget's --max-drop and
--min-agreement; labels are 0 or 1 per decision; bad values are one-line errors."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import helper

from ember.accuracy import Decisions, decision_labels
from ember.errors import EmberError
from ember.flow import quantize_model
from ember.ort import session
from ember.reports.metrics import Top1
from profiler import format as profile_format
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from tests.cli import assert_one_line_error, invoke, profiled
from tests.onnx_builder import model

CHUNKS, FEATURES, SAMPLES = 16, 8, 16


def test_decisions_are_scores_above_the_threshold() -> None:
    reference = np.array([[0.2, 0.7, 0.51], [0.9, 0.1, 0.5]])
    approx = np.array([[0.3, 0.6, 0.49], [0.8, 0.2, 0.5]])  # one decision flips
    labels = np.array([[0, 1, 0], [1, 0, 1]])
    counts = Top1(threshold=0.5)
    counts.add(reference, approx, labels)
    assert (counts.positions, counts.agree) == (6, 5)
    assert (counts.labelled, counts.correct_reference, counts.correct_approx) == (6, 4, 5)
    merged = Top1(threshold=0.5)
    merged.merge(counts)
    assert merged == counts


def test_thresholds_parse_and_resolve() -> None:
    decisions = Decisions.parse(["0.5", "logit=0"])
    assert decisions == Decisions(0.5, (("logit", 0.0),))
    assert decisions.resolve({"p": (1, 1), "logit": (1, 1)}, "m.onnx") == {"p": 0.5,
                                                                            "logit": 0.0}
    assert Decisions.parse(["p=0.3"]).resolve({"p": (1,), "q": (1,)}, "m.onnx") == {"p": 0.3}
    with pytest.raises(EmberError, match=re.escape("--threshold q=0.5: m.onnx has no output "
                                                   "'q'; its outputs: 'p' [1, 1]")):
        Decisions.parse(["q=0.5"]).resolve({"p": (1, 1)}, "m.onnx")


@pytest.mark.parametrize("values, message", [
    (["high"], "--threshold 'high': expected T or OUTPUT=T, T a finite number"),
    (["p=nan"], "--threshold 'p=nan': expected T or OUTPUT=T, T a finite number"),
    (["=0.5"], "--threshold '=0.5': no output name before '='"),
    (["p=0.5", "p=0.6"], "--threshold given twice for output 'p' (0.5 and 0.6)")])
def test_thresholds_that_do_not_parse(values, message) -> None:
    with pytest.raises(EmberError, match="^" + re.escape(message)):
        Decisions.parse(values)


@pytest.mark.parametrize("labels, message", [
    (np.array([[0, 1]]), "labels of shape [1, 2] and type int64; expected 0 or 1 for each of a "
                         "sample's 3 decisions: [N, 3]"),
    (np.array([[0, 1, 2]]), "label 2 at sample 0, position 2; expected 0 or 1"),
    (np.array([["a", "b", "c"]]), "labels of shape [1, 3] and type <U1")])
def test_malformed_decision_labels_are_refused(labels, message) -> None:
    with pytest.raises(EmberError) as err:
        decision_labels(labels, 3, "l.npz")
    assert str(err.value).startswith(f"l.npz: {message}") and "\n" not in str(err.value)
    assert decision_labels(np.array([[0, 1, 1.0]]), 3, "l.npz").dtype == np.int64
    assert decision_labels(np.array([1, 0]), 1, "l.npz").tolist() == [[1], [0]]


def _detector():
    """x [1, CHUNKS, FEATURES] -> MatMul -> Sigmoid -> p [1, CHUNKS]: a speech probability
    per chunk, its weights small so that many scores lie near 0.5."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Sigmoid", ["h"], ["s"], name="gate"),
             helper.make_node("Reshape", ["s", "shape"], ["p"], name="flat")]
    return model(nodes, {"x": [1, CHUNKS, FEATURES]}, {"p": [1, CHUNKS]},
                 {"w": rng.normal(0, .15, (FEATURES, 1)).astype(np.float32),
                  "shape": np.array([1, CHUNKS], np.int64)})


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """Labels: fp32's own decisions, the first chunk of each sample flipped (fp32 gets those
    wrong)."""
    rng = np.random.default_rng(6)
    calib, evaluation = ({"x": rng.standard_normal((SAMPLES, CHUNKS, FEATURES))
                          .astype(np.float32)} for _ in range(2))
    folder = profiled(tmp_path_factory.mktemp("decisions"), _detector(), calib, evaluation)
    fp32 = session(onnx.load(str(folder / "m.onnx")))
    qgraph = quantize_model(str(folder / "m.onnx"), profile_format.load(folder / "p.json"),
                            QuantOptions()).qgraph
    yes, yes_int8 = [], []
    for x in evaluation["x"]:
        yes.append(fp32.run(None, {"x": x[None]})[0][0] > 0.5)
        yes_int8.append(np.asarray(run_int8(qgraph, {"x": x[None]})["p"])[0] > 0.5)
    yes, yes_int8 = np.array(yes), np.array(yes_int8)
    labels = yes.astype(np.int64)
    labels[:, 0] ^= 1
    np.savez(folder / "labelled.npz", x=evaluation["x"], labels=labels)
    right, right_int8 = np.sum(labels == yes), np.sum(labels == yes_int8)
    assert right_int8 < right  # int8 flips decisions fp32 gets right: what --max-drop catches
    return folder, right, right_int8, int(np.sum(yes == yes_int8))


def test_accuracy_counts_decisions(detector) -> None:
    folder, right, right_int8, agree = detector
    decisions = SAMPLES * CHUNKS
    args = ("accuracy", folder / "m.onnx", "--profile", folder / "p.json", "--data",
            folder / "labelled.npz", "--threshold", "p=0.5")
    report = json.loads(invoke(*args, "--json").output)
    out = report["outputs"][0]
    assert out["threshold"] == 0.5 and out["top1_positions"] == decisions
    assert out["top1_agreement"] == agree / decisions
    assert out["top1_accuracy_fp32"] == right / decisions
    assert out["top1_accuracy_int8"] == right_int8 / decisions
    assert report["options"]["thresholds"] == {"p": 0.5}
    assert any(note.startswith(f"output 'p': yes/no decisions, a score above 0.5 a yes, at each "
                               f"of its {CHUNKS} positions a sample ({decisions} in all)")
               for note in report["notes"])
    table = invoke(*args).output
    assert f"{100 * agree / decisions:.2f}% of {decisions} decisions" in table
    two = json.loads(invoke(*args, "--json", "--cluster", "local:2").output)
    assert two["outputs"] == report["outputs"]


def test_max_drop_holds_the_decisions(detector, tmp_path) -> None:
    folder, right, right_int8, _ = detector
    decisions = SAMPLES * CHUNKS
    result = invoke("compile", folder / "m.onnx", "--profile", folder / "p.json", "--data",
                    folder / "labelled.npz", "-o", tmp_path / "m.ember", "--max-drop", 0,
                    "--threshold", "0.5", "--json")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.output)["budget"]
    before, after = spent["int8"]["outputs"][0], spent["chosen"]["outputs"][0]
    assert spent["met"] and spent["raised"]
    assert before["accuracy_name"] == "accuracy of decisions > 0.5"
    assert before["top1_accuracy"] == right_int8 / decisions
    assert after["top1_accuracy"] >= after["top1_accuracy_fp32"] == right / decisions


def test_threshold_errors(detector, tmp_path) -> None:
    folder, *_ = detector
    base = ("compile", folder / "m.onnx", "--profile", folder / "p.json", "--data",
            folder / "labelled.npz", "-o", tmp_path / "m.ember")
    assert_one_line_error(invoke(*base, "--max-drop", 1, "--threshold", "p=0.5",
                                 "--class-axis", "p=1"),
                          "output 'p': --class-axis reads class scores and --threshold yes/no "
                          "scores; give one of them for it")
    assert_one_line_error(invoke(*base, "--max-drop", 1, "--threshold", "q=0.5"),
                          "--threshold q=0.5: m.onnx has no output 'q'")
    usage = invoke(*base[:4], "--threshold", "0.5")
    assert usage.exit_code == 2 and "--threshold says which outputs are yes/no" in usage.output
    assert not (tmp_path / "m.ember").exists()
