"""The rewrite: errors that name things, keep_fp32, names and origins, cleanup, and the digits
model end to end (int8 top-1 within 0.5 points of fp32)."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.graph.int8 import conv_int8
from compiler.graph.ir import Graph
from compiler.graph.ops import is_integer_node
from compiler.pipeline import optimize
from profiler.format import Profile
from quantizer.cleanup import cleanup
from quantizer.errors import QuantizeError
from quantizer.quantize import QuantOptions, quantize
from quantizer.reference import dequantized, run_int8
from simulator import numerics
from tests.cli import DIGITS
from tests.onnx_builder import conv_bn_relu, model
from tests.quantizer.util import profile_of


def _conv_relu_model():
    return conv_bn_relu(channels=4, seed=3)


def _samples(shape, count=8, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


@lru_cache(maxsize=None)
def _conv_relu() -> tuple[onnx.ModelProto, Graph, Profile]:
    proto = _conv_relu_model()
    return proto, optimize(import_model(proto)), profile_of(proto, _samples((1, 3, 8, 8)))


# --- errors -----------------------------------------------------------------------------------


def test_unknown_keep_fp32_name_is_an_error_naming_it() -> None:
    _, graph, profile = _conv_relu()
    with pytest.raises(QuantizeError, match="--keep-fp32 no_such_node: no such node"):
        quantize(graph, profile, QuantOptions(keep_fp32=("conv", "no_such_node")))


def test_profile_missing_tensors_is_an_error_naming_them() -> None:
    _, graph, profile = _conv_relu()
    partial = dataclasses.replace(profile, tensors={k: v for k, v in profile.tensors.items()
                                                    if k not in ("y", "x")})
    with pytest.raises(QuantizeError, match=r"lacks tensor\(s\) 'x', 'y' that"):
        quantize(graph, partial)


def test_nan_weights_are_rejected_naming_the_tensor() -> None:
    w = np.ones((2, 3, 3, 3), np.float32)
    w[1, 0, 0, 0] = np.nan
    proto = model([helper.make_node("Conv", ["x", "w"], ["y"], name="c")], {"x": [1, 3, 4, 4]},
                  {"y": [1, 2, 2, 2]}, {"w": w})
    graph = import_model(proto)
    profile = profile_of(proto, _samples((1, 3, 4, 4)))
    with pytest.raises(QuantizeError, match="weight 'w'.*node 'c'.*NaN or Inf"):
        quantize(graph, profile)


def test_unquantizable_nodes_are_named_never_left_in_float() -> None:
    # A BatchNormalization that no pass removed (the graph is not optimized) has no int8 form.
    stats = {k: np.full(3, v, np.float32) for k, v in (("g", 2.0), ("b", 0.5), ("m", 0.1),
                                                       ("v", 1.0))}
    proto = model([helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"],
                                    name="norm"),
                   helper.make_node("Relu", ["y"], ["z"], name="r")],
                  {"x": [2, 3]}, {"z": [2, 3]}, stats)
    graph = import_model(proto)
    profile = profile_of(proto, _samples((2, 3)))
    with pytest.raises(QuantizeError, match="node 'norm' \\(BatchNormalization\\): has no "
                                            "int8"):
        quantize(graph, profile)
    # Kept in fp32 on request, it runs between a DequantizeLinear and a QuantizeLinear.
    qgraph = quantize(graph, profile, QuantOptions(keep_fp32=("norm",)))
    assert [n.op for n in qgraph.nodes] == ["BatchNormalization", "QuantizeLinear", "Relu",
                                            "DequantizeLinear"]
    feeds = _samples((2, 3))[0]
    np.testing.assert_allclose(run_int8(qgraph, feeds)["z"], evaluate(graph, feeds)["z"],
                               atol=qgraph.type_of("y/q").quant.scale[0])


def test_unfolded_batchnorm_is_named() -> None:
    proto, _, profile = _conv_relu()
    with pytest.raises(QuantizeError, match="node 'bn' \\(BatchNormalization\\)"):
        quantize(import_model(proto), profile)


def test_bad_options_are_errors() -> None:
    for bad in ({"calibration": "kl"}, {"schema": "log2"}, {"activation_dtype": "int4"},
                {"percentile": 0.0}):
        with pytest.raises(QuantizeError):
            QuantOptions(**bad)


# --- the quantized graph ----------------------------------------------------------------------


def test_types_names_origins_and_relu_fusion() -> None:
    _, graph, profile = _conv_relu()
    qgraph = quantize(graph, profile)
    assert [n.op for n in qgraph.nodes] == ["QuantizeLinear", "Conv", "DequantizeLinear"]
    conv = qgraph.nodes[1]
    # The Relu folded into the Conv's clamp; its output keeps the ONNX name of the Relu's.
    assert conv.outputs == ("y/q",) and qgraph.origin["y/q"] == "y"
    assert conv.attrs["qclamp"][0] == qgraph.type_of("y/q").quant.zero_point[0]
    x_type, w_type, b_type = (qgraph.type_of(n) for n in conv.inputs)
    assert x_type.dtype == "int8" and x_type.quant is not None
    assert w_type.dtype == "int8" and w_type.quant.axis == 0 and len(w_type.quant.scale) == 4
    assert set(w_type.quant.zero_point) == {0}
    assert b_type.dtype == "int32" and set(b_type.quant.zero_point) == {0}
    np.testing.assert_allclose(b_type.quant.scale,
                               x_type.quant.scale[0] * np.asarray(w_type.quant.scale))
    assert qgraph.inputs == graph.inputs and qgraph.outputs == graph.outputs
    assert qgraph.type_of("x").dtype == "float32" and qgraph.type_of("y").dtype == "float32"
    for name, value in qgraph.values.items():
        if not value.is_const and value.type.quant is not None:
            assert qgraph.origin[name] in profile.tensors


def test_per_tensor_and_power2_weights() -> None:
    _, graph, profile = _conv_relu()
    qgraph = quantize(graph, profile, QuantOptions(per_channel=False, schema="power2"))
    conv = next(n for n in qgraph.nodes if n.op == "Conv")
    w = qgraph.type_of(conv.inputs[1]).quant
    assert w.axis is None and len(w.scale) == 1
    for name, value in qgraph.values.items():
        if value.type.quant is not None:
            assert all(np.log2(s) == int(np.log2(s)) for s in value.type.quant.scale), name
    assert set(conv.attrs["multiplier"]) == {2**30}  # a power-of-two ratio: shift only


def test_keep_fp32_wraps_the_node_in_dequantize_and_quantize() -> None:
    proto = model([helper.make_node("Conv", ["x", "w"], ["a"], name="c1", pads=[1, 1, 1, 1]),
                   helper.make_node("Sigmoid", ["a"], ["s"], name="sig"),
                   helper.make_node("Conv", ["s", "w2"], ["y"], name="c2")],
                  {"x": [1, 2, 5, 5]}, {"y": [1, 2, 5, 5]},
                  {"w": np.full((3, 2, 3, 3), 0.1, np.float32),
                   "w2": np.full((2, 3, 1, 1), 0.5, np.float32)})
    graph = import_model(proto)
    profile = profile_of(proto, _samples((1, 2, 5, 5)))
    qgraph = quantize(graph, profile, QuantOptions(keep_fp32=("sig",)))
    ops = [(n.op, n.name) for n in qgraph.nodes]
    assert ops == [("QuantizeLinear", "x/QuantizeLinear"), ("Conv", "c1"),
                   ("DequantizeLinear", "a/DequantizeLinear"), ("Sigmoid", "sig"),
                   ("QuantizeLinear", "s/QuantizeLinear"), ("Conv", "c2"),
                   ("DequantizeLinear", "y/DequantizeLinear")]
    sig = qgraph.node("sig")
    assert sig.inputs == ("a/fp32",) and qgraph.type_of("s").dtype == "float32"
    assert not is_integer_node(qgraph, sig)
    feeds = _samples((1, 2, 5, 5))[1]
    env = run_int8(qgraph, feeds, keep_all=True)
    assert env["a"].dtype == np.int8 and env["s"].dtype == np.float32


def test_concat_of_quantized_inputs_folds_its_rescales_into_their_producers() -> None:
    proto = model([helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=1)],
                  {"a": [1, 2, 3], "b": [1, 2, 3]}, {"y": [1, 4, 3]})
    graph = import_model(proto)
    rng = np.random.default_rng(5)
    samples = [{"a": rng.standard_normal((1, 2, 3)).astype(np.float32),
                "b": 6 * rng.standard_normal((1, 2, 3)).astype(np.float32)} for _ in range(6)]
    qgraph = quantize(graph, profile_of(proto, samples))
    assert "Rescale" not in qgraph.op_counts()
    out = qgraph.type_of("y/q").quant
    for name in ("a/q", "b/q"):
        assert qgraph.type_of(name).quant == out


def test_cleanup_merges_consecutive_rescales_and_drops_identities() -> None:
    from compiler.graph.ir import Node, QuantParams, Type, Value
    p1, p2, p3 = (QuantParams.per_tensor(s, z) for s, z in ((0.1, 3), (0.05, -2), (0.2, 0)))

    def rescale(name, x, y, src, dst):
        m, s = numerics.quantize_multiplier(src.scale[0] / dst.scale[0])
        return Node("Rescale", name, (x,), (y,), {
            "multiplier": (m,), "shift": (s,), "x_zero_point": src.zero_point[0],
            "out_zero_point": dst.zero_point[0], "qclamp": (-128, 127), "out_dtype": "int8"})
    values = {
        "q": Value("q", Type("int8", (4,), p1)),
        "r1": Value("r1", Type("int8", (4,), p2)),
        "r2": Value("r2", Type("int8", (4,), p3)),
        "r3": Value("r3", Type("int8", (4,), p3)),
        "m": Value("m", Type("int8", (4,), p3)),
        "y": Value("y", Type("float32", (4,))),
        "s3": Value("s3", Type("float32", ()), np.asarray(np.float32(0.2))),
        "z3": Value("z3", Type("int8", ()), np.asarray(np.int8(0))),
    }
    nodes = (
        Node("Sigmoid", "sig", ("q0",), ("q",), {}),
        rescale("r1", "q", "r1", p1, p2),
        rescale("r2", "r1", "r2", p2, p3),   # Rescale(Rescale(q)) -> Rescale(q)
        rescale("r3", "r2", "r3", p3, p3),   # identity -> dropped
        Node("Relu", "relu", ("r3",), ("m",), {"qclamp": (0, 127)}),
        Node("DequantizeLinear", "dq", ("m", "s3", "z3"), ("y",), {}),
    )
    values["q0"] = Value("q0", Type("int8", (4,), p1))
    graph = Graph("g", ("q0",), ("y",), nodes, values)
    cleaned = cleanup(graph)
    assert [n.op for n in cleaned.nodes] == ["Sigmoid", "Rescale", "Relu", "DequantizeLinear"]
    merged = cleaned.nodes[1]
    assert merged.inputs == ("q",) and merged.outputs == ("r2",)
    assert (merged.attrs["multiplier"][0], merged.attrs["shift"][0]) == \
        numerics.quantize_multiplier(0.1 / 0.2)
    assert merged.attrs["x_zero_point"] == 3 and merged.attrs["out_zero_point"] == 0
    assert cleaned.node("relu").inputs == ("r2",)


# --- the integer reference --------------------------------------------------------------------


def test_conv_kernel_equals_a_direct_integer_loop() -> None:
    rng = np.random.default_rng(11)
    x = rng.integers(-128, 128, (1, 2, 5, 5)).astype(np.int8)
    w = rng.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8)
    b = rng.integers(-5000, 5000, 3).astype(np.int32)
    mult = tuple(int(m) for m in rng.integers(2**30, 2**31, 3))
    shift = (7, 8, 9)
    zx, zo = -7, 5
    got = conv_int8(x, w, b, multiplier=mult, shift=shift, x_zero_point=zx, out_zero_point=zo,
                    qclamp=(-100, 120), pads=(1, 1, 1, 1), strides=(2, 2))
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=zx)
    want = np.zeros((1, 3, 3, 3), np.int64)
    for m in range(3):
        for i in range(3):
            for j in range(3):
                acc = int(b[m]) + int(np.sum(padded[0, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
                                             * w[m].astype(np.int64)))
                want[0, m, i, j] = numerics.requantize(acc, mult[m], shift[m], zo, -100, 120)
    np.testing.assert_array_equal(got, want)


def test_run_int8_keeps_integers_for_every_quantized_value() -> None:
    _, graph, profile = _conv_relu()
    qgraph = quantize(graph, profile)
    env = run_int8(qgraph, _samples((1, 3, 8, 8))[0], keep_all=True)
    for name, value in qgraph.values.items():
        if value.type.quant is not None and not value.is_const:
            assert env[name].dtype == np.dtype(value.type.dtype), name
    assert env["y"].dtype == np.float32


def test_dequantized_values_line_up_with_the_fp32_run_by_onnx_name() -> None:
    _, graph, profile = _conv_relu()
    qgraph = quantize(graph, profile)
    feeds = _samples((1, 3, 8, 8))[0]
    views = dequantized(qgraph, run_int8(qgraph, feeds, keep_all=True))
    fp32 = evaluate(graph, feeds, keep_all=True)
    assert set(views) == {"x", "y"}
    for name, view in views.items():
        scale = qgraph.type_of(f"{name}/q").quant.scale[0]
        assert np.max(np.abs(view - fp32[name])) <= 2 * scale, name


def test_a_rescaled_copy_does_not_stand_for_its_tensor() -> None:
    """A Concat rescales its input c (which a Sigmoid reads too) to its own parameters: that
    copy carries c's ONNX name as well, but c's dequantized value is the Conv's own output,
    at c's scale, as its own SQNR and its kernel's are measured."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),
             helper.make_node("Concat", ["c", "z"], ["y"], name="cat", axis=1)]
    proto = model(nodes, {"x": [1, 3, 4, 4], "z": [1, 2, 4, 4]},
                  {"s": [1, 4, 4, 4], "y": [1, 6, 4, 4]},
                  {"w": (rng.standard_normal((4, 3, 3, 3)) * 0.05).astype(np.float32)})
    samples = [{"x": f["x"], "z": 4 * f["x"][:, :2]} for f in _samples((1, 3, 4, 4))]
    qgraph = quantize(optimize(import_model(proto)), profile_of(proto, samples))
    copies = [v for v in qgraph.values if qgraph.origin.get(v) == "c" and v != "c"]
    assert copies and any(n.op == "Rescale" and n.outputs[0] in copies for n in qgraph.nodes)
    env = run_int8(qgraph, samples[0], keep_all=True)
    params = qgraph.type_of("c").quant
    own = numerics.dequantize(env["c"], params.scale[0], params.zero_point[0],
                              arithmetic=np.float64).astype(np.float32)
    assert np.array_equal(dequantized(qgraph, env)["c"], own)


