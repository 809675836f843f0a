"""The accuracy budget by cost: each raised item's cycles estimated from the quantized graph
(`ember.cost`, checked against compiled programs), and the pruning that drops the costliest
items per dB of gain that the budget does not need (`budget._prune`)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from onnx import helper

from compiler.backend.program import BackendOptions
from ember import budget
from ember.cost import CycleModel, Wide, marginal
from ember.flow import CompileOptions, Quantizer, compile_model
from quantizer.options import QuantOptions
from simulator import machine
from simulator.arch import Arch
from tests.cli import profiled
from tests.onnx_builder import model


def two_convs():
    """x -> c1 (8 -> 16 channels) -> mid -> c2 (16 -> 64, 3x3: the costly layer) -> y."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(0, .3, (16, 8, 1, 1)), rng.normal(0, .1, (64, 16, 3, 3))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["mid"], name="c1"),
             helper.make_node("Conv", ["mid", "w2", "b2"], ["y"], name="c2",
                              pads=[1, 1, 1, 1])]
    return model(nodes, {"x": [1, 8, 16, 16]}, {"y": [1, 64, 16, 16]},
                 {"w1": w1.astype(np.float32), "b1": np.zeros(16, np.float32),
                  "w2": w2.astype(np.float32), "b2": np.zeros(64, np.float32)})


@pytest.fixture(scope="module")
def convs(tmp_path_factory):
    rng = np.random.default_rng(1)
    calib, evaluation = ({"x": rng.standard_normal((count, 8, 16, 16)).astype(np.float32)}
                         for count in (8, 4))
    folder = profiled(tmp_path_factory.mktemp("cost"), two_convs(), calib, evaluation)
    quantizer = Quantizer(str(folder / "m.onnx"), str(folder / "p.json"))
    return folder, quantizer, CycleModel(quantizer(QuantOptions()).qgraph, Arch.load("default"))


def _compiled_cycles(folder, options: QuantOptions) -> int:
    built = compile_model(str(folder / "m.onnx"), str(folder / "p.json"),
                          CompileOptions(options, BackendOptions()))
    return machine.timing(built.compiled.program).cycles


def test_the_estimate_follows_the_compiled_programs_cycles(convs) -> None:
    """int8, c2's int16 input, c2's int16 weights and both: the estimate within a third of
    the compiled program's cycles, and each raise costing what the program says to within a
    third (both: c2's four array passes)."""
    folder, _, cycles = convs
    configs = {"int8": (QuantOptions(), Wide()),
               "mid": (QuantOptions(int16_tensors=("mid",)), cycles.item("mid", "int16")),
               "w2": (QuantOptions(int16_weights=("c2",)),
                      cycles.item("w2", "int16 weights", ("c2",))),
               "both": (QuantOptions(int16_tensors=("mid",), int16_weights=("c2",)),
                        cycles.item("mid", "int16") | cycles.item("w2", "int16 weights",
                                                                  ("c2",)))}
    real = {k: _compiled_cycles(folder, options) for k, (options, _) in configs.items()}
    estimated = {k: cycles.cycles(wide) for k, (_, wide) in configs.items()}
    for k in configs:
        assert estimated[k] == pytest.approx(real[k], rel=1 / 3), (k, estimated, real)
        if k != "int8":
            assert estimated[k] - estimated["int8"] == \
                pytest.approx(real[k] - real["int8"], rel=1 / 3), (k, estimated, real)
    assert estimated["both"] - estimated["int8"] > \
        estimated["mid"] + estimated["w2"] - 2 * estimated["int8"]


def test_an_items_cost_is_what_dropping_it_saves(convs) -> None:
    """Raised together, c2's int16 input and weights cost more than apart (four passes
    against two): each one's cost among the others is what dropping it alone saves."""
    _, _, cycles = convs
    items = {"mid": cycles.item("mid", "int16"),
             "w2": cycles.item("w2", "int16 weights", ("c2",))}
    costs = marginal(cycles, items)
    both = cycles.cycles(items["mid"] | items["w2"])
    assert costs["mid"] == both - cycles.cycles(items["w2"]) > 0
    assert costs["w2"] == both - cycles.cycles(items["mid"]) > 0
    assert costs["mid"] > cycles.cycles(items["mid"]) - cycles.cycles()


def _report(sqnr_db: float):
    return SimpleNamespace(outputs=[SimpleNamespace(name="y", sqnr_db=sqnr_db)], task=None)


