"""A task metric of the user's own (`--metric FILE.py:FUNCTION`, `ember.task_metric`): what a
model that is not a classifier is judged by, reported by `ember accuracy` beside fp32's and
held by `ember compile --max-drop`."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest

from ember.task_metric import MetricSpec, MetricSums
from tests.cli import DIGITS, assert_one_line_error, invoke, profiled
from tests.ember.test_budget import one_bad_tensor

METRICS = '''
from dataclasses import dataclass

import numpy as np


@dataclass
class Counts:  # a dataclass: the file is imported as a module, registered as imports are
    correct: int
    count: int


def accuracy(outputs, labels):
    """Top-1 accuracy written as a task metric: (correct, count)."""
    counts = Counts(int((outputs["logits"].argmax(-1) == labels).sum()), len(labels))
    return counts.correct, counts.count

def mask_iou(outputs, labels):
    """A map thresholded at 0.2 against the labelled mask: (intersection, union)."""
    found = outputs["y"] > 0.2
    return float((found & labels).sum()), float((found | labels).sum())

def mask_mismatch(outputs, labels):
    """The share of the union where the masks differ: a metric whose best is the worst mask,
    so that it and the SQNR pick different calibrations."""
    found = outputs["y"] > 0.2
    return float((found ^ labels).sum()), float((found | labels).sum())

def fails(outputs, labels):
    raise ValueError("no boxes here")

def one_number(outputs, labels):
    return 1.0

def negative_weight(outputs, labels):
    return 1.0, -1.0
'''


@pytest.fixture(scope="module")
def metrics(tmp_path_factory):
    path = tmp_path_factory.mktemp("metrics") / "metrics.py"
    path.write_text(METRICS)
    return path


@pytest.fixture(scope="module")
def digits_profile(tmp_path_factory):
    profile = tmp_path_factory.mktemp("digits") / "p.json"
    assert invoke("quantize-profile", DIGITS / "model.onnx", "--data", DIGITS / "calib.npz",
                  "-o", profile).exit_code == 0
    return profile


@pytest.fixture(scope="module")
def masks(tmp_path_factory):
    """The model with one bad tensor (test_budget's), its evaluation samples labelled with
    fp32's own mask of y > 0.2: fp32's IoU is 1, int8's what int8 loses of the mask."""
    rng = np.random.default_rng(1)
    calib, evaluation = ({"x": rng.standard_normal((count, 3, 8, 8)).astype(np.float32)}
                         for count in (16, 24))
    folder = profiled(tmp_path_factory.mktemp("masks"), one_bad_tensor(), calib, evaluation)
    session = onnxruntime.InferenceSession(str(folder / "m.onnx"))
    y = np.concatenate([session.run(None, {"x": x[None]})[0] for x in evaluation["x"]])
    np.savez(folder / "eval.npz", x=evaluation["x"], labels=y > 0.2)
    return folder


def _accuracy(metrics, profile, *options):
    return invoke("accuracy", DIGITS / "model.onnx", "--profile", profile, "--data",
                  DIGITS / "eval.npz", *options)


def test_a_metric_written_as_top1_gives_top1_in_one_process_or_two(metrics,
                                                                   digits_profile) -> None:
    """(correct, count) summed over runs is top-1 accuracy: the metric equals the built-in
    counter's figure, and --cluster local:2 gives the same sums exactly. With --metric the
    labels are the metric's, so the output's own accuracy is not computed from them."""
    plain = json.loads(_accuracy(metrics, digits_profile, "--json").output)
    first = plain["outputs"][0]
    for where in ("local", "local:2"):
        result = _accuracy(metrics, digits_profile, "--metric", f"{metrics}:accuracy",
                           "--json", "--cluster", where)
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["task_metric"] == {
            "name": "accuracy", "source": f"{metrics}:accuracy",
            "fp32": first["top1_accuracy_fp32"], "int8": first["top1_accuracy_int8"]}
        assert report["outputs"][0]["top1_accuracy_fp32"] is None
        assert report["options"]["metric"] == f"{metrics}:accuracy"
    assert plain["task_metric"] is None


def test_the_metric_in_the_table_the_html_and_the_gate(metrics, digits_profile,
                                                      tmp_path) -> None:
    html = tmp_path / "a.html"
    result = _accuracy(metrics, digits_profile, "--metric", f"{metrics}:accuracy", "--html",
                       html)
    assert result.exit_code == 0, result.output
    line = f"task metric accuracy ({metrics}:accuracy) on the labels: fp32 99.33%, int8 "
    assert line in result.output
    assert "Task metric accuracy" in html.read_text()
    # --max-top1-drop gates the metric's drop: the digits CNN's int8 is level with fp32
    assert _accuracy(metrics, digits_profile, "--metric", f"{metrics}:accuracy",
                     "--max-top1-drop", 0).exit_code == 0
    compared = _accuracy(metrics, digits_profile, "--metric", f"{metrics}:accuracy",
                         "--compare-calibrations")
    assert compared.exit_code == 0 and "accuracy (fp32 99.33%)" in compared.output


def test_a_budget_holds_a_task_metric(metrics, masks) -> None:
    """int8 loses a quarter of the mask (the bad tensor's error); --max-drop 5 on the mask's
    IoU raises the bad tensor first, and the program compiled for the choice is bit-exact
    with the metric as the budget measured it."""
    args = ("compile", masks / "m.onnx", "--profile", masks / "p.json", "--data",
            masks / "eval.npz", "-o", masks / "m.ember", "--metric", f"{metrics}:mask_iou",
            "--equalize", "off")  # the int16 search, not the equalization the budget tries
    result = invoke(*args, "--max-drop", 5, "--json")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.stdout)["budget"]
    before, after = spent["int8"]["task_metric"], spent["chosen"]["task_metric"]
    assert before["fp32"] == after["fp32"] == 1.0
    assert before["int8"] < 0.8 and after["int8"] >= 0.95
    assert spent["met"] and spent["raised"][0]["tensor"] == "mid"
    assert "task metric mask_iou (fp32 100.00%)" in invoke(*args, "--max-drop", 5).output
    checked = invoke("accuracy", masks / "m.onnx", masks / "m.ember", "--profile",
                     masks / "p.json", "--data", masks / "eval.npz", "--metric",
                     f"{metrics}:mask_iou", "--json")
    report = json.loads(checked.stdout)
    assert report["bit_exact"] is True and report["task_metric"]["int8"] == after["int8"]
    # the metric scores this map: no hint to read it as a classifier
    assert not any("not a classifier" in note for note in report["notes"])
    missed = invoke(*args, "--max-drop", 0.01)
    assert missed.exit_code == 3
    assert "task metric mask_iou 23.28 points below fp32 > 0.01 at int8; the best measured " \
        "is task metric mask_iou" in missed.output


