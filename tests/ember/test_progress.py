"""Progress of the long steps: compiling reports each stage as it advances (per layer, per
instruction), evaluating per sample; the bar is drawn on a terminal only."""

from __future__ import annotations

from compiler.backend.program import BackendOptions
from ember.accuracy import Evaluation, measure
from ember.flow import CompileOptions, compile_model
from quantizer.options import QuantOptions
from tests.cli import DIGITS, invoke


def _recorder():
    calls: list[tuple[str, int, int | None]] = []
    return calls, lambda what, done, total: calls.append((what, done, total))


def test_compiling_reports_each_stage_per_layer_and_instruction(digits_profile) -> None:
    calls, progress = _recorder()
    built = compile_model(DIGITS / "model.onnx", digits_profile,
                          CompileOptions(QuantOptions(), BackendOptions()), "edge", progress)
    stages = list(dict.fromkeys(what for what, _, _ in calls))
    assert stages == ["quantizing", "lowering", "tiling layers", "keeping activations on chip",
                      "generating code for layers", "planning DRAM", "scheduling instructions",
                      "summarizing"]
    layers = built.compiled.summary.layers
    assert [done for what, done, _ in calls if what == "tiling layers"] == list(range(layers))
    assert {total for what, _, total in calls if what == "tiling layers"} == {layers}
    # Every 1024 instructions, from the first: digits on edge schedules fewer than that.
    scheduled = [(done, total) for what, done, total in calls
                 if what == "scheduling instructions"]
    assert scheduled == [(0, scheduled[0][1])] and 0 < scheduled[0][1] < 1024


def test_evaluating_reports_samples_done_of_the_total(digits_profile) -> None:
    calls, progress = _recorder()
    measure(str(DIGITS / "model.onnx"), str(digits_profile),
            Evaluation(data=str(DIGITS / "eval.npz"), samples=20), QuantOptions(),
            progress=progress)
    evaluating = [(done, total) for what, done, total in calls if what == "evaluating samples"]
    assert evaluating[0] == (0, 20) and evaluating[-1] == (20, 20)


def test_the_bar_is_drawn_on_a_terminal_only(digits_profile, tmp_path, monkeypatch) -> None:
    args = ("compile", DIGITS / "model.onnx", "--profile", digits_profile, "-o",
            tmp_path / "d.ember")
    assert "scheduling" not in invoke(*args).stderr
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich then treats stderr as a terminal
    assert "scheduling instructions" in invoke(*args).stderr
