"""The QDQ export against the integer reference: onnxruntime (CPU, basic level, `ember.ort`)
runs the export, and its outputs, quantized back to each output's integer grid, are compared
code by code with `run_int8`'s.

The tolerance, and why: QuantizeLinear rounds the real result to the nearest code as the
integer requantization does, so a node differs only where its exact result lies within
float32's and the Q31 multiplier's error (about 2^-22 of a step; Add and Sub also round their
inputs to 2^-20 of the larger input scale, as TFLite's ADD does) of a half step, or exactly on
one, where the integer path rounds half away from zero and QuantizeLinear half to even. Lookup
tables and Softmax are their float functions between Q/DQ, equal to the tables unless
onnxruntime's float function and the reference's fall on different sides of a half step. So
each node, fed the reference's integers, is within 1 LSB (asserted per node, hypothesis);
a graph's outputs can differ by more, because a one-code difference early on grows through
later gains, so they are held to the target of at least 99.9% of elements within 1 LSB.

Measured (`python -m tests.quantizer.test_qdq 2000 1`: the digits model on its 450 evaluation
samples, then 2000 seeded random graphs, 1945 of them quantizable):
    digits, int8 affine            4500 logits: 100% exact
    random, int8 affine (default)  outputs 99.977% exact, 100.000% within 1 LSB, max 1
    random, uint8 / symmetric      outputs 99.991% / 99.806% exact, 99.997% / 99.987% within 1
    random, power2 scales          outputs 96.049% exact, 99.735% within 1 LSB, max 8: exact
                                   ties are common, and each one is a one-code difference
    every node on its own          99.807% exact, 100.000% within 1 LSB, max 1 (all schemes)
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.graph.ir import Graph
from ember import ort
from ember.flow import quantize_model
from quantizer.errors import QuantizeError
from quantizer.qdq import export_qdq
from quantizer.quantize import QuantOptions, quantize
from quantizer.reference import run_int8
from simulator import numerics
from tests.cli import DIGITS
from tests.onnx_builder import conv_bn_relu, model
from tests.quantizer.test_int8_ops import CASES, Case, _samples, case_graph
from tests.quantizer.util import profile_of

# --- measuring agreement --------------------------------------------------------------------


@dataclass
class Agreement:
    """Element counts of |onnxruntime code - integer reference code| over output tensors."""

    elements: int = 0
    exact: int = 0
    within_one: int = 0
    max_lsb: int = 0

    def add(self, diff: np.ndarray) -> None:
        diff = np.abs(np.asarray(diff, np.int64))
        self.elements += diff.size
        self.exact += int(np.count_nonzero(diff == 0))
        self.within_one += int(np.count_nonzero(diff <= 1))
        self.max_lsb = max(self.max_lsb, int(diff.max(initial=0)))

    def merge(self, other: "Agreement") -> None:
        self.elements += other.elements
        self.exact += other.exact
        self.within_one += other.within_one
        self.max_lsb = max(self.max_lsb, other.max_lsb)

    @property
    def exact_fraction(self) -> float:
        return self.exact / max(self.elements, 1)

    @property
    def within_one_fraction(self) -> float:
        return self.within_one / max(self.elements, 1)

    def __str__(self) -> str:
        return (f"{self.elements} elements: exact {100 * self.exact_fraction:.3f}%, within 1 LSB "
                f"{100 * self.within_one_fraction:.3f}%, max {self.max_lsb} LSB")


def _output_codes(qgraph: Graph) -> dict[str, str]:
    """Graph output → the integer value its DequantizeLinear reads (outputs computed in fp32
    have none)."""
    producers = qgraph.producers()
    return {out: producers[out].inputs[0] for out in qgraph.outputs
            if producers[out].op == "DequantizeLinear"}


def agreement(qgraph: Graph, proto: onnx.ModelProto, samples: Iterable[Mapping[str, np.ndarray]],
              session: onnxruntime.InferenceSession | None = None) -> Agreement:
    """Run the export on onnxruntime and the integer reference on the same samples."""
    session = session or ort.session(proto)
    codes = _output_codes(qgraph)
    result = Agreement()
    for feeds in samples:
        env = run_int8(qgraph, feeds, keep_all=True)
        got = ort.run(session, feeds)
        for out in qgraph.outputs:
            if out not in codes:  # a float output: the same fp32 arithmetic on both sides
                np.testing.assert_allclose(got[out], env[out], rtol=1e-5, atol=1e-6)
                continue
            t = qgraph.type_of(codes[out])
            # The export's output is DequantizeLinear of its integer code: exactly invertible.
            code = numerics.quantize(got[out], t.quant.scale[0], t.quant.zero_point[0],
                                     dtype=t.dtype)
            result.add(code.astype(np.int64) - env[codes[out]].astype(np.int64))
    return result


def node_agreement(qgraph: Graph, proto: onnx.ModelProto,
                   samples: Iterable[Mapping[str, np.ndarray]]) -> Agreement:
    """Every integer node whose integer inputs onnxruntime computed exactly as the reference
    did: its output codes against the reference's (the export's own error, not propagated).

    The export keeps the integer values' names, so each becomes an extra graph output.
    """
    exposed = onnx.ModelProto()
    exposed.CopyFrom(proto)
    integer = [name for name, value in qgraph.values.items()
               if not value.is_const and value.type.quant is not None]
    known = {o.name for o in exposed.graph.output}
    for name in integer:
        if name not in known:
            t = qgraph.type_of(name)
            exposed.graph.output.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), list(t.shape)))
    session = ort.session(exposed)
    result = Agreement()
    for feeds in samples:
        env = run_int8(qgraph, feeds, keep_all=True)
        got = ort.run(session, feeds)
        for node in qgraph.nodes:
            outs = [o for o in node.outputs if o in integer]
            ins = [i for i in node.inputs if i in integer]
            if node.op == "QuantizeLinear" or not outs or any(
                    not np.array_equal(got[i], env[i]) for i in ins):
                continue
            for out in outs:
                result.add(got[out].astype(np.int64) - env[out].astype(np.int64))
    return result


def _op_types(proto: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in proto.graph.node]


def _metadata(node: onnx.NodeProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in node.metadata_props}


# --- the digits CNN ---------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _digits() -> tuple[Graph, Graph, onnx.ModelProto]:
    proto = onnx.load(str(DIGITS / "model.onnx"))
    calib = np.load(DIGITS / "calib.npz")["input"]
    profile = profile_of(proto, ({"input": x[None]} for x in calib))
    quantized = quantize_model(proto, profile)
    return quantized.graph, quantized.qgraph, export_qdq(quantized.qgraph)


def _digits_eval() -> list[dict[str, np.ndarray]]:
    return [{"input": x[None]} for x in np.load(DIGITS / "eval.npz")["input"]]


def test_digits_export_agrees_with_the_integer_reference() -> None:
    """All 450 evaluation samples; measured: every logit code equal (100% exact)."""
    _, qgraph, proto = _digits()
    onnx.checker.check_model(proto, full_check=True)
    measured = agreement(qgraph, proto, _digits_eval())
    assert measured.elements == 4500
    assert measured.within_one_fraction >= 0.999, measured
    assert measured.exact_fraction >= 0.99, measured


def test_digits_export_fuses_into_onnxruntime_integer_kernels(tmp_path: Path) -> None:
    """At the extended level onnxruntime replaces the QDQ groups by QLinearConv and QGemm.

    On x86 CPUs without VNNI those u8s8 kernels saturate int16 pair sums (VPMADDUBSW) unless
    "session.x64quantprecision" is set (onnxruntime #12088): the weights span [-127, 127],
    not the 7-bit range onnxruntime's reduce_range gives them. With it, they agree with the
    integer reference code for code.
    """
    _, qgraph, proto = _digits()
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.add_session_config_entry("session.x64quantprecision", "1")
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(proto.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    fused = _op_types(onnx.load(str(tmp_path / "optimized.onnx")))
    assert "QLinearConv" in fused and "QGemm" in fused and "Conv" not in fused, fused
    measured = agreement(qgraph, proto, _digits_eval()[:150], session)
    assert measured.within_one_fraction >= 0.999, measured


def test_digits_names_types_and_metadata(tmp_path: Path) -> None:
    _, qgraph, _ = _digits()
    sqnr = {"relu1": 31.5, "logits": 24.25}
    path = tmp_path / "out" / "digits.qdq.onnx"
    proto = export_qdq(qgraph, path, sqnr, node_metadata={"conv2": {"cycles": 1234}})
    assert path.exists() and [p.name for p in path.parent.iterdir()] == [path.name]
    assert onnx.load(str(path)) == proto
    # Every integer activation keeps its name and its integer type.
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in list(proto.graph.value_info) + list(proto.graph.output)}
    for name, value in qgraph.values.items():
        if not value.is_const and value.type.quant is not None:
            assert types[name] == onnx.TensorProto.INT8, name
    nodes = {node.name: node for node in proto.graph.node}
    conv1 = _metadata(nodes["conv1"])
    relu1 = qgraph.type_of("relu1").quant
    assert conv1["precision"] == "int8" and conv1["sqnr_db"] == "31.50"
    assert float(conv1["scale"]) == relu1.scale[0]
    assert int(conv1["zero_point"]) == relu1.zero_point[0]
    assert _metadata(nodes["conv2"])["cycles"] == "1234"
    assert _metadata(nodes["fc"])["sqnr_db"] == "24.25"  # looked up by the ONNX name
    # Weights are int8 initializers, per output channel; biases int32.
    inits = {init.name: init for init in proto.graph.initializer}
    assert inits["conv1/W_bn"].data_type == onnx.TensorProto.INT8
    assert inits["conv1/bias"].data_type == onnx.TensorProto.INT32
    weight_dq = next(n for n in proto.graph.node if n.input and n.input[0] == "conv1/W_bn")
    assert weight_dq.op_type == "DequantizeLinear"
    assert helper.get_attribute_value(weight_dq.attribute[0]) == 0  # axis


def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    _, qgraph, _ = _digits()
    path = tmp_path / "digits.qdq.onnx"

    def fail(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(QuantizeError, match="digits.qdq.onnx: cannot write: disk full$"):
        export_qdq(qgraph, path)
    assert list(tmp_path.iterdir()) == []


# --- every operator the quantizer supports ----------------------------------------------------


def _case_export(case: Case, options: QuantOptions = QuantOptions()
                 ) -> tuple[Graph, onnx.ModelProto, list[dict[str, np.ndarray]]]:
    proto = model(case.nodes, case.inputs, case.outputs, case.inits, opset=case.opset)
    samples = _samples(case)
    qgraph = quantize(case_graph(case, proto), profile_of(proto, samples), options)
    return qgraph, export_qdq(qgraph), samples


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_operator_agrees_within_one_code(case: Case) -> None:
    """Measured: every case of test_int8_ops agrees exactly (affine int8 scales)."""
    qgraph, proto, samples = _case_export(case)
    measured = agreement(qgraph, proto, samples)
    assert measured.max_lsb <= 1, f"{case.id}: {measured}"
    assert measured.within_one_fraction == 1.0


@pytest.mark.parametrize("options", [
    QuantOptions(activation_dtype="uint8"),
    QuantOptions(symmetric_activations=True),
    QuantOptions(schema="power2", per_channel=False),
], ids=["uint8", "symmetric", "power2-per-tensor"])
def test_other_schemes_agree_within_one_code(options: QuantOptions) -> None:
    """uint8 and symmetric agree exactly (but for the cases that round twice); power2 differs
    by one code at exact ties."""
    total = Agreement()
    for case in CASES:
        qgraph, proto, samples = _case_export(case, options)
        measured = agreement(qgraph, proto, samples)
        assert measured.max_lsb <= 1, f"{case.id}: {measured}"
        if case.qdq_exact or options.schema != "affine":
            total.merge(measured)
    if options.schema == "affine":
        assert total.exact == total.elements, total
    else:
        assert total.exact_fraction >= 0.9, total


# --- clamps, Rescale, fp32 nodes --------------------------------------------------------------


def _normal(shape, count=8, seed=0, scale=1.0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal(shape) * scale).astype(np.float32)} for _ in range(count)]


def test_a_fused_relu_is_the_output_range_when_its_zero_point_is_the_lowest_code() -> None:
    proto = conv_bn_relu(channels=4, seed=3)
    samples = _normal((1, 3, 8, 8))
    qgraph = quantize_model(proto, profile_of(proto, samples)).qgraph
    conv = qgraph.node("conv")
    out = qgraph.type_of(conv.outputs[0]).quant
    # The Relu's output range starts at 0, so its zero point is -128 and QuantizeLinear's
    # saturation is the clamp: no Relu in the export.
    assert conv.attrs["qclamp"] == (-128, 127) and out.zero_point[0] == -128
    exported = export_qdq(qgraph)
    assert "Relu" not in _op_types(exported) and "Clip" not in _op_types(exported)
    assert agreement(qgraph, exported, samples).exact_fraction == 1.0


def _clamp_into_concat(clamp: str) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """Conv → Relu/Clip → Concat with a wider input: cleanup folds the Conv's Rescale into it,
    so the Conv writes the Concat's type, whose range is wider than the clamp's."""
    rng = np.random.default_rng(5)
    inits = {"w": rng.standard_normal((3, 2, 1, 1)).astype(np.float32),
             "lo": np.float32(-0.2), "hi": np.float32(0.5)}
    clamp_inputs = ["c"] if clamp == "Relu" else ["c", "lo", "hi"]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node(clamp, clamp_inputs, ["r"], name="clamp"),
             helper.make_node("Concat", ["r", "x"], ["y"], name="cat", axis=1)]
    proto = model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 5, 4, 4]}, inits)
    return proto, _normal((1, 2, 4, 4), scale=3.0)


@pytest.mark.parametrize("clamp", ["Relu", "Clip"])
def test_a_fused_clamp_inside_the_output_range_is_kept_and_needed(clamp: str) -> None:
    proto, samples = _clamp_into_concat(clamp)
    qgraph = quantize(import_model(proto), profile_of(proto, samples))
    conv = qgraph.node("conv")
    params = qgraph.type_of(conv.outputs[0]).quant
    assert params == qgraph.type_of("y/q").quant  # the Conv writes the Concat's type
    lo, hi = conv.attrs["qclamp"]
    assert lo == params.zero_point[0] > -128 if clamp == "Relu" else lo > -128 and hi < 127
    exported = export_qdq(qgraph)
    assert _op_types(exported).count(clamp) == 1
    node = next(n for n in exported.graph.node if n.op_type == clamp)
    assert _metadata(node)["qclamp"] == f"[{lo}, {hi}]"
    if clamp == "Clip":  # the bounds are the clamp codes' real values
        inits = {i.name: onnx.numpy_helper.to_array(i) for i in exported.graph.initializer}
        for bound, code in zip(node.input[1:], (lo, hi)):
            assert inits[bound] == np.float32((code - params.zero_point[0]) * params.scale[0])
    assert agreement(qgraph, exported, samples).exact_fraction == 1.0
    # Without it, the convolution outputs the clamp removed come back.
    bypassed = onnx.ModelProto()
    bypassed.CopyFrom(exported)
    for other in bypassed.graph.node:
        other.input[:] = [node.input[0] if n == node.output[0] else n for n in other.input]
    assert agreement(qgraph, bypassed, samples).max_lsb > 1


def test_a_fused_clip_wider_than_the_output_range_is_its_saturation() -> None:
    case = next(c for c in CASES if c.id == "Gemm-Clip-fused")
    qgraph, proto, samples = _case_export(case)
    assert "Clip" not in _op_types(proto)
    assert agreement(qgraph, proto, samples).exact_fraction == 1.0


def test_rescale_is_a_dequantize_quantize_pair() -> None:
    case = next(c for c in CASES if c.id == "Concat-rescale")
    qgraph, proto, samples = _case_export(case)
    rescale = next(n for n in qgraph.nodes if n.op == "Rescale")
    q = next(n for n in proto.graph.node if n.name == rescale.name)
    assert q.op_type == "QuantizeLinear" and q.output[0] == rescale.outputs[0]
    producer = next(n for n in proto.graph.node if q.input[0] in n.output)
    assert producer.op_type == "DequantizeLinear" and producer.input[0] == rescale.inputs[0]
    assert _metadata(q)["ember_op"] == "Rescale"


def test_a_silu_written_out_exports_as_exporters_write_it() -> None:
    """x * Sigmoid(x) fuses into Swish (one table); ONNX has Swish only from opset 24, so the
    export (opset 21) writes it back as Sigmoid and Mul, and onnxruntime runs it within one
    code of the integer reference."""
    from ember.flow import optimized_graph
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["g"], name="gate"),
             helper.make_node("Mul", ["c", "g"], ["y"], name="silu")]
    rng = np.random.default_rng(3)
    proto = model(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 4, 6, 6]},
                  {"w": rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)})
    graph = optimized_graph(proto)
    assert "Swish" in [n.op for n in graph.nodes]
    samples = [{"x": rng.normal(0, 1, (1, 3, 6, 6)).astype(np.float32)} for _ in range(4)]
    qgraph = quantize(graph, profile_of(proto, samples, graph))
    exported = export_qdq(qgraph)
    ops = [n.op_type for n in exported.graph.node]
    assert "Swish" not in ops and "Sigmoid" in ops
    assert agreement(qgraph, exported, samples).max_lsb <= 1


def test_nodes_kept_in_fp32_are_copied_and_marked() -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Div", ["c", "d"], ["q"], name="divide"),
             helper.make_node("Relu", ["q"], ["y"], name="relu")]
    rng = np.random.default_rng(2)
    proto = model(nodes, {"x": [1, 2, 5, 5]}, {"y": [1, 3, 5, 5]},
                  {"w": rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
                   "d": np.float32(3.0)})
    samples = _normal((1, 2, 5, 5))
    qgraph = quantize(import_model(proto), profile_of(proto, samples),
                      QuantOptions(keep_fp32=("divide",)))
    exported = export_qdq(qgraph)
    divide = next(n for n in exported.graph.node if n.name == "divide")
    assert divide.op_type == "Div" and _metadata(divide)["precision"] == "fp32"
    assert agreement(qgraph, exported, samples).within_one_fraction == 1.0


# --- random graphs ----------------------------------------------------------------------------

Pick = Callable[[int, int], int]  # an integer in [lo, hi], from hypothesis or from a seed


def random_model(pick: Pick) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """A random chain with skip connections of 4-D operators, then optionally a dense tail.

    Every shape is tracked so that each drawn operator is valid where it is placed; Add and
    Concat read an earlier tensor of a fitting shape, so the graph is a DAG, not a chain.
    """
    rng = np.random.default_rng(pick(0, 2**16))
    channels, height, width = pick(1, 4), pick(3, 9), pick(3, 9)
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple[int, ...]] = {"x": (1, channels, height, width)}
    current = "x"

    def add(op: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> None:
        nonlocal current
        name = f"t{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [name], name=f"{op.lower()}{len(nodes)}",
                                      **attrs))
        shapes[name] = shape
        current = name

    def const(array: np.ndarray) -> str:
        name = f"k{len(inits)}"
        inits[name] = np.asarray(array)
        return name

    def window(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
        return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1

    for _ in range(pick(1, 5)):
        n, c, h, w = shapes[current]
        choice = pick(0, 12)
        if choice == 0:  # Conv
            divisors = sorted({g for g in (1, 2, c) if c % g == 0})
            groups = divisors[pick(0, len(divisors) - 1)]
            out = groups * pick(1, 3)
            kernel, stride, pad, dilation = pick(1, 3), pick(1, 2), pick(0, 1), pick(1, 2)
            pad = min(pad, kernel - 1)
            oh, ow = (window(s, kernel, stride, pad, dilation) for s in (h, w))
            if oh < 1 or ow < 1:
                continue
            weight = rng.standard_normal((out, c // groups, kernel, kernel)).astype(np.float32)
            inputs = [current, const((weight / np.sqrt(weight[0].size)).astype(np.float32))]
            if pick(0, 1):
                inputs.append(const(rng.standard_normal(out).astype(np.float32) * 0.3))
            add("Conv", inputs, (n, out, oh, ow), kernel_shape=[kernel, kernel],
                strides=[stride, stride], pads=[pad] * 4, dilations=[dilation, dilation],
                group=groups)
        elif choice == 1:
            add("Relu", [current], shapes[current])
        elif choice == 2:
            lo, hi = -0.1 * pick(0, 10), 0.2 * pick(1, 10)
            add("Clip", [current, const(np.float32(lo)), const(np.float32(hi))],
                shapes[current])
        elif choice in (3, 4):  # MaxPool, AveragePool
            kernel, stride = pick(1, 3), pick(1, 2)
            pad = pick(0, kernel // 2)
            if min(h, w) + 2 * pad < kernel:
                continue
            attrs = {"kernel_shape": [kernel, kernel], "strides": [stride, stride],
                     "pads": [pad] * 4}
            if choice == 4:
                attrs["count_include_pad"] = pick(0, 1)
            add("MaxPool" if choice == 3 else "AveragePool", [current],
                (n, c, window(h, kernel, stride, pad), window(w, kernel, stride, pad)), **attrs)
        elif choice in (5, 6):  # Add / Mul / Sub with an earlier tensor or a constant
            op = ("Add", "Mul", "Sub")[pick(0, 2)]
            same = [t for t, s in shapes.items() if s == shapes[current] and t != current]
            if same and pick(0, 1):
                other = same[pick(0, len(same) - 1)]
            else:
                other = const(rng.standard_normal((1, c, 1, 1)).astype(np.float32))
            add(op, [current, other], shapes[current])
        elif choice == 7:  # Concat with an earlier tensor of the same spatial size
            fits = [t for t, s in shapes.items() if s[2:] == (h, w) and len(s) == 4]
            other = fits[pick(0, len(fits) - 1)]
            add("Concat", [current, other], (n, c + shapes[other][1], h, w), axis=1)
        elif choice == 8:
            op = ("Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish")[pick(0, 4)]
            add(op, [current], shapes[current])
        elif choice == 9:
            pads = [0, 0, pick(0, 1), pick(0, 1), 0, 0, pick(0, 1), pick(0, 1)]
            add("Pad", [current, const(np.array(pads, np.int64)),
                        const(np.float32(0.1 * pick(-5, 5)))],
                (n, c, h + pads[2] + pads[6], w + pads[3] + pads[7]))
        elif choice == 10:
            add("Transpose", [current], (n, c, w, h), perm=[0, 1, 3, 2])
        elif choice == 11:  # data movement: nearest Resize up, or a Slice of the plane
            if max(h, w) <= 5 and pick(0, 1):
                add("Resize", [current, "", const(np.array([1, 1, 2, 2], np.float32))],
                    (n, c, 2 * h, 2 * w), mode="nearest")
            elif h > 1:
                add("Slice", [current, const(np.array([1], np.int64)),
                              const(np.array([h], np.int64)), const(np.array([2], np.int64))],
                    (n, c, h - 1, w))
        else:
            op = ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean")[pick(0, 2)]
            attrs = {"axes": [2, 3], "keepdims": 1} if op == "ReduceMean" else {}
            add(op, [current], (n, c, 1, 1), **attrs)
    outputs = {current: shapes[current]}
    if pick(0, 1):  # a dense tail
        features = int(np.prod(shapes[current][1:]))
        if pick(0, 1):
            add("Flatten", [current], (1, features))
        else:
            add("Reshape", [current, const(np.array([1, -1], np.int64))], (1, features))
        for _ in range(pick(1, 2)):
            units, trans = pick(2, 8), pick(0, 1)
            weight = rng.standard_normal((features, units)).astype(np.float32)
            weight = (weight / np.sqrt(features)).astype(np.float32)
            if pick(0, 2) == 0:
                add("MatMul", [current, const(weight)], (1, units))
            else:
                inputs = [current, const(weight.T.copy() if trans else weight)]
                if pick(0, 1):
                    inputs.append(const(rng.standard_normal(units).astype(np.float32) * 0.3))
                add("Gemm", inputs, (1, units), transB=trans)
            features = units
            if pick(0, 1):
                add("Relu", [current], (1, units))
        if pick(0, 1):
            add(("Softmax", "LogSoftmax")[pick(0, 1)], [current], (1, features), axis=-1)
        outputs = {current: shapes[current]}
    if pick(0, 3) == 0 and len(nodes) > 1:  # an intermediate tensor as a second output
        outputs.setdefault(nodes[0].output[0], shapes[nodes[0].output[0]])
    proto = model(nodes, {"x": list(shapes["x"])}, {k: list(v) for k, v in outputs.items()},
                  inits)
    scale = 0.5 * pick(1, 6)
    samples = [{"x": (rng.standard_normal(shapes["x"]) * scale).astype(np.float32)}
               for _ in range(6)]
    return proto, samples


SCHEMES = (QuantOptions(), QuantOptions(activation_dtype="uint8"),
           QuantOptions(symmetric_activations=True),
           QuantOptions(schema="power2", per_channel=False))


@dataclass
class Measured:
    scheme: str
    outputs: Agreement
    nodes: Agreement


def _scheme_name(options: QuantOptions) -> str:
    if options.schema == "power2":
        return "power2"
    if options.symmetric_activations:
        return "symmetric"
    return options.activation_dtype


def check_random(pick: Pick, local: bool = False) -> Measured | None:
    """Quantize a random graph (under a drawn scheme), export it, and compare outputs (and,
    with `local`, each node's own error); None when it cannot be quantized."""
    proto, samples = random_model(pick)
    options = SCHEMES[pick(0, len(SCHEMES) - 1)] if pick(0, 1) else SCHEMES[0]
    if not proto.graph.node:
        return None
    try:
        qgraph = quantize_model(proto, profile_of(proto, samples), options).qgraph
    except QuantizeError:
        return None  # a degenerate range (an all-zero activation): not the export's concern
    if _float_noise(qgraph):
        return None
    exported = export_qdq(qgraph)
    return Measured(_scheme_name(options), agreement(qgraph, exported, samples),
                    node_agreement(qgraph, exported, samples) if local else Agreement())


def _float_noise(qgraph: Graph) -> bool:
    """Whether an activation's range is float32 rounding noise: a scale 2^-20 below the
    largest. (Transpose(x) - x averaged over its plane is exactly 0 in integers, but about 1e-9
    in float32, and the profile calibrates that noise to a scale of 1e-10; no float runtime
    reproduces such a tensor, and the integer reference rightly gives its zero point.)"""
    scales = [value.type.quant.scale[0] for value in qgraph.values.values()
              if not value.is_const and value.type.quant is not None]
    return bool(scales) and min(scales) < 2.0**-20 * max(scales)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_random_graphs_agree_with_the_integer_reference(data) -> None:
    """Each node is within 1 LSB of the reference whenever its inputs agree. The graph's
    outputs can differ by more: a one-code difference early on grows through later gains
    (measured: 3 LSB at most over 2000 graphs), so they are held to the aggregate target."""
    measured = check_random(lambda lo, hi: data.draw(st.integers(lo, hi)), local=True)
    assume(measured is not None)
    assert measured.nodes.max_lsb <= 1, measured
    assert measured.nodes.elements > 0 and measured.outputs.elements > 0


def test_random_graphs_agree_in_aggregate() -> None:
    """Seeded random graphs: the issue's target, at least 99.9% of output elements within
    1 LSB, for affine scales. Power-of-two scales put many results exactly on a half step,
    where the integer path rounds away from zero and QuantizeLinear to even; each such node is
    still within 1 LSB, but more of those differences reach the outputs and grow there."""
    results, graphs = measure(60)
    assert graphs >= 50
    for scheme, found in results.items():
        target = 0.99 if scheme in ("power2", "all") else 0.999
        assert found.outputs.within_one_fraction >= target, (scheme, found.outputs)
    assert results["int8"].outputs.exact_fraction >= 0.999, results["int8"].outputs


def measure(count: int, seed: int = 0, local: bool = False
            ) -> tuple[dict[str, Measured], int]:
    """Agreement over `count` seeded random graphs by scheme and in total ("all"): outputs,
    and each node on its own with `local`; and how many of the graphs were quantizable."""
    found: dict[str, Measured] = {}
    graphs = 0
    for k in range(count):
        rng = np.random.default_rng([seed, k])
        measured = check_random(lambda lo, hi: int(rng.integers(lo, hi + 1)), local)
        if measured is None:
            continue
        graphs += 1
        for key in (measured.scheme, "all"):
            into = found.setdefault(key, Measured(key, Agreement(), Agreement()))
            into.outputs.merge(measured.outputs)
            into.nodes.merge(measured.nodes)
    return found, graphs


if __name__ == "__main__":
    _, digits_q, digits_proto = _digits()
    print("digits (450 eval samples, ORT basic):", agreement(digits_q, digits_proto,
                                                             _digits_eval()))
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    results, graphs = measure(count, int(sys.argv[2]) if len(sys.argv) > 2 else 0, True)
    print(f"random graphs: {graphs} of {count} quantizable")
    for key, found in sorted(results.items()):
        print(f"  {key:9} outputs: {found.outputs}")
        print(f"  {'':9} nodes:   {found.nodes}")