def test_compare_calibrations_marks_the_best_by_the_metric(metrics, masks) -> None:
    """With --metric the task metric picks the best calibration, not the output's SQNR."""
    result = invoke("accuracy", masks / "m.onnx", "--profile", masks / "p.json", "--data",
                    masks / "eval.npz", "--metric", f"{metrics}:mask_mismatch",
                    "--compare-calibrations", "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    reports = found["calibrations"]
    by_metric = max(reports, key=lambda m: reports[m]["task_metric"]["int8"])
    by_sqnr = max(reports, key=lambda m: reports[m]["sqnr_db"])
    assert found["best"] == by_metric != by_sqnr


def test_metric_errors_are_one_line(metrics, digits_profile, masks) -> None:
    for spec, words in ((f"{metrics.parent}/none.py:accuracy", ("no file", "none.py")),
                        (f"{metrics}:absent", ("has no function 'absent'",)),
                        ("accuracy", ("expected FILE.py:FUNCTION",)),
                        (f"{metrics}:fails", ("failed on fp32's outputs of sample 0",
                                              "ValueError: no boxes here")),
                        (f"{metrics}:one_number", ("returned 1.0 for sample 0",
                                                   "a pair (score, weight)")),
                        (f"{metrics}:negative_weight", ("a finite weight >= 0",))):
        assert_one_line_error(_accuracy(metrics, digits_profile, "--metric", spec), *words)
    assert_one_line_error(invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile,
                                 "--data", DIGITS / "calib.npz", "--metric",
                                 f"{metrics}:accuracy"),
                          "scores the outputs against labels", "calib.npz")
    assert_one_line_error(_accuracy(metrics, digits_profile, "--metric", f"{metrics}:accuracy",
                                    "--class-axis", -1, "--ctc-blank", 0), "give one of them")
    usage = invoke("compile", masks / "m.onnx", "--profile", masks / "p.json", "--data",
                   masks / "eval.npz", "--min-sqnr", 10, "--metric", f"{metrics}:mask_iou",
                   "-o", masks / "x.ember")
    assert usage.exit_code == 2 and "give --max-drop" in usage.output
    assert not (masks / "x.ember").exists()


def test_sums_are_exact_in_any_grouping() -> None:
    """Shards add their pairs in whatever grouping --cluster makes: fsum gives one value."""
    spec = MetricSpec("m.py", "f")
    values = [(0.1, 0.3), (1e16, 1.0), (-1e16, 0.7), (0.2, 1.0)]
    one, halves = MetricSums(), [MetricSums(), MetricSums()]
    for index, pair in enumerate(values):
        one.add(lambda outputs, labels, pair=pair: pair, spec, {}, np.zeros(1), index, "fp32")
        halves[index // 2].add(lambda outputs, labels, pair=pair: pair, spec, {}, np.zeros(1),
                               index, "fp32")
    halves[0].merge(halves[1])
    assert one.value == halves[0].value == pytest.approx(0.3 / 3.0)
