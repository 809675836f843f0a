"""Mixed precision under an accuracy budget (#16 part 5): `ember compile --data ... --min-sqnr
/ --max-drop` raises the fewest tensors, in the order the sensitivity analysis ranks them, until
the budget holds; on a model built with one bad tensor, that tensor goes int16 on the array and
the program stays bit-exact; a budget nothing meets is exit 3 with the best measured."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from ember import budget
from ember.flow import optimized_graph
from tests.cli import DIGITS, assert_one_line_error, invoke, profiled
from tests.onnx_builder import model


def one_bad_tensor():
    """x -> Conv -> mid -> Conv -> y, where one channel of mid is 60 times the others (so
    int8 leaves the others a few steps) and the second Conv reads it 60 times more weakly:
    the output depends on what int8 loses in mid."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, .3, (16, 3, 3, 3))
    w1[0] *= 60
    w2 = rng.normal(0, .1, (8, 16, 3, 3))
    w2[:, 0] /= 60
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["mid"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["mid", "w2", "b2"], ["y"], name="c2", pads=[1, 1, 1, 1])]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 8, 8, 8]},
                 {"w1": w1.astype(np.float32), "b1": rng.normal(0, .1, 16).astype(np.float32),
                  "w2": w2.astype(np.float32), "b2": rng.normal(0, .1, 8).astype(np.float32)})


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    rng = np.random.default_rng(1)
    calib, evaluation = ({"x": rng.standard_normal((count, 3, 8, 8)).astype(np.float32)}
                         for count in (16, 24))
    return profiled(tmp_path_factory.mktemp("budget"), one_bad_tensor(), calib, evaluation)


def _compile(folder, *options):
    return invoke("compile", folder / "m.onnx", "--profile", folder / "p.json", "--data",
                  folder / "eval.npz", "-o", folder / "m.ember", *options)


def test_the_bad_tensor_goes_int16_and_the_program_stays_bit_exact(bad) -> None:
    result = _compile(bad, "--min-sqnr", 18, "--json", "--equalize", "off")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.output)["budget"]
    assert spent["met"] and [r["tensor"] for r in spent["raised"]] == ["mid"]
    assert spent["equalization"] is None  # --equalize given: the budget does not try it
    assert spent["raised"][0]["how"] == "int16"
    before, after = spent["int8"], spent["chosen"]
    assert before["outputs"][0]["sqnr_db"] < 12 and after["outputs"][0]["sqnr_db"] >= 18
    assert after["cycles"] > before["cycles"]  # mid's reader streams two planes
    # mid's estimated cost (`ember.cost`): what the estimate adds to the all-int8 program's
    estimated = spent["estimated_cycles"]
    assert spent["raised"][0]["cost_cycles"] == estimated["chosen"] - estimated["int8"] > 0
    assert spent["pruned"] == 0
    checked = invoke("accuracy", bad / "m.onnx", bad / "m.ember", "--profile", bad / "p.json",
                     "--data", bad / "eval.npz", "--json")
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.output)
    assert report["bit_exact"] is True
    assert report["options"]["int16_tensors"] == ["mid"]
    assert report["outputs"][0]["sqnr_db"] == pytest.approx(after["outputs"][0]["sqnr_db"])
    table = _compile(bad, "--min-sqnr", 18, "--equalize", "off").output  # the gain's own sign
    gain = spent["raised"][0]["gain_db"]
    assert f"{gain:+.2f} dB expected" in table and "+-" not in table
    assert f"int16, {spent['raised'][0]['cost_cycles']:+,} cycles est." in table


def test_a_search_in_two_processes_chooses_what_one_does(bad) -> None:
    """--cluster local:2 runs each measurement's samples and the ranking's runs in shards:
    the same figures, the same choice."""
    one, two = (json.loads(_compile(bad, "--min-sqnr", 18, "--json", "--cluster", where).output)
                ["budget"] for where in ("local", "local:2"))
    assert two == one


def test_a_budget_already_met_raises_nothing(bad) -> None:
    result = _compile(bad, "--min-sqnr", 5, "--json")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.output)["budget"]
    assert spent["met"] and spent["raised"] == [] and spent["evaluations"] == 1
    assert spent["chosen"] == spent["int8"]


