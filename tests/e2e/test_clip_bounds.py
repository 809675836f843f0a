"""Clip whose bounds are computed from constants (Constant nodes, Cast, Squeeze: constant folding
resolves them) is a lookup table on the accelerator, bit-exactly; a bound computed at run time
(a scalar the model derives from an activation) splits into Max and Min (`split_clip`), the
vector unit's ADD with op max or min, bit-exactly too. Max and Min of two activations, one of
them broadcast or not, likewise."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from compiler.graph.evaluate import evaluate
from compiler.graph.ops import CLIP, MAX, MIN
from ember import ort
from ember.flow import optimized_graph
from simulator import isa
from simulator.units.vector import ADD_OPS
from tests.e2e.flow import compile_and_check, samples
from tests.e2e.test_products import product
from tests.onnx_builder import model, weights

SHAPE = [1, 3, 6, 6]
PRESETS = ["edge", "default"]


def clip_model(run_time_max: bool = False, run_time_min: bool = False,
               seed: int = 0) -> onnx.ModelProto:
    """x → Conv → Clip(lo, hi): lo an int64 Constant cast to float, hi a [1] Constant squeezed;
    or, `run_time_max`, hi the mean of the Conv's output (a 0-d scalar), and `run_time_min`,
    lo that mean less 0.3."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Constant", [], ["lo64"], name="lo_const",
                              value=helper.make_tensor("v", TensorProto.INT64, [], [0])),
             helper.make_node("Cast", ["lo64"], ["lo"], name="lo_cast", to=TensorProto.FLOAT),
             helper.make_node("Constant", [], ["hi1"], name="hi_const",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
             helper.make_node("Squeeze", ["hi1"], ["hi"], name="hi_squeeze")]
    if run_time_max or run_time_min:
        nodes += [helper.make_node("ReduceMean", ["c"], ["peak"], name="peak", keepdims=0)]
    if run_time_min:
        nodes += [helper.make_node("Sub", ["peak", "hi"], ["floor"], name="floor")]
    nodes += [helper.make_node("Clip", ["c", "floor" if run_time_min else "lo",
                                        "peak" if run_time_max else "hi"], ["y"], name="clip")]
    return model(nodes, {"x": SHAPE}, {"y": [1, 8, 6, 6]}, {"w": weights(rng, 8, 3, 3, 3)})


BOUNDS = {"constant": (False, False), "run-time max": (True, False),
          "run-time min": (False, True), "both run-time": (True, True)}

