"""Top-1 per position (`--class-axis [OUTPUT=]AXIS`): outputs whose class scores are not the
last axis of [batch, classes], such as a token classifier's [batch, seq, vocab], a CTC head's
[steps, batch, classes] or a segmentation map's [batch, classes, H, W], agree per position
(each index of the other axes), on `ember accuracy`, through shards, and in a budget's
`--min-agreement`; bad axes are one-line errors naming the output."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import helper

from ember.accuracy import ClassAxes
from ember.budget import Budget
from ember.errors import EmberError
from ember.flow import quantize_model
from ember.ort import session
from ember.reports.accuracy import AccuracyReport, OutputAccuracy
from ember.reports.metrics import Top1
from profiler import format as profile_format
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from tests.cli import assert_one_line_error, invoke, profiled
from tests.onnx_builder import model

SEQ, FEATURES, CLASSES, SAMPLES = 6, 8, 5, 12


def test_top1_along_an_axis_counts_every_position() -> None:
    """[batch, seq, classes] on the last axis: 2 samples × 3 steps = 6 positions."""
    ref = np.zeros((2, 3, 4))
    ref[..., 1] = 1
    app = ref.copy()
    app[0, 2, 3] = 2  # one step of the first sample changes its class
    top1 = Top1(axis=2)
    top1.add(ref, app, None)
    assert (top1.positions, top1.agree) == (6, 5) and top1.agreement == pytest.approx(5 / 6)


def test_top1_of_a_map_on_its_class_axis() -> None:
    """[batch, classes, H, W] on axis 1: a position is a pixel."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 3, 4, 5))
    app = ref.copy()
    app[1, :, 0, 0] = -ref[1, :, 0, 0]  # the argmax of one pixel moves
    top1 = Top1(axis=1)
    top1.add(ref, app, None)
    assert top1.positions == 2 * 4 * 5 and top1.agree == top1.positions - 1


def test_top1_shards_merge_into_the_whole_and_refuse_another_axis() -> None:
    rng = np.random.default_rng(1)
    ref, app = rng.standard_normal((2, 8, 7, 4))
    whole = Top1(axis=-1)
    whole.add(ref, app, None)
    merged = Top1(axis=-1)
    for part in (slice(0, 3), slice(3, 7), slice(7, 8)):
        shard = Top1(axis=-1)
        shard.add(ref[part], app[part], None)
        merged.merge(shard)
    assert merged == whole and whole.positions == 8 * 7
    with pytest.raises(ValueError, match="axis 1 merged into axis -1"):
        merged.merge(Top1(axis=1))


def test_class_axes_parse_and_resolve() -> None:
    shapes = {"logits": (1, 6, 5), "scores": (1, 10), "steps": (20, 1, 30)}
    axes = ClassAxes.parse(["-1", "steps=2"])
    assert axes == ClassAxes(-1, (("steps", 2),))
    assert axes.resolve(shapes, "m.onnx") == {"logits": 2, "scores": 1, "steps": 2}
    # Unnamed: only [batch, classes] outputs, on their last axis.
    assert ClassAxes().resolve(shapes, "m.onnx") == {"scores": 1}
    # A name holding '=' splits at the last one.
    assert ClassAxes.parse(["a=b=0"]).by_output == (("a=b", 0),)


@pytest.mark.parametrize("values, message", [
    (["x"], "--class-axis 'x': expected AXIS or OUTPUT=AXIS"),
    (["=1"], "--class-axis '=1': no output name before '='"),
    (["1", "2"], "--class-axis given twice for every output (1 and 2)"),
    (["y=1", "y=2"], "--class-axis given twice for output 'y' (1 and 2)")])
def test_class_axes_that_do_not_parse(values, message) -> None:
    with pytest.raises(EmberError, match="^" + re.escape(message)):
        ClassAxes.parse(values)