def test_a_budget_nothing_meets_is_exit_3_with_the_best_measured(bad) -> None:
    (bad / "m.ember").unlink(missing_ok=True)
    result = _compile(bad, "--min-sqnr", 60, "--equalize", "off")
    assert result.exit_code == 3, result.output
    assert "budget not met, no program written" in result.output
    # mid int16 and c2's weights int16 too (four passes: `quantizer.wide_weights`), then the
    # rest of the ranking, those that lose alone included: everything raised is the best
    assert "best measured is y 38" in result.output and \
        "(mid int16, w2 int16 weights, y int16, x int16, w1 int16 weights)" in result.output
    assert "--allow-host" in result.output
    assert not (bad / "m.ember").exists()


def test_int16_outputs_meet_a_budget_without_the_host(tmp_path) -> None:
    """The digits CNN at 44 dB: its logits int16 (the host reads both planes) and relu1 int16
    on the array, no host segment."""
    profile = tmp_path / "p.json"
    assert invoke("quantize-profile", DIGITS / "model.onnx", "--data", DIGITS / "calib.npz",
                  "-o", profile).exit_code == 0
    result = invoke("compile", DIGITS / "model.onnx", "--profile", profile, "--data",
                    DIGITS / "eval.npz", "--min-sqnr", 44, "--allow-host", "-o",
                    tmp_path / "m.ember", "--json")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.output)["budget"]
    hows = {r["tensor"]: r["how"] for r in spent["raised"]}
    assert hows.get("logits") == "int16" and spent["chosen"]["outputs"][0]["sqnr_db"] >= 44
    assert not json.loads(result.output)["host_segments"]


def test_host_fp32_is_the_last_resort(tmp_path) -> None:
    """The bad tensor read by a MaxPool and by a Max, which does not read int16 (a MaxPool
    does): with --allow-host its producer and readers run in fp32 on the host, with the
    program bit-exact. (The Max of mid and its 3x3 MaxPool is the MaxPool.)"""
    proto = one_bad_tensor()
    rng = np.random.default_rng(0)
    proto = model([helper.make_node("Conv", ["x", "w1", "b1"], ["mid"], name="c1",
                                    pads=[1, 1, 1, 1]),
                   helper.make_node("MaxPool", ["mid"], ["window"], name="pool",
                                    kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                   helper.make_node("Max", ["mid", "window"], ["pooled"], name="max"),
                   helper.make_node("Conv", ["pooled", "w2", "b2"], ["y"], name="c2",
                                    pads=[1, 1, 1, 1])],
                  {"x": [1, 3, 8, 8]}, {"y": [1, 8, 8, 8]},
                  {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer})
    onnx.save(proto, str(tmp_path / "m.onnx"))
    for name, count in (("calib", 16), ("eval", 24)):
        np.savez(tmp_path / f"{name}.npz",
                 x=rng.standard_normal((count, 3, 8, 8)).astype(np.float32))
    assert invoke("quantize-profile", tmp_path / "m.onnx", "--data", tmp_path / "calib.npz",
                  "-o", tmp_path / "p.json").exit_code == 0
    result = invoke("compile", tmp_path / "m.onnx", "--profile", tmp_path / "p.json", "--data",
                    tmp_path / "eval.npz", "--min-sqnr", 16, "--allow-host", "-o",
                    tmp_path / "m.ember", "--json")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.output)["budget"]
    raised = {r["tensor"]: r for r in spent["raised"]}
    assert raised["mid"]["how"] == "fp32" and set(raised["mid"]["nodes"]) >= {"c1", "pool"}
    assert spent["chosen"]["outputs"][0]["sqnr_db"] >= 16
    assert json.loads(result.output)["host_segments"]
    checked = invoke("accuracy", tmp_path / "m.onnx", tmp_path / "m.ember", "--profile",
                     tmp_path / "p.json", "--data", tmp_path / "eval.npz", "--json")
    assert json.loads(checked.output)["bit_exact"] is True