@pytest.mark.parametrize("bounds", BOUNDS)
def test_clip_with_computed_bounds_equals_onnxruntime_in_fp32(bounds: str) -> None:
    proto = clip_model(*BOUNDS[bounds])
    session = ort.session(proto)
    for feed in samples({"x": SHAPE}, 3):
        np.testing.assert_allclose(evaluate(optimized_graph(proto), feed)["y"],
                                   ort.run(session, feed)["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("preset", PRESETS)
def test_clip_with_bounds_constant_folding_computes_runs_on_the_accelerator(preset) -> None:
    compiled, _ = compile_and_check(clip_model(), preset)
    assert compiled.program.host_segments == ()


def test_a_run_time_bound_splits_the_clip_into_max_and_min() -> None:
    """A constant bound stays a Clip (a table); the run-time one is a Max or a Min, the last
    node keeping the Clip's name and output (the profile's)."""
    ops = {name: [(n.op, n.name, n.outputs) for n in optimized_graph(clip_model(*flags)).nodes
                  if n.op in (CLIP.name, MAX.name, MIN.name)] for name, flags in BOUNDS.items()}
    assert ops["constant"] == [(CLIP.name, "clip", ("y",))]
    assert ops["run-time max"] == [(CLIP.name, "clip/clip", ("clip/clip",)),
                                   (MIN.name, "clip", ("y",))]
    assert ops["run-time min"] == [(MAX.name, "clip/max", ("clip/max",)),
                                   (CLIP.name, "clip", ("y",))]
    assert ops["both run-time"] == [(MAX.name, "clip/max", ("clip/max",)),
                                    (MIN.name, "clip", ("y",))]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("bounds", ["run-time max", "run-time min", "both run-time"])
def test_a_run_time_clip_bound_runs_on_the_accelerator_bit_exactly(bounds: str,
                                                                  preset: str) -> None:
    compiled, _ = compile_and_check(clip_model(*BOUNDS[bounds]), preset, count=2)
    assert compiled.program.host_segments == ()
    extrema = {ADD_OPS[insn.args["op"]] for insn in compiled.program.instructions
               if insn.op is isa.ADD}
    assert extrema == {"run-time max": {"min"}, "run-time min": {"max"},
                       "both run-time": {"max", "min"}}[bounds]

C = 10  # two channel blocks on the edge preset (8 lanes), a partial one on default (16)
EXTREMA = {
    "same shape": ((1, C, 4, 5), (1, C, 4, 5), False),
    "per channel, first": ((2, C, 3, 3), (2, C, 1, 1), True),
    "per image": ((2, C, 3, 4), (2, 1, 1, 1), False),
    "per pixel": ((1, C, 3, 4), (1, 1, 3, 4), True),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("op", [MAX.name, MIN.name])
@pytest.mark.parametrize("form", EXTREMA)
def test_max_and_min_of_two_activations_bit_exact(form: str, op: str, preset: str) -> None:
    a_shape, b_shape, swap = EXTREMA[form]
    compiled, _ = compile_and_check(product(a_shape, b_shape, op, swap=swap), preset, count=2)
    assert compiled.program.host_segments == ()


@pytest.mark.parametrize("op", [MAX.name, MIN.name])
def test_max_and_min_equal_onnxruntime_in_fp32(op: str) -> None:
    proto = product((2, C, 3, 4), (2, 1, 1, 1), op)
    session = ort.session(proto)
    for feed in samples({"a": [2, 3, 3, 4], "b": [2, 3, 1, 1]}, 2):
        np.testing.assert_allclose(evaluate(optimized_graph(proto), feed)["y"],
                                   ort.run(session, feed)["y"], rtol=1e-6, atol=1e-6)


def test_max_of_three_inputs_is_a_chain_of_two_on_the_accelerator() -> None:
    """ONNX's Max is variadic; the importer expands three inputs into two two-input Maxes (the
    last keeps the node's name and output), equal to onnxruntime, bit-exact."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node(MAX.name, ["c", "r", "x8"], ["y"], name="top")]
    inits = {"w": weights(rng, 8, 3, 3, 3),
             "x8": rng.standard_normal([1, 8, 6, 6]).astype(np.float32)}
    proto = model(nodes, {"x": SHAPE}, {"y": [1, 8, 6, 6]}, inits)
    graph = optimized_graph(proto)
    maxes = [n for n in graph.nodes if n.op == MAX.name]
    assert len(maxes) == 2 and maxes[-1].name == "top" and maxes[-1].outputs == ("y",)
    feed = samples({"x": SHAPE}, 1)[0]
    np.testing.assert_allclose(evaluate(graph, feed)["y"],
                               ort.run(ort.session(proto), feed)["y"], rtol=1e-5, atol=1e-6)
    compiled, _ = compile_and_check(proto, "default")
    assert compiled.program.host_segments == ()


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("shape", [[8, 1, 1], [1, 6, 6], [8, 6, 6]],
                         ids=["per channel", "per pixel", "full"])
def test_max_and_min_by_a_constant_tensor_bit_exact(shape: list[int], preset: str) -> None:
    """A constant operand of any broadcastable shape, read over a View as Add's."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node(MAX.name, ["c", "k"], ["m"], name="floor"),
             helper.make_node(MIN.name, ["k2", "m"], ["y"], name="ceiling")]
    inits = {"w": weights(rng, 8, 3, 3, 3), "k": rng.standard_normal(shape).astype(np.float32)
             * np.float32(0.3), "k2": np.full(shape, 0.8, np.float32)}
    proto = model(nodes, {"x": SHAPE}, {"y": [1, 8, 6, 6]}, inits)
    compiled, _ = compile_and_check(proto, preset, count=2)
    assert compiled.program.host_segments == ()
