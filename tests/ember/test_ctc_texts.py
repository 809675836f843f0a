"""Texts read by a CTC head (`--ctc-blank CLASS`): each sample's per-step argmaxes, repeats
merged and blanks dropped, against a label row of class indices padded with -1; right only
when equal as a whole. `ember accuracy` reports the share of texts read right by fp32 and by
int8, and `ember compile --max-drop` holds it; malformed labels are one-line errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from ember.accuracy import ctc_batch_axis, sequence_labels
from ember.errors import EmberError
from ember.flow import quantize_model
from ember.ort import session
from ember.reports.metrics import Top1, ctc_decode
from profiler import format as profile_format
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from tests.cli import assert_one_line_error, invoke, profiled
from tests.onnx_builder import model

STEPS, FEATURES, CLASSES, SAMPLES, BLANK = 10, 8, 6, 16, 0


def test_ctc_decoding_merges_repeats_and_drops_blanks() -> None:
    assert ctc_decode(np.array([0, 3, 3, 0, 3, 1, 1, 0, 0, 2]), 0) == [3, 3, 1, 2]
    assert ctc_decode(np.array([5, 5, 5]), 5) == [] and ctc_decode(np.array([2]), 0) == [2]


def test_texts_counted_whole_on_either_batch_axis() -> None:
    """[steps, batch, classes]: the batch is axis 1 of the argmaxes. One sample's text differs
    by a repeat that a blank splits; the other's by a merged step only (same text)."""
    reference = np.zeros((4, 2, 3))
    reference[[0, 1, 3], 0, 1] = 1  # sample 0: 1 1 0 1 -> "1 1"
    reference[[2], 0, 0] = 1
    reference[:, 1, 2] = 1  # sample 1: 2 2 2 2 -> "2"
    approx = reference.copy()
    approx[2, 0] = [0, 2, 0]  # sample 0: 1 1 1 1 -> "1"
    approx[1, 1] = [0, 0, 3]  # sample 1: the same argmax
    labels = np.array([[1, 1], [2, -1]])
    counts = Top1(axis=-1, blank=0, batch_axis=1)
    counts.add(reference, approx, labels)
    assert (counts.labelled, counts.correct_reference, counts.correct_approx) == (2, 2, 1)
    assert counts.accuracy("reference") == 1.0 and counts.accuracy("approx") == 0.5
    assert (counts.positions, counts.agree) == (8, 7)  # per-step agreement still counted
    # [batch, steps, classes]: the same samples with the batch first.
    first = Top1(axis=-1, blank=0, batch_axis=0)
    first.add(reference.transpose(1, 0, 2), approx.transpose(1, 0, 2), labels)
    assert first == dataclasses.replace(counts, batch_axis=0)
    merged = Top1(axis=-1, blank=0, batch_axis=1)
    merged.merge(counts)
    assert merged == counts


def test_the_batch_axis_is_the_one_of_the_batch_size() -> None:
    assert ctc_batch_axis((20, 1, 30), 2, 1, "y") == 1
    assert ctc_batch_axis((1, 40, 30), 2, 1, "y") == 0
    assert ctc_batch_axis((1, 1, 30), 2, 1, "y") == 0
    with pytest.raises(EmberError, match=r"^--ctc-blank: output 'y' has shape \[4, 30\]"):
        ctc_batch_axis((4, 30), 1, 1, "y")


@pytest.mark.parametrize("labels, message", [
    (np.array([1, 2]), "labels of shape [2], one class per sample; --ctc-blank compares whole "
                       "sequences"),
    (np.array([[1, 0]]), "label 0 at sample 0, position 1; expected one row of class indices"),
    (np.array([[1, -1, 2]]), "label 2 at sample 0, position 2"),
    (np.array([[1, 6]]), "label 6 at sample 0, position 1"),
    (np.array([[1, -2]]), "label -2 at sample 0, position 1"),
    (np.array([["a"]]), "labels of shape [1, 1] and type <U1")])
def test_malformed_text_labels_are_refused(labels, message) -> None:
    with pytest.raises(EmberError) as err:
        sequence_labels(labels, CLASSES, BLANK, "t.npz")
    assert str(err.value).startswith(f"t.npz: {message}") and "\n" not in str(err.value)


