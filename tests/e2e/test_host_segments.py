"""Host segments: nodes kept in fp32 and operators the accelerator lacks run on the host CPU
(`--allow-host`), inside a program that stays bit-exact with the integer reference; without
`--allow-host` they are errors that name the node and suggest the option."""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.backend.layers import HostLayer, PoolLayer
from compiler.backend.lower import RULES, lower, unsupported
from compiler.backend.program import BackendOptions
from compiler.errors import CompileError
from compiler.graph.evaluate import run_node
from compiler.graph.ops import Lower
from compiler.graph.serialize import graph_from_dict, graph_to_dict
from compiler.pipeline import compile_int8
from ember.flow import quantize_model
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from simulator import isa
from simulator.arch import Arch
from simulator.program import Program
from tests.cli import DIGITS
from tests.cli import invoke as cli_invoke
from tests.e2e.flow import check_bit_exact, quantized, samples
from tests.onnx_builder import model

HOST = BackendOptions(allow_host=True)


@lru_cache(maxsize=None)
def digits(*keep: str):
    proto = onnx.load(DIGITS / "model.onnx")
    calib = np.load(DIGITS / "calib.npz")["input"]
    return quantized(proto, [{"input": calib[i:i + 1]} for i in range(len(calib))],
                     QuantOptions(keep_fp32=keep))


def eval_feeds(count: int) -> list[dict]:
    images = np.load(DIGITS / "eval.npz")["input"]
    return [{"input": images[i:i + 1]} for i in range(0, 15 * count, 15)]


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_a_middle_conv_kept_in_fp32_runs_on_the_host_bit_exactly(preset: str) -> None:
    qgraph = digits("conv2")
    compiled = compile_int8(qgraph, Arch.load(preset), HOST)
    program = compiled.program
    (segment,) = program.host_segments
    # The fp32 conv with the DequantizeLinear/QuantizeLinear that wrap it: one segment.
    assert segment["nodes"] == ["relu1/DequantizeLinear", "conv2", "bn2/QuantizeLinear"]
    assert [b["dtype"] for b in segment["inputs"] + segment["outputs"]] == ["int8", "int8"]
    # 2 x MACs of the 3x3 conv, and one per element of the DequantizeLinear/QuantizeLinear
    assert segment["flops"] == 2 * (32 * 8 * 8) * (16 * 3 * 3) + 16 * 8 * 8 + 32 * 8 * 8
    hosts = [insn for insn in program.instructions if insn.op is isa.HOST]
    assert len(hosts) == 1 and hosts[0].args["segment"] == 0
    assert hosts[0].args["compute_cycles"] == program.arch.host_cycles(segment["flops"])
    (summary,) = compiled.summary.host_segments
    assert summary["nodes"] == segment["nodes"] and summary["cycles"] > \
        summary["compute_cycles"]
    assert compiled.summary.busiest_unit_cycles >= summary["cycles"]
    assert program.metadata["compiler"]["options"]["allow_host"] is True
    assert not any(layer["name"] == "conv2" for layer in compiled.summary.per_layer)
    check_bit_exact(qgraph, compiled, eval_feeds(4))


def test_kept_fp32_nodes_need_allow_host() -> None:
    with pytest.raises(CompileError, match=r"^node 'conv2' \(Conv\).*--allow-host"):
        compile_int8(digits("conv2"), Arch.load("edge"))


def test_fp32_model_input_and_output_cross_the_program_boundary_as_float32() -> None:
    """The first conv kept in fp32 reads the model input as it is, and the last (fc) writes the
    model output: both program bindings are float32, scale 1, zero point 0."""
    qgraph = digits("conv1", "fc")
    compiled = compile_int8(qgraph, Arch.load("edge"), HOST)
    (x,), (y,) = compiled.program.inputs, compiled.program.outputs
    assert (x.name, x.dtype, x.scale, x.zero_point) == ("input", "float32", 1.0, 0)
    assert (y.name, y.dtype, y.scale, y.zero_point) == ("logits", "float32", 1.0, 0)
    assert [s["nodes"] for s in compiled.program.host_segments] == [
        ["conv1", "bn1/QuantizeLinear"], ["flatten/DequantizeLinear", "fc"]]
    result = check_bit_exact(qgraph, compiled, eval_feeds(3))
    assert result.outputs["logits"].dtype == np.float32


# An edge Pad of one channel: a node the accelerator has no lowering for (Pads of H and W lower).
CHANNEL_PAD = np.array([0, 0, 0, 0, 0, 1, 0, 0], np.int64)