def _sequence_model():
    """x [1, SEQ, FEATURES] -> MatMul -> Add -> y [1, SEQ, CLASSES]: a token classifier."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Add", ["h", "b"], ["y"], name="bias")]
    return model(nodes, {"x": [1, SEQ, FEATURES]}, {"y": [1, SEQ, CLASSES]},
                 {"w": rng.normal(0, .5, (FEATURES, CLASSES)).astype(np.float32),
                  "b": rng.normal(0, .1, CLASSES).astype(np.float32)})


@pytest.fixture(scope="module")
def sequence(tmp_path_factory):
    rng = np.random.default_rng(1)
    calib, evaluation = ({"x": rng.standard_normal((SAMPLES, SEQ, FEATURES)).astype(np.float32)}
                         for _ in range(2))
    return profiled(tmp_path_factory.mktemp("class_axis"), _sequence_model(), calib,
                    evaluation)


def _accuracy(folder, *options):
    return invoke("accuracy", folder / "m.onnx", "--profile", folder / "p.json", "--data",
                  folder / "eval.npz", *options)


def _agreement_by_hand(folder) -> tuple[int, int]:
    """(positions agreeing, positions): onnxruntime's fp32 argmax against the integer
    reference's, step by step, sample by sample."""
    proto = onnx.load(str(folder / "m.onnx"))
    fp32 = session(proto)
    qgraph = quantize_model(str(folder / "m.onnx"), profile_format.load(folder / "p.json"),
                            QuantOptions()).qgraph
    agree = positions = 0
    for x in np.load(folder / "eval.npz")["x"]:
        feeds = {"x": x[None]}
        want = fp32.run(None, feeds)[0].argmax(-1)
        got = np.asarray(run_int8(qgraph, feeds)["y"]).argmax(-1)
        agree += int(np.sum(want == got))
        positions += want.size
    return agree, positions


def test_a_sequence_output_agrees_per_position(sequence) -> None:
    result = _accuracy(sequence, "--class-axis", "-1", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    out = report["outputs"][0]
    agree, positions = _agreement_by_hand(sequence)
    assert positions == SAMPLES * SEQ
    assert out["top1_positions"] == positions and out["class_axis"] == 2
    assert out["top1_agreement"] == agree / positions and out["top1_per_position"] is True
    assert report["top1_agreement"] == agree / positions and report["top1_per_position"]
    assert report["options"]["class_axes"] == {"y": 2}
    assert any(note.startswith("output 'y': per-position top-1 agreement, the argmax over "
                               f"axis 2 ({CLASSES} classes) of its [1, {SEQ}, {CLASSES}] "
                               f"scores at each of {SEQ} positions a sample, {positions} in all")
               for note in report["notes"])
    # The same axis named by the output, counted from the front.
    named = json.loads(_accuracy(sequence, "--class-axis", "y=2", "--json").output)
    assert named["outputs"][0] == out


def test_per_position_agreement_in_the_table_and_the_html(sequence, tmp_path) -> None:
    html = tmp_path / "r.html"
    result = _accuracy(sequence, "--class-axis", "y=-1", "--html", html)
    assert result.exit_code == 0, result.output
    assert f"of {SAMPLES * SEQ} positions" in result.output
    assert "per-position top-1 agreement" in result.output
    page = html.read_text()
    assert f"of {SAMPLES * SEQ} positions</td>" in page and "per-position top-1" in page
    assert "y=2" in page.split("<h2>Options</h2>")[1]


def test_without_a_class_axis_a_sequence_is_not_a_classifier(sequence) -> None:
    report = json.loads(_accuracy(sequence, "--json").output)
    assert report["top1_agreement"] is None and report["outputs"][0]["class_axis"] is None
    assert any("--class-axis y=AXIS" in note for note in report["notes"])


def test_per_position_counts_merge_across_shards(sequence) -> None:
    """--cluster local:2: the shards' counts along the named axis add up to one process's."""
    args = ("--class-axis", "-1", "--samples", "8", "--json")
    one = json.loads(_accuracy(sequence, *args).output)
    two = json.loads(_accuracy(sequence, *args, "--cluster", "local:2").output)
    assert two["outputs"] == one["outputs"] and one["outputs"][0]["top1_positions"] == 8 * SEQ


@pytest.mark.parametrize("axis, parts", [
    ("3", ("--class-axis 3: output 'y' of m.onnx has shape [1, 6, 5], no axis 3: expected an "
           "axis from -3 to 2",)),
    ("y=-4", ("--class-axis y=-4: output 'y'", "no axis -4")),
    ("logits=2", ("--class-axis logits=2: m.onnx has no output 'logits'; its outputs: 'y' "
                  "[1, 6, 5]",)),
    ("y=0", ("--class-axis y=0: axis 0 of output 'y' of m.onnx (shape [1, 6, 5]) has size 1: "
             "a class axis holds two or more class scores; its axes of more than one: 1 (6), "
             "2 (5)",)),
    ("two", ("--class-axis 'two': expected AXIS or OUTPUT=AXIS",))])
def test_a_bad_class_axis_is_a_one_line_error(sequence, axis, parts) -> None:
    assert_one_line_error(_accuracy(sequence, "--class-axis", axis), *parts)


def test_labels_for_a_per_position_output_are_refused(sequence, tmp_path) -> None:
    """--labels names them for the output: refused. A 'labels' array that comes with the
    data is left unused, with a note."""
    labels = tmp_path / "labels.npy"
    np.save(labels, np.zeros(SAMPLES, np.int64))
    assert_one_line_error(_accuracy(sequence, "--class-axis", "-1", "--labels", labels),
                          f"--labels {labels}: labels are one class index per sample, and "
                          f"output 'y' is scored per position (class axis 2 of [1, 6, 5]): "
                          f"give --ctc-blank for a CTC head's texts")
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.load(sequence / "eval.npz")["x"], labels=np.zeros(SAMPLES, np.int64))
    result = invoke("accuracy", sequence / "m.onnx", "--profile", sequence / "p.json", "--data",
                    data, "--class-axis", "-1", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["top1_accuracy_int8"] is None and report["top1_agreement"] is not None
    assert any(note.endswith("no top-1 accuracy: the labels are one class index per sample")
               for note in report["notes"])


def _compile(folder, *options):
    return invoke("compile", folder / "m.onnx", "--profile", folder / "p.json", "--data",
                  folder / "eval.npz", "-o", folder / "m.ember", *options)


def test_min_agreement_counts_positions_with_a_class_axis(sequence) -> None:
    """int8 misses one step of the 72 (`_agreement_by_hand`): the search raises until every
    step agrees, and the summary says the agreement is per position."""
    agree, positions = _agreement_by_hand(sequence)
    assert 0 < agree < positions
    result = _compile(sequence, "--min-agreement", 100, "--class-axis", "-1", "--json")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.output)["budget"]
    before, after = spent["int8"]["outputs"][0], spent["chosen"]["outputs"][0]
    assert spent["met"] and spent["raised"]
    assert before["top1_agreement"] == agree / positions and after["top1_agreement"] == 1.0
    assert before["top1_per_position"] is True
    table = _compile(sequence, "--min-agreement", 100, "--class-axis", "-1").output
    assert "y per-position top-1 agreement with fp32" in table