def test_keeping_a_tensor_in_fp32_keeps_its_layer_and_clamp_together() -> None:
    """A Conv kept in fp32 without the Relu after it would hand the Relu its unclamped range
    in int8; a clamp's output kept in fp32 brings the layer it was fused into."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="c1"),
             helper.make_node("Clip", ["c", "lo", "hi"], ["r"], name="r1"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="c2")]
    proto = model(nodes, {"x": [1, 2, 5, 5]}, {"y": [1, 2, 3, 3]},
                  {"w1": rng.normal(size=(3, 2, 1, 1)).astype(np.float32),
                   "w2": rng.normal(size=(2, 3, 3, 3)).astype(np.float32),
                   "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)})
    graph = optimized_graph(proto)
    assert budget._nodes_around(graph, "x") == {"c1", "r1"}
    assert budget._nodes_around(graph, "r") == {"c1", "r1", "c2"}


def test_budget_usage_errors(bad) -> None:
    base = ("compile", bad / "m.onnx", "--profile", bad / "p.json", "-o", bad / "x.ember")
    result = invoke(*base, "--min-sqnr", 30)
    assert result.exit_code == 2 and "give --data" in result.output
    result = invoke(*base, "--data", bad / "eval.npz")
    assert result.exit_code == 2 and "give --min-sqnr, --max-drop or --min-agreement" in \
        result.output
    assert_one_line_error(_compile(bad, "--max-drop", 0.5), "--max-drop needs labels",
                          "eval.npz")
    assert_one_line_error(_compile(bad, "--min-agreement", 99), "--min-agreement needs a "
                          "classifier output", "'y'")
    assert not (bad / "x.ember").exists()


def test_top1_agreement_with_fp32_is_a_budget_without_labels(tmp_path) -> None:
    """--min-agreement: each classifier output's top-1 agrees with fp32's on at least PERCENT
    of the samples, fp32's own answers the reference. The digits CNN in int8 agrees on at
    least 95% of its evaluation images: nothing raised, the agreement in the summary."""
    profile = tmp_path / "p.json"
    assert invoke("quantize-profile", DIGITS / "model.onnx", "--data", DIGITS / "calib.npz",
                  "-o", profile).exit_code == 0
    args = ("compile", DIGITS / "model.onnx", "--profile", profile, "--data",
            DIGITS / "eval.npz", "-o", tmp_path / "m.ember", "--json")
    spent = json.loads(invoke(*args, "--min-agreement", 95).output)["budget"]
    agreement = spent["int8"]["outputs"][0]["top1_agreement"]
    assert spent["met"] and spent["raised"] == [] and agreement >= 0.95
    assert spent["budget"] == {"min_sqnr": None, "max_drop": None, "min_agreement": 95.0}
    table = invoke(*args[:-1], "--min-agreement", 95).output
    assert "top-1 agreement with fp32" in table


def test_a_layer_whose_weights_are_the_error_gets_int16_weights(tmp_path) -> None:
    """A Conv whose per-channel int8 step is coarse for most of its taps (one tap of 1.0 on an
    all-but-silent channel beside taps of ~0.02): no activation raised helps much; its weights
    int16 on the array lift the output 19 -> 30 dB, the program bit-exact."""
    from tests.ember.test_sensitivity import one_bad_weight, samples
    profiled(tmp_path, one_bad_weight(),
             *({"x": np.concatenate([s["x"] for s in samples(count, seed)])}
               for count, seed in ((8, 0), (16, 1))))
    result = invoke("compile", tmp_path / "m.onnx", "--profile", tmp_path / "p.json", "--data",
                    tmp_path / "eval.npz", "--min-sqnr", 28, "-o", tmp_path / "m.ember",
                    "--json", "--equalize", "off")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.output)["budget"]
    assert [(r["tensor"], r["how"], r["nodes"]) for r in spent["raised"]] == \
        [("ww", "int16 weights", ["conv_w"])]
    assert spent["int8"]["outputs"][0]["sqnr_db"] < 20 <= 28 <= \
        spent["chosen"]["outputs"][0]["sqnr_db"]
    assert spent["chosen"]["cycles"] > spent["int8"]["cycles"]  # two passes of its tiles
    checked = invoke("accuracy", tmp_path / "m.onnx", tmp_path / "m.ember", "--profile",
                     tmp_path / "p.json", "--data", tmp_path / "eval.npz", "--json")
    report = json.loads(checked.output)
    assert report["bit_exact"] is True and report["options"]["int16_weights"] == ["conv_w"]
    table = invoke("compile", tmp_path / "m.onnx", "--profile", tmp_path / "p.json", "--data",
                   tmp_path / "eval.npz", "--min-sqnr", 28, "-o", tmp_path / "m.ember",
                   "--equalize", "off").output
    assert "int16 weights (conv_w)" in table


class _Gate:
    """A stand-in for the quantizer's int16 gate: `refused` tensors fail alone, a tensor in
    `needs` fails unless its partner is raised too; counts the quantizations."""

    def __init__(self, refused=(), needs=None):
        self.refused, self.needs, self.calls = set(refused), dict(needs or {}), 0

    def __call__(self, options):
        self.calls += 1
        raised = set(options.int16_tensors)
        for name in raised:
            if name in self.refused or (name in self.needs and self.needs[name] not in raised):
                raise budget.QuantizeError(f"int16 tensor {name!r}: refused")


def _ranked(count: int):
    return [(f"t{i}", float(count - i), None) for i in range(count)]


def _candidates(gate, count: int):
    return budget._Candidates(_ranked(count), budget.QuantOptions(), False, None, gate)


def test_candidates_are_checked_in_groups_and_only_failing_groups_split() -> None:
    """300 ranked tensors, two of which the accelerator refuses: far fewer quantizations than
    one per tensor, and the same tensors found (in ranking order) as one by one; where most
    fail, groups shrink to single items (no more checks than one per tensor)."""
    gate = _Gate(refused={"t5", "t200"})
    candidates = _candidates(gate, 300)
    assert candidates.available(512) == 298
    assert [r.tensor for r in candidates.found] == [f"t{i}" for i in range(300)
                                                     if i not in (5, 200)]
    assert [t for t, _ in candidates.passed_over] == ["t5", "t200"]
    assert "refused" in candidates.passed_over[0][1]
    assert gate.calls < 50, gate.calls
    gate = _Gate(refused={f"t{i}" for i in range(300) if i % 5 < 3})
    candidates = _candidates(gate, 300)
    assert candidates.available(512) == 120 and gate.calls <= 300, gate.calls


def test_a_prefix_inside_a_passed_group_is_verified_before_it_is_measured() -> None:
    """t3 is int16 only with t6 (ranked after it): the group t2..t9 passes as a whole, but the
    first four alone do not quantize; `verify` checks the group again item by item, t3 passed
    over, and the count still holds as many items."""
    gate = _Gate(needs={"t3": "t6"})
    candidates = _candidates(gate, 20)
    candidates._group_size = lambda: 64  # as after a run of passes
    assert candidates.available(10) == 10
    assert "t3" in [r.tensor for r in candidates.found]
    assert candidates.verify(4) == 4
    assert [r.tensor for r in candidates.found[:4]] == ["t0", "t1", "t2", "t4"]
    assert [t for t, _ in candidates.passed_over] == ["t3"]
    for count in range(len(candidates.found) + 1):  # every prefix now quantizes
        gate(candidates.options(count))


def test_the_ranking_reads_at_most_ranking_samples_and_no_alone_runs(bad, monkeypatch) -> None:
    """The ranking is an estimate each measured configuration checks: it reads at most
    RANKING_SAMPLES of the evaluation samples and only the gains; every configuration reads
    them all."""
    seen = []
    measure = budget.measure

    def recorded(model_path, profile_path, evaluation, *args, **kwargs):
        seen.append((evaluation.sensitivity, evaluation.samples, evaluation.alone))
        return measure(model_path, profile_path, evaluation, *args, **kwargs)

    monkeypatch.setattr(budget, "measure", recorded)
    monkeypatch.setattr(budget, "RANKING_SAMPLES", 5)
    choice = budget.choose(str(bad / "m.onnx"), str(bad / "p.json"),
                           budget.Evaluation(str(bad / "eval.npz")), budget.QuantOptions(),
                           budget.Budget(min_sqnr=18), allow_host=False)
    assert choice.met
    assert (True, 5, False) in seen
    assert all(samples is None for sensitivity, samples, _ in seen if not sensitivity)


def test_a_long_list_of_raised_tensors_is_summarized(capsys) -> None:
    """Hundreds raised (a detector's budget): the summary names the first SHOWN_RAISED in the
    ranking's order and counts the rest by kind; its title counts tensors and layers' weights
    apart."""
    from ember.commands.compile import SHOWN_RAISED, _print_budget
    report = {"outputs": [{"name": "y", "sqnr_db": 7.0, "top1_agreement": None,
                           "top1_accuracy_fp32": None}],
              "cycles": 100, "dram_bytes_moved": 10, "dram_image_bytes": 5}
    raised = [{"tensor": f"t{i}", "how": "int16", "gain_db": -0.01, "nodes": []}
              for i in range(30)] + \
        [{"tensor": f"w{i}", "how": "int16 weights", "gain_db": 0.02, "nodes": [f"conv{i}"]}
         for i in range(5)]
    _print_budget({"int8": report, "chosen": {**report, "cycles": 250}, "raised": raised,
                   "evaluations": 16, "samples": 8})
    out = capsys.readouterr().out
    assert "30 tensors int16 and 5 layers' weights int16 raised" in out
    assert "raised t0 " in out and f"raised t{SHOWN_RAISED - 1} " in out
    assert f"raised t{SHOWN_RAISED} " not in out and "raised w0" not in out
    assert f"... and {35 - SHOWN_RAISED} more" in out
    assert f"{30 - SHOWN_RAISED} tensors int16 and 5 layers' weights int16 (--json lists" in out
    assert "-0.01 dB expected" in out and "+-" not in out


def test_a_spectrum_part_the_quantizer_made_int16_is_raised_as_one_group(tmp_path) -> None:
    """A spectrum's parts, int16 by the quantizer's own rule (`--wide-norm-inputs always`
    here), are ranked like any tensor (naming an int16 tensor can still gain: a named one
    stays int16 beside a node the host keeps). Named, a part takes the other with it (a
    Hypot's operands are one group), so it is raised as int16. Before, the gate refused a
    named part (a Hypot read it) and --allow-host kept the magnitude in fp32 on the host,
    which then read the parts as int8: silero-vad lost 8 dB that way."""
    from tests.e2e.test_signal_forms import stft_encoder
    proto = stft_encoder()
    onnx.save(proto, str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(0)
    for name, count in (("calib", 8), ("eval", 4)):
        np.savez(tmp_path / f"{name}.npz", x=rng.standard_normal((count, 2, 64)).astype(
            np.float32).reshape(count * 2, 64))
    assert invoke("quantize-profile", tmp_path / "m.onnx", "--data", tmp_path / "calib.npz",
                  "--input-shape", "x=2,64", "-o", tmp_path / "p.json").exit_code == 0
    graph = optimized_graph(proto)
    hypot = next(n for n in graph.nodes if n.op == "Hypot")
    try:
        choice = budget.choose(str(tmp_path / "m.onnx"), str(tmp_path / "p.json"),
                               budget.Evaluation(str(tmp_path / "eval.npz")),
                               budget.QuantOptions(wide_norm_inputs="always"),
                               budget.Budget(min_sqnr=90), allow_host=True,
                               input_shapes={"x": (2, 64)})
    except budget.BudgetMissed as missed:
        choice = missed.best
    hows = {r.tensor: r.how for r in choice.raised}
    assert {hows.get(part) for part in hypot.inputs[:2]} == {"int16"}
    assert not any(hypot.name in r.nodes for r in choice.raised)
    assert not {tensor for tensor, _ in choice.passed_over} & set(hypot.inputs[:2])


def test_the_budget_equalizes_the_model_itself_when_that_meets_it(bad) -> None:
    """--equalize left out, int8 misses: the budget profiles the model equalized (--equalize
    all) on the profile's own calibration data, exactly as `ember quantize-profile --equalize
    all` would, and the equalized int8 model meets 18 dB with nothing raised (mid's wide
    channel is evened out). The profile is written beside the program, and the program runs
    bit-exactly with it."""
    result = _compile(bad, "--min-sqnr", 18, "--json")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.stdout)["budget"]
    assert spent["met"] and spent["raised"] == [] and spent["evaluations"] == 2
    equalization = spent["equalization"]
    written = bad / "m.equalized.profile.json"
    assert equalization["chosen"] and equalization["profile"] == str(written)
    assert "--equalize all (1 chain) at int8" in equalization["note"]
    assert spent["chosen"]["outputs"][0]["sqnr_db"] >= 18 > spent["int8"]["outputs"][0]["sqnr_db"]
    made = invoke("quantize-profile", bad / "m.onnx", "--data", bad / "calib.npz",
                  "--equalize", "all", "-o", bad / "by_hand.json")
    assert made.exit_code == 0, made.output
    assert written.read_bytes() == (bad / "by_hand.json").read_bytes()
    checked = invoke("accuracy", bad / "m.onnx", bad / "m.ember", "--profile", written,
                     "--data", bad / "eval.npz", "--json")
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.stdout)
    assert report["bit_exact"] is True and report["options"]["equalize"] == "all"
    table = _compile(bad, "--min-sqnr", 18).output
    assert "cross-layer equalization" in table and "m.equalized.profile.json" in table
    assert_one_line_error(invoke("accuracy", bad / "m.onnx", bad / "m.ember", "--profile",
                                 bad / "p.json", "--data", bad / "eval.npz"),
                          "the program was compiled with another profile",
                          "its name ends .equalized.profile.json")


@pytest.mark.parametrize("change, why", [
    ("gone", "is not there (nor beside the profile)"),
    ("other", "is not the data the profile was made from (its digest differs)"),
])
def test_equalization_is_tried_only_on_the_profiles_own_data(tmp_path, change, why) -> None:
    """The calibration data moved or changed since profiling: equalization is not tried (a
    profile of other samples would not be the one the user made), the search goes on without
    it and says why."""
    rng = np.random.default_rng(1)
    calib, evaluation = ({"x": rng.standard_normal((count, 3, 8, 8)).astype(np.float32)}
                         for count in (16, 24))
    profiled(tmp_path, one_bad_tensor(), calib, evaluation)
    if change == "gone":
        (tmp_path / "calib.npz").unlink()
    else:
        np.savez(tmp_path / "calib.npz", x=calib["x"][::-1].copy())
    result = _compile(tmp_path, "--min-sqnr", 18, "--json")
    assert result.exit_code == 0, result.output
    spent = json.loads(result.stdout)["budget"]
    assert [r["tensor"] for r in spent["raised"]] == ["mid"]
    assert not spent["equalization"]["chosen"] and why in spent["equalization"]["note"]
    assert not (tmp_path / "m.equalized.profile.json").exists()


def test_a_missed_budget_says_what_equalization_reached(bad) -> None:
    """Exit 3: the message gives the equalized model's int8 figures beside the best raised."""
    result = _compile(bad, "--min-sqnr", 60)
    assert result.exit_code == 3, result.output
    assert "--equalize all (1 chain) at int8: y 34" in result.output
    assert "misses the budget; plain: y 8.89 dB" in result.output


def test_a_compile_that_fails_after_equalizing_leaves_no_profile(bad, monkeypatch) -> None:
    """The equalized profile is staged and named only once the program is written: a failure
    after the search (here the QDQ export) leaves neither file, nor the staged one."""
    from ember.commands import compile as command
    from ember.errors import EmberError

    def refuse(*args):
        raise EmberError("q.onnx: cannot write")

    for name in ("m.ember", "m.equalized.profile.json"):
        (bad / name).unlink(missing_ok=True)
    monkeypatch.setattr(command, "export_qdq", refuse)
    result = _compile(bad, "--min-sqnr", 18, "--emit-onnx", bad / "q.onnx")
    assert result.exit_code == 2 and "q.onnx: cannot write" in result.output
    assert sorted(p.name for p in bad.iterdir() if "equalized" in p.name or
                  p.name == "m.ember") == []