def _edge_pad_model() -> onnx.ModelProto:
    """conv → an edge Pad (no lowering) → conv → ReduceMean → Softmax over the
    middle axis (not the contiguous one: through element copies on the accelerator)."""
    rng = np.random.default_rng(1)
    inits = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
             "w2": rng.standard_normal((8, 9, 3, 3)).astype(np.float32), "pads": CHANNEL_PAD}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Pad", ["r1", "pads"], ["t"], name="edge", mode="edge"),
             helper.make_node("Conv", ["t", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["c2"], ["m"], name="mean", axes=[2], keepdims=0),
             helper.make_node("Softmax", ["m"], ["y"], name="probabilities", axis=1)]
    return model(nodes, {"x": [1, 3, 6, 7]}, {"y": [1, 8, 7]}, inits)


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_operators_without_a_lowering_run_on_the_host_only_when_allowed(preset: str) -> None:
    shapes = {"x": [1, 3, 6, 7]}
    qgraph = quantized(_edge_pad_model(), samples(shapes, 8))
    with pytest.raises(CompileError, match=r"'edge' \(Pad\).*--allow-host"):
        compile_int8(qgraph, Arch.load(preset))
    compiled = compile_int8(qgraph, Arch.load(preset), HOST)
    assert [s["nodes"] for s in compiled.program.host_segments] == [["edge"]]
    kinds = [layer["kind"] for layer in compiled.summary.per_layer]
    assert kinds == ["Conv", "Host", "Conv", "Pool", "Lut", "Softmax", "Lut"]
    check_bit_exact(qgraph, compiled, samples(shapes, 3, 1))


def test_a_host_output_is_written_into_the_concat_that_reads_it() -> None:
    """Copy elimination across the boundary: the host writes its output straight into its part
    of the Concat's buffer, so the accelerator's Concat needs no copy layer."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Pad", ["c", "pads"], ["t"], name="edge", mode="edge"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Pad", ["r", "pads"], ["u"], name="edge2", mode="edge"),
             helper.make_node("Concat", ["t", "u"], ["cat"], name="cat", axis=1),
             helper.make_node("Conv", ["cat", "w2"], ["y"], name="conv2")]
    proto = model(nodes, {"x": [1, 3, 5, 5]}, {"y": [1, 4, 5, 5]},
                  {"w1": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                   "w2": rng.standard_normal((4, 10, 1, 1)).astype(np.float32),
                   "pads": CHANNEL_PAD})
    shapes = {"x": [1, 3, 5, 5]}
    qgraph = quantized(proto, samples(shapes, 8))
    compiled = compile_int8(qgraph, Arch.load("edge"), HOST)
    assert [layer["name"] for layer in compiled.summary.per_layer] == [
        "conv1", "host0:edge", "relu", "host1:edge2", "conv2"]
    cat = [s["outputs"][0] for s in compiled.program.host_segments]
    assert cat[1]["dram"] - cat[0]["dram"] == 5 and cat[0]["strides"] == [250, 1, 50, 10]
    check_bit_exact(qgraph, compiled, samples(shapes, 2, 1))


def only_with_allow_host(proto, shapes: dict, error: str, preset: str = "edge",
                         segments: list | None = None):
    """The model fails to compile with an error matching `error`, compiles with --allow-host
    into `segments` (node names per host segment) and runs bit-exact; returns the program."""
    qgraph = quantized(proto, samples(shapes, 8))
    with pytest.raises(CompileError, match=error):
        compile_int8(qgraph, Arch.load(preset))
    compiled = compile_int8(qgraph, Arch.load(preset), HOST)
    if segments is not None:
        assert [s["nodes"] for s in compiled.program.host_segments] == segments
    check_bit_exact(qgraph, compiled, samples(shapes, 2, 1))
    return compiled


def test_an_output_no_binding_describes_is_dequantized_on_the_host() -> None:
    """Flatten of a channels-last map is in no strided order of its logical shape: the host
    reads the map and writes the float32 output in row-major order."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["c"], ["y"], name="flat")]
    proto = model(nodes, {"x": [1, 3, 4, 5]}, {"y": [1, 80]},
                  {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)})
    compiled = only_with_allow_host(proto, {"x": [1, 3, 4, 5]},
                                    r"'y/DequantizeLinear'.*--allow-host",
                                    segments=[["y/DequantizeLinear"]])
    assert compiled.program.outputs[0].dtype == "float32"