def test_pruning_drops_the_costly_item_the_budget_does_not_need(convs) -> None:
    """The search met 20 dB with mid int16 (all the budget needs) and c2's int16 weights
    (expected to gain a third as much at about the same cost): the pruning measures dropping
    the costliest per dB first and keeps mid alone, within PRUNE_EVALUATIONS; were the
    weights needed too, it would keep both."""
    _, quantizer, cycles = convs
    raised = (budget.Raised("mid", "int16", 3.0),
              budget.Raised("w2", "int16 weights", 1.0, ("c2",)))
    measured = []

    def run(opts, needs):
        measured.append(opts)
        return _report(25.0 if needs <= {*opts.int16_tensors, *opts.int16_weights} else 15.0)

    kept, report, evaluations = budget._prune(
        raised, _report(26.0), cycles, budget.Budget(min_sqnr=20),
        lambda opts: run(opts, {"mid"}), quantizer, QuantOptions(), lambda *a: None)
    assert [r.tensor for r in kept] == ["mid"] and report.outputs[0].sqnr_db == 25.0
    assert 1 <= evaluations == len(measured) <= budget.PRUNE_EVALUATIONS
    order = budget.drop_order(budget._priced(raised, cycles))
    assert order == [1, 0]  # the weights: the most cycles per dB
    kept, report, _ = budget._prune(
        raised, _report(26.0), cycles, budget.Budget(min_sqnr=20),
        lambda opts: run(opts, {"mid", "c2"}), quantizer, QuantOptions(), lambda *a: None)
    assert kept == raised and report.outputs[0].sqnr_db == 26.0


def test_pruning_stops_at_its_bound() -> None:
    """300 raised, any one dropped harmless but any two together a miss: the pruning
    measures at most PRUNE_EVALUATIONS configurations and keeps the one it found meeting."""
    raised = tuple(budget.Raised(f"t{i}", "int16", 0.1, (), None) for i in range(300))
    calls = []

    class Priced:
        def item(self, tensor, how, nodes=()):
            return Wide(values=frozenset({tensor}))

        def cycles(self, wide=Wide()):
            return 100 * len(wide.values)

    def run(opts):
        calls.append(opts)
        return _report(25.0 if len(opts.int16_tensors) >= 299 else 15.0)

    kept, report, evaluations = budget._prune(
        raised, _report(26.0), Priced(), budget.Budget(min_sqnr=20), run,
        lambda opts: None, QuantOptions(), lambda *a: None)
    assert evaluations == len(calls) == budget.PRUNE_EVALUATIONS
    assert len(kept) == 299 and report.outputs[0].sqnr_db == 25.0


def test_the_costliest_per_db_go_first_a_gain_near_zero_counted_as_the_floor() -> None:
    """Cycles per dB of gain, a gain under LOSS_FLOOR_DB (or a loss) counted as the floor:
    a cheap item that loses alone is not free to drop, and an item that costs nothing is never
    tried."""
    priced = [budget.Raised("a", "int16", 2.0, (), 1000), budget.Raised("b", "int16", -0.1, (), 10),
              budget.Raised("c", "int16", 0.5, (), 1000), budget.Raised("d", "int16", 1.0, (), 0),
              budget.Raised("e", "int16", 0.001, (), 100)]
    assert budget.drop_order(priced) == [4, 2, 1, 0]


def test_a_concats_inputs_and_output_are_raised_together(tmp_path) -> None:
    """Raising one input of a Concat raises the whole group it joins (`wide_group`): its
    other input and its output too; so once the output is raised, raising an input as well
    costs nothing more (the pruning never spends a measurement dropping it)."""
    rng = np.random.default_rng(2)
    w = {f"w{i}": rng.normal(0, .3, (16, 8 if i < 2 else 32, 1, 1)).astype(np.float32)
         for i in range(3)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="c0"),
             helper.make_node("Conv", ["x", "w1"], ["b"], name="c1"),
             helper.make_node("Concat", ["a", "b"], ["cat"], name="cat", axis=1),
             helper.make_node("Conv", ["cat", "w2"], ["y"], name="c2")]
    proto = model(nodes, {"x": [1, 8, 8, 8]}, {"y": [1, 16, 8, 8]}, w)
    data = {"x": rng.standard_normal((4, 8, 8, 8)).astype(np.float32)}
    folder = profiled(tmp_path, proto, data, data)
    quantized = Quantizer(str(folder / "m.onnx"), str(folder / "p.json"))(QuantOptions())
    cycles = CycleModel(quantized.qgraph, Arch.load("default"), quantized.graph)
    a, cat = cycles.item("a", "int16"), cycles.item("cat", "int16")
    assert {"a", "b"} <= a.values and a.values == cat.values
    assert marginal(cycles, {"a": a, "cat": cat}) == {"a": 0, "cat": 0}
    assert cycles.cycles(a) > cycles.cycles()


def test_a_product_of_two_int16_activations_is_priced_on_the_array() -> None:
    """A MatMul of two activations runs on the array: raising one operand to int16 doubles its
    passes, both quadruple them (`numerics.activation_passes`), and the estimate follows."""
    from ember.flow import optimized_graph, quantize_model
    from tests.e2e.flow import model_samples
    from tests.e2e.test_attention import product
    from tests.quantizer.util import profile_of
    proto = product((1, 64, 64), (1, 64, 64), False)
    graph = optimized_graph(proto)
    quantized = quantize_model(proto, profile_of(proto, model_samples(proto, 4), graph))
    model = CycleModel(quantized.qgraph, Arch.load("default"), quantized.graph)
    node = next(n for n in quantized.qgraph.nodes if n.name == "product")
    array = model._array[node.name]
    int8 = model.node_cycles(node, Wide())
    one = model.node_cycles(node, model.item("ap", "int16"))
    both = model.node_cycles(node, model.item("ap", "int16") | model.item("bp", "int16"))
    assert (int8, one, both) == (array, 2 * array, 4 * array)
