"""Per-channel affine maps on the accelerator: a BatchNormalization that cannot fold (after a
MaxPool) and Add, Sub, Mul, Div by a per-channel constant become depthwise 1x1 convolutions
(`compiler.passes.channel_affine`), quantized per channel and run bit-exactly; what still cannot
run on the accelerator goes to a host segment with --allow-host."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.backend.program import BackendOptions
from compiler.errors import CompileError
from ember import ort
from ember.flow import CompileOptions, compile_model, optimized_graph
from ember.reports.metrics import ErrorStats
from compiler.graph.evaluate import evaluate
from quantizer.reference import run_int8
from tests.cli import invoke
from tests.e2e.flow import check_bit_exact, compile_and_check, quantized, samples
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

C = 10  # two channel blocks on the edge preset (8 lanes), a partial one on default (16)


def conv_pool_bn(seed: int = 0):
    """x → Conv → MaxPool → BatchNormalization → Relu: the BN has no Conv to fold into."""
    rng = np.random.default_rng(seed)
    inits = {"w": (rng.standard_normal((C, 3, 3, 3)) * 0.4).astype(np.float32),
             "gamma": rng.uniform(-1.5, 1.5, C).astype(np.float32),
             "beta": rng.standard_normal(C).astype(np.float32),
             "mean": rng.standard_normal(C).astype(np.float32),
             "var": rng.uniform(0.5, 2.0, C).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("BatchNormalization", ["p", "gamma", "beta", "mean", "var"],
                              ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, C, 4, 4]}, inits)


@pytest.mark.parametrize("preset", ["edge", "default"])
def test_unfoldable_batchnorm_runs_on_the_accelerator_bit_exactly(preset: str) -> None:
    compiled, _ = compile_and_check(conv_pool_bn(), preset, count=3)
    assert compiled.program.host_segments == ()


def test_unfoldable_batchnorm_graph_equals_onnxruntime_and_quantizes_well() -> None:
    proto = conv_pool_bn()
    graph = optimized_graph(proto)
    assert "BatchNormalization" not in {node.op for node in graph.nodes}
    feeds = samples({"x": (1, 3, 8, 8)}, 16, seed=3)
    qgraph = quantized(proto, samples({"x": (1, 3, 8, 8)}, 16))
    fp32_error, int8_error = ErrorStats(), ErrorStats()
    session = ort.session(proto)
    for feed in feeds:
        reference = ort.run(session, feed)["y"]
        fp32_error.add(reference, evaluate(graph, feed)["y"])
        int8_error.add(reference, run_int8(qgraph, feed)["y"])
    assert fp32_error.max_abs <= 1e-5 * max(1.0, float(np.abs(reference).max()))
    assert int8_error.sqnr_db > 30.0, int8_error.sqnr_db


def affine_model(op: str, shape: tuple[int, ...], const_first: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    const = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    inputs = ["k", "x"] if const_first else ["x", "k"]
    nodes = [helper.make_node(op, inputs, ["y"], name="f")]
    return model(nodes, {"x": [1, C, 5, 3]}, {"y": [1, C, 5, 3]},
                 {"k": const.astype(np.float32)})


# Per channel, either operand order; a scalar (a lookup table, as before); Div by a constant.
FORMS = [(op, shape, first) for op in ("Add", "Sub", "Mul")
         for shape in ((C, 1, 1), (1, C, 1, 1), (1,)) for first in (False, True)] + \
    [("Div", (C, 1, 1), False), ("Div", (1, C, 1, 1), False), ("Div", (1,), False)]


@pytest.mark.parametrize("op, shape, const_first", FORMS, ids=lambda v: str(v).replace(" ", ""))
def test_constant_operand_runs_on_the_accelerator_bit_exactly(op, shape, const_first) -> None:
    compiled, _ = compile_and_check(affine_model(op, shape, const_first), "edge")
    assert compiled.program.host_segments == ()


def test_an_activation_broadcast_over_the_batch_runs_on_the_host_with_allow_host() -> None:
    # A constant over the pixels runs on the accelerator (tests/e2e/test_constant_operands.py);
    # one with more images than the activation would make the vector unit repeat x.
    proto = model([helper.make_node("Add", ["x", "k"], ["y"], name="f")], {"x": [1, C, 5, 3]},
                  {"y": [2, C, 5, 3]}, {"k": np.ones((2, C, 5, 3), np.float32)})
    shapes = {"x": (1, C, 5, 3)}
    profile = profile_of(proto, samples(shapes, 8), optimized_graph(proto))
    with pytest.raises(CompileError, match="node 'f' \\(Add\\)"):
        compile_model(proto, profile, CompileOptions(), "edge")
    built = compile_model(proto, profile, CompileOptions(backend=BackendOptions(allow_host=True)),
                          "edge")
    assert [s["nodes"] for s in built.compiled.summary.host_segments] == [["f"]]
    check_bit_exact(built.qgraph, built.compiled, samples(shapes, 2, 1))


def test_a_node_without_an_int8_form_runs_on_the_host_with_allow_host() -> None:
    # A BatchNormalization of a [N, C] value with no Gemm before it: neither folds nor becomes
    # a convolution; the quantizer alone refuses it, and --allow-host keeps it in fp32.
    rng = np.random.default_rng(0)
    params = {n: rng.uniform(0.5, 1.5, 6).astype(np.float32)
              for n in ("gamma", "beta", "mean", "var")}
    nodes = [helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"],
                              ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    proto = model(nodes, {"x": [2, 6]}, {"y": [2, 6]}, params)
    profile = profile_of(proto, samples({"x": (2, 6)}, 8), optimized_graph(proto))
    with pytest.raises(Exception, match="node 'bn' \\(BatchNormalization\\)"):
        compile_model(proto, profile, CompileOptions(), "edge")
    built = compile_model(proto, profile, CompileOptions(backend=BackendOptions(allow_host=True)),
                          "edge")
    assert built.compiled.program.metadata["options"]["keep_fp32"] == ["bn"]
    check_bit_exact(built.qgraph, built.compiled, samples({"x": (2, 6)}, 2, 1))


@pytest.mark.parametrize("command", [["show"], ["quantize-profile", "--random", "2", "-o"]])
def test_a_constant_operand_that_does_not_broadcast_is_one_line_naming_the_node(
        tmp_path, command) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(affine_model("Mul", (3, 1, 1), False).SerializeToString())
    out = [tmp_path / "out"] if command[-1] == "-o" else []
    result = invoke(command[0], path, *command[1:], *out)
    message = result.output.strip()
    assert result.exit_code == 2 and len(message.splitlines()) == 1, message
    assert "Mul" in message and ("(f)" in message or "name: f" in message), message
    assert not any(p.exists() for p in out)