def test_a_case_the_handler_refuses_runs_on_the_host() -> None:
    """Mul has a lowering (the vector unit's MUL) that refuses an operand broadcast along one
    spatial axis only."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="conv"),
             helper.make_node("MaxPool", ["a"], ["column"], name="pool", kernel_shape=[5, 1]),
             helper.make_node("Mul", ["a", "column"], ["y"], name="square")]
    proto = model(nodes, {"x": [1, 3, 5, 6]}, {"y": [1, 4, 5, 6]},
                  {"w": rng.standard_normal((4, 3, 1, 1)).astype(np.float32)})
    only_with_allow_host(proto, {"x": [1, 3, 5, 6]}, r"'square' \(Mul\).*--allow-host",
                         segments=[["square"]])


def test_a_handler_that_fails_midway_leaves_no_partial_state(monkeypatch) -> None:
    """A lowering that adds a layer and a tensor and then finds it cannot run the node: the
    node runs on the host, and nothing of the failed attempt remains."""
    original = RULES[Lower.MAX_POOL]

    def half_then_fail(lowering, node):
        original(lowering, node)
        raise unsupported(node, "a test refuses it after lowering it")

    monkeypatch.setitem(RULES, Lower.MAX_POOL, half_then_fail)
    qgraph = digits()
    lowered = lower(qgraph, allow_host=True)
    assert not any(isinstance(layer, PoolLayer) for layer in lowered.layers)
    (host,) = [layer for layer in lowered.layers if isinstance(layer, HostLayer)]
    assert host.nodes == ("pool", "flatten")  # the view of its output stays with it
    compiled = compile_int8(qgraph, Arch.load("edge"), HOST)
    check_bit_exact(qgraph, compiled, eval_feeds(2))


def test_serialized_graph_round_trips_exactly() -> None:
    qgraph = digits("conv2")
    text = json.dumps(graph_to_dict(qgraph))
    back = graph_from_dict(json.loads(text))
    assert (back.name, back.inputs, back.outputs, back.opset) == \
        (qgraph.name, qgraph.inputs, qgraph.outputs, qgraph.opset)
    assert dict(back.origin) == dict(qgraph.origin)
    assert list(back.values) == list(qgraph.values)
    for name, value in qgraph.values.items():
        assert back.values[name].type == value.type, name
        if value.is_const:
            assert back.values[name].const.dtype == value.const.dtype
            np.testing.assert_array_equal(back.values[name].const, value.const)
    for a, b in zip(qgraph.nodes, back.nodes):
        assert (a.op, a.name, a.inputs, a.outputs) == (b.op, b.name, b.inputs, b.outputs)
        assert set(a.attrs) == set(b.attrs)
        for key, value in a.attrs.items():
            assert type(b.attrs[key]) is type(value), (a.name, key)
            np.testing.assert_array_equal(b.attrs[key], value)
    feeds = eval_feeds(1)[0]
    for name, value in run_int8(qgraph, feeds).items():
        np.testing.assert_array_equal(run_int8(back, feeds)[name], value)
    assert json.dumps(graph_to_dict(back)) == text


def test_run_node_is_the_integer_references_own() -> None:
    import quantizer.reference
    assert quantizer.reference.run_node is run_node


def invoke(*args):
    return cli_invoke(*args, catch_exceptions=False)


def test_cli_compile_simulate_and_accuracy_with_host_segments(tmp_path, digits_profile) -> None:
    onnx_path, program = DIGITS / "model.onnx", tmp_path / "m.ember"
    common = ("--profile", digits_profile, "--keep-fp32", "conv2", "--target", "edge")
    refused = invoke("compile", onnx_path, *common, "-o", program)
    assert refused.exit_code == 2 and "--allow-host" in refused.output
    assert "\n" not in refused.output.strip() and not program.exists()
    result = invoke("compile", onnx_path, *common, "--allow-host", "-o", program, "--json")
    assert result.exit_code == 0, result.output
    (segment,) = json.loads(result.output)["host_segments"]
    assert "conv2" in segment["nodes"] and segment["cycles"] > 0
    table = invoke("compile", onnx_path, *common, "--allow-host", "-o", tmp_path / "t.ember")
    assert "host segment host0:conv2" in table.output
    assert (tmp_path / "t.ember").read_bytes() == program.read_bytes()  # deterministic
    assert Program.load(program).metadata["options"]["allow_host"] is True
    sample = tmp_path / "sample.npz"
    np.savez(sample, input=np.load(DIGITS / "eval.npz")["input"][:2])
    simulated = invoke("simulate", program, "-i", sample, "-o", tmp_path / "out.npz", "--json")
    assert simulated.exit_code == 0, simulated.output
    with np.load(tmp_path / "out.npz") as out:
        assert out["logits"].shape == (2, 1, 10)
    accuracy = invoke("accuracy", onnx_path, program, "--profile", digits_profile, "--data",
                      DIGITS / "eval.npz", "--samples", "6", "--json")
    assert accuracy.exit_code == 0, accuracy.output
    doc = json.loads(accuracy.output)
    assert doc["bit_exact"] is True and doc["first_difference"] is None
    assert [s["name"] for s in doc["host_segments"]] == ["host0:conv2"]


def test_cli_float32_program_input_and_output(tmp_path, digits_profile) -> None:
    """A program whose input and output are fp32 on the host: `ember simulate` passes the float
    input as it is and writes the float output, equal to the integer reference's, and `ember
    accuracy` finds it bit-exact."""
    onnx_path, program = DIGITS / "model.onnx", tmp_path / "m.ember"
    result = invoke("compile", onnx_path, "--profile", digits_profile, "--keep-fp32", "conv1",
                    "--keep-fp32", "fc", "--allow-host", "-o", program)
    assert result.exit_code == 0, result.output
    images = np.load(DIGITS / "eval.npz")["input"][:2]
    np.savez(tmp_path / "x.npz", input=images)
    simulated = invoke("simulate", program, "-i", tmp_path / "x.npz", "-o", tmp_path / "y.npz")
    assert simulated.exit_code == 0, simulated.output
    qgraph = quantize_model(onnx_path, digits_profile,
                            QuantOptions(keep_fp32=("conv1", "fc"))).qgraph
    with np.load(tmp_path / "y.npz") as out:
        for i in range(2):
            expected = run_int8(qgraph, {"input": images[i:i + 1]})["logits"]
            np.testing.assert_array_equal(out["logits"][i], expected)
    accuracy = invoke("accuracy", onnx_path, program, "--profile", digits_profile, "--data",
                      DIGITS / "eval.npz", "--samples", "3", "--json")
    assert accuracy.exit_code == 0, accuracy.output
    assert json.loads(accuracy.output)["bit_exact"] is True


def test_a_host_segment_reads_a_reshaped_slice() -> None:
    """A Reshape of a Slice gets a tensor of its own (an identity-table copy); a host segment
    reading it looked that tensor up as a graph value (found on PicoDet's head: KeyError)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Slice", ["c", "starts", "ends", "axes"], ["s"], name="part"),
             helper.make_node("Reshape", ["s", "shape"], ["r"], name="flat"),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1, name="softmax")]
    proto = model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 32]},
                  {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                   "starts": np.array([1], np.int64), "ends": np.array([3], np.int64),
                   "axes": np.array([1], np.int64), "shape": np.array([1, 32], np.int64)})
    # The Softmax kept in fp32: it runs on the accelerator now, the host reads its input.
    qgraph = quantized(proto, samples({"x": [1, 3, 4, 4]}, 4),
                       QuantOptions(keep_fp32=("softmax",)))
    compiled = compile_int8(qgraph, Arch.load("default"), HOST)
    assert compiled.program.host_segments
    check_bit_exact(qgraph, compiled, samples({"x": [1, 3, 4, 4]}, 2, 1))


def test_a_reduction_without_an_int8_form_runs_on_the_host() -> None:
    """ReduceSum, ReduceMax, ReduceMin and ReduceL2 have fp32 rows only: with --allow-host
    they run in a host segment between accelerator layers, bit-exact against the reference."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("ReduceL2", ["c", "axes"], ["r"], name="norm", keepdims=1),
             helper.make_node("Mul", ["c", "r"], ["y"], name="scale")]
    proto = model(nodes, {"x": [1, 3, 4, 4]}, {"y": [1, 4, 4, 4]},
                  {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                   "axes": np.array([1], np.int64)}, opset=18)
    qgraph = quantized(proto, samples({"x": [1, 3, 4, 4]}, 4),
                       QuantOptions(keep_fp32=("norm",)))
    compiled = compile_int8(qgraph, Arch.load("default"), HOST)
    assert [s["nodes"] for s in compiled.program.host_segments] == [
        ["c/DequantizeLinear", "norm", "r/QuantizeLinear"]]
    check_bit_exact(qgraph, compiled, samples({"x": [1, 3, 4, 4]}, 2, 1))