def _ctc_model():
    """x [1, STEPS, FEATURES] -> MatMul -> Add -> Transpose -> y [STEPS, 1, CLASSES]: a
    CRNN's CTC head, time first as torch exports it."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Add", ["h", "b"], ["s"], name="bias"),
             helper.make_node("Transpose", ["s"], ["y"], perm=[1, 0, 2], name="time_first")]
    return model(nodes, {"x": [1, STEPS, FEATURES]}, {"y": [STEPS, 1, CLASSES]},
                 {"w": rng.normal(0, .5, (FEATURES, CLASSES)).astype(np.float32),
                  "b": rng.normal(0, .1, CLASSES).astype(np.float32)})


def _texts(folder, options: QuantOptions = QuantOptions()) -> tuple[list, list]:
    """fp32's texts (onnxruntime) and int8's (the integer reference), sample by sample."""
    fp32 = session(onnx.load(str(folder / "m.onnx")))
    qgraph = quantize_model(str(folder / "m.onnx"), profile_format.load(folder / "p.json"),
                            options).qgraph
    read, read_int8 = [], []
    for x in np.load(folder / "eval.npz")["x"]:
        feeds = {"x": x[None]}
        read.append(ctc_decode(fp32.run(None, feeds)[0].argmax(-1)[:, 0], BLANK))
        read_int8.append(ctc_decode(np.asarray(run_int8(qgraph, feeds)["y"]).argmax(-1)[:, 0],
                                    BLANK))
    return read, read_int8


def _rows(texts: list[list[int]]) -> np.ndarray:
    rows = np.full((len(texts), STEPS), -1, np.int64)
    for i, text in enumerate(texts):
        rows[i, :len(text)] = text
    return rows


@pytest.fixture(scope="module")
def ctc(tmp_path_factory):
    """Labels: fp32's own texts, but the first sample's changed (fp32 reads it wrong)."""
    rng = np.random.default_rng(4)
    calib, evaluation = ({"x": rng.standard_normal((SAMPLES, STEPS, FEATURES))
                          .astype(np.float32)} for _ in range(2))
    folder = profiled(tmp_path_factory.mktemp("ctc"), _ctc_model(), calib, evaluation)
    read, read_int8 = _texts(folder)
    truth = [list(text) for text in read]
    truth[0] = truth[0][:-1] if len(truth[0]) > 1 else [1, 2]
    np.savez(folder / "texts.npz", x=evaluation["x"], labels=_rows(truth))
    right = sum(t == r for t, r in zip(truth, read))
    right_int8 = sum(t == r for t, r in zip(truth, read_int8))
    # What the tests below need: int8 misreads a text that fp32 reads right.
    assert right == SAMPLES - 1 and right_int8 < right
    return folder, right, right_int8


def test_accuracy_counts_texts_read_right(ctc, tmp_path) -> None:
    folder, right, right_int8 = ctc
    html = tmp_path / "r.html"
    args = ("accuracy", folder / "m.onnx", "--profile", folder / "p.json", "--data",
            folder / "texts.npz", "--class-axis", "-1", "--ctc-blank", BLANK)
    report = json.loads(invoke(*args, "--json").output)
    out = report["outputs"][0]
    assert out["sequences"] is True and out["top1_per_position"] is True
    assert out["top1_accuracy_fp32"] == right / SAMPLES
    assert out["top1_accuracy_int8"] == right_int8 / SAMPLES
    assert report["options"]["ctc_blank"] == BLANK
    assert any("its accuracy is of whole texts" in note for note in report["notes"])
    table = invoke(*args, "--html", html)
    assert table.exit_code == 0, table.output
    assert f"{right / SAMPLES:.2%} of texts" in table.output
    assert f"{right_int8 / SAMPLES:.2%} of texts</td>" in html.read_text()
    # Shards count the same texts.
    two = json.loads(invoke(*args, "--json", "--cluster", "local:2").output)
    assert two["outputs"] == report["outputs"]


def test_max_drop_holds_the_texts(ctc, tmp_path) -> None:
    """int8 misreads a text fp32 reads: --max-drop 0 raises until none is lost, and the
    chosen options read every text fp32 reads."""
    folder, right, right_int8 = ctc
    result = invoke("compile", folder / "m.onnx", "--profile", folder / "p.json", "--data",
                    folder / "texts.npz", "-o", tmp_path / "m.ember", "--max-drop", 0,
                    "--class-axis", "-1", "--ctc-blank", BLANK, "--json")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.output)["budget"]
    before, after = spent["int8"]["outputs"][0], spent["chosen"]["outputs"][0]
    assert spent["met"] and spent["raised"] and before["accuracy_name"] == "text accuracy"
    assert before["top1_accuracy"] == right_int8 / SAMPLES
    assert after["top1_accuracy"] == after["top1_accuracy_fp32"] == right / SAMPLES
    table = invoke("compile", folder / "m.onnx", "--profile", folder / "p.json", "--data",
                   folder / "texts.npz", "-o", tmp_path / "m.ember", "--max-drop", 0,
                   "--class-axis", "-1", "--ctc-blank", BLANK).output
    assert f"y text accuracy (fp32 {100 * right / SAMPLES:.2f}%)" in table


def test_text_labels_need_ctc_blank_and_a_class_axis(ctc, tmp_path) -> None:
    folder, *_ = ctc
    base = ("compile", folder / "m.onnx", "--profile", folder / "p.json", "--data",
            folder / "texts.npz", "-o", tmp_path / "m.ember")
    assert_one_line_error(invoke(*base, "--max-drop", 1, "--class-axis", "-1"),
                          "--max-drop compares accuracy with labels, and output 'y' is scored "
                          "per position (--class-axis y=2): for a CTC head, give --ctc-blank")
    assert_one_line_error(invoke(*base, "--max-drop", 1, "--ctc-blank", 0),
                          "--ctc-blank 0 reads an output scored per position as a CTC head's: "
                          "name its class axis with --class-axis")
    assert_one_line_error(invoke(*base, "--max-drop", 1, "--class-axis", "-1", "--ctc-blank", 9),
                          f"--ctc-blank 9: output 'y' has {CLASSES} classes")
    usage = invoke(*base[:4], "--ctc-blank", 0)
    assert usage.exit_code == 2 and "--ctc-blank says how texts are scored" in usage.output
    assert not (tmp_path / "m.ember").exists()