def test_quantizing_twice_gives_the_same_graph() -> None:
    _, graph, profile = _conv_relu()
    a, b = quantize(graph, profile), quantize(graph, profile)
    assert [(n.op, n.inputs, n.outputs, str(n.attrs)) for n in a.nodes] == \
        [(n.op, n.inputs, n.outputs, str(n.attrs)) for n in b.nodes]
    for name, value in a.values.items():
        assert value.type == b.values[name].type
        if value.is_const:
            np.testing.assert_array_equal(value.const, b.values[name].const)


# --- the digits model end to end --------------------------------------------------------------


@lru_cache(maxsize=None)
def _digits() -> tuple[Graph, Profile]:
    proto = onnx.load(str(DIGITS / "model.onnx"))
    calib = np.load(DIGITS / "calib.npz")["input"]
    profile = profile_of(proto, ({"input": x[None]} for x in calib))
    return optimize(import_model(proto)), profile


def _top1(run, graph: Graph) -> float:
    data = np.load(DIGITS / "eval.npz")
    hits = sum(int(np.argmax(run(graph, {"input": x[None]})["logits"]) == label)
               for x, label in zip(data["input"], data["labels"]))
    return 100.0 * hits / len(data["labels"])


@pytest.mark.slow
def test_digits_from_the_profilers_own_run_and_file(tmp_path: Path) -> None:
    """The profile as `ember quantize-profile` makes it: onnxruntime, written, read back."""
    from ember.flow import quantize_model
    from profiler import format as profile_format
    from profiler.model_inputs import input_specs
    from profiler.run import RunOptions, load_model, profile
    from profiler.sources.arrays import ArrayFile

    proto = load_model(DIGITS / "model.onnx")
    specs = input_specs(proto, {})
    measured = profile(proto, ArrayFile(DIGITS / "calib.npz", specs), specs, RunOptions())
    profile_format.save(measured, tmp_path / "digits.profile.json")
    quantized = quantize_model(DIGITS / "model.onnx", tmp_path / "digits.profile.json")
    fp32, int8 = _top1(evaluate, quantized.graph), _top1(run_int8, quantized.qgraph)
    assert int8 >= fp32 - 0.5, f"int8 top-1 {int8:.2f}% vs fp32 {fp32:.2f}%"


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    QuantOptions(),
    QuantOptions(calibration="entropy"),
    QuantOptions(activation_dtype="uint8", per_channel=False),
    QuantOptions(keep_fp32=("conv2",)),
], ids=["default", "entropy", "uint8-per-tensor", "keep-conv2"])
def test_digits_int8_top1_within_half_a_point_of_fp32(options: QuantOptions) -> None:
    graph, profile = _digits()
    qgraph = quantize(graph, profile, options)
    fp32 = _top1(evaluate, graph)
    int8 = _top1(run_int8, qgraph)
    assert fp32 > 95.0
    assert int8 >= fp32 - 0.5, f"int8 top-1 {int8:.2f}% vs fp32 {fp32:.2f}%"


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_quantize_and_dequantize_linear_follow_onnxruntime(dtype: str) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper

    from compiler.graph.int8 import dequantize_linear, quantize_linear
    elem = TensorProto.INT8 if dtype == "int8" else TensorProto.UINT8
    scale, zero = np.float32(0.05), np.asarray(-3 if dtype == "int8" else 120, dtype)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("q", elem, [64]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
        [numpy_helper.from_array(np.asarray(scale), "s"), numpy_helper.from_array(zero, "z")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    x = np.concatenate([np.arange(-20, 20) * 0.025,  # exact ties: round half to even
                        np.random.default_rng(0).standard_normal(24) * 10]).astype(np.float32)
    q_ort, y_ort = ort.InferenceSession(proto.SerializeToString(),
                                        providers=["CPUExecutionProvider"]).run(None, {"x": x})
    q = quantize_linear(x, scale, zero)
    np.testing.assert_array_equal(q, q_ort)
    np.testing.assert_array_equal(dequantize_linear(q, scale, zero), y_ort)


def test_cleanup_changes_results_by_at_most_one_code() -> None:
    """Folding a Rescale into its producer removes a rounding: codes move by at most one."""
    from quantizer.quantize import _Rewriter
    w = np.random.default_rng(4).standard_normal((3, 2, 1, 1)).astype(np.float32)
    proto = model([helper.make_node("Conv", ["a", "w"], ["c"], name="conv"),
                   helper.make_node("Relu", ["c"], ["r"], name="relu"),
                   helper.make_node("Concat", ["r", "b"], ["y"], name="cat", axis=1)],
                  {"a": [1, 2, 4, 4], "b": [1, 2, 4, 4]}, {"y": [1, 5, 4, 4]}, {"w": w})
    graph = import_model(proto)
    rng = np.random.default_rng(6)
    samples = [{"a": rng.standard_normal((1, 2, 4, 4)).astype(np.float32),
                "b": -np.abs(rng.standard_normal((1, 2, 4, 4))).astype(np.float32)}
               for _ in range(6)]  # r >= 0 and b <= 0: both differ from the Concat's range
    profile = profile_of(proto, samples)
    raw = _Rewriter(graph, profile, QuantOptions()).run()
    assert raw.op_counts()["Rescale"] == 2
    cleaned = cleanup(raw)
    assert "Rescale" not in cleaned.op_counts()
    assert cleaned.node("conv").attrs["qclamp"][0] == cleaned.type_of("r").quant.zero_point[0]
    for feeds in samples:
        before = run_int8(raw, feeds, keep_all=True)["y/q"].astype(int)
        after = run_int8(cleaned, feeds, keep_all=True)["y/q"].astype(int)
        assert np.max(np.abs(before - after)) <= 1