def test_a_budget_shortfall_counts_positions() -> None:
    out = OutputAccuracy("y", 20.0, 0.99, 0.1, True, 0.975, shape=(20, 1, 30), class_axis=2,
                         top1_positions=160, top1_per_position=True)
    report = AccuracyReport(model="m.onnx", samples=8, outputs=(out,))
    wanted = Budget(min_agreement=99)
    assert wanted.shortfall(report) == ("output 'y': per-position top-1 agrees with fp32 on "
                                        "97.50% of 160 positions < 99%")
    assert wanted.describe(report) == "y per-position top-1 agreement 97.50%"
    assert wanted.margin(report) == pytest.approx(-1.5)
    assert Budget(min_agreement=97).shortfall(report) is None


def test_min_agreement_without_a_class_axis_is_refused(sequence) -> None:
    assert_one_line_error(_compile(sequence, "--min-agreement", 99),
                          "--min-agreement needs a classifier output ([batch, classes] scores, "
                          "or one whose class axis --class-axis OUTPUT=AXIS names); this "
                          "model's outputs are 'y' [1, 6, 5]: name a class axis, read yes/no "
                          "scores with --threshold OUTPUT=T")


def test_max_drop_of_a_per_position_output_is_refused(sequence, tmp_path) -> None:
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.load(sequence / "eval.npz")["x"], labels=np.zeros(SAMPLES, np.int64))
    result = invoke("compile", sequence / "m.onnx", "--profile", sequence / "p.json", "--data",
                    data, "-o", tmp_path / "m.ember", "--max-drop", 1, "--class-axis", "-1")
    assert_one_line_error(result, "--max-drop compares accuracy with labels, and output 'y' "
                                  "is scored per position (--class-axis y=2)",
                          "else use --min-agreement")
    assert not (tmp_path / "m.ember").exists()


def test_a_class_axis_without_a_top1_budget_is_a_usage_error(sequence) -> None:
    for budget in (("--min-sqnr", 20), ()):
        result = _compile(sequence, *budget, "--class-axis", "-1")
        assert result.exit_code == 2
    assert "--class-axis says where top-1 is read: it is for --min-agreement and --max-drop" \
        in _compile(sequence, "--min-sqnr", 20, "--class-axis", "-1").output
