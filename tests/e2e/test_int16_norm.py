"""int16 through LayerNorms: a LayerNorm's output named int16 (`QuantOptions.int16_tensors`) is
written int16 (LAYERNORM out_wide) and the Gemm it feeds streams both planes; it is smoothed
as its int8 form would be (SmoothQuant moves outlier channels into the readers' weights, whose
int8 codes would otherwise weigh them up), under the smoothed name; a LayerNorm reads an int16
input that is a tensor of its own (LAYERNORM wide). Bit-exact; the output closer to fp32; what
the unit cannot do refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from ember.flow import CompileOptions, compile_model, optimized_graph, quantize_model
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from simulator import isa
from tests.e2e.flow import check_bit_exact, value_sqnr_db
from tests.e2e.test_wide_residual import C, S, carried_stream, samples, wide_values
from tests.onnx_builder import model
from tests.quantizer.util import profile_of


def _quantized(proto, names, feeds=None):
    profile = profile_of(proto, feeds or samples(8, 0), optimized_graph(proto))
    return quantize_model(proto, profile, QuantOptions(int16_tensors=tuple(names))).qgraph


def test_a_named_norm_output_is_smoothed_and_int16() -> None:
    """y feeds a Gemm and is carried into the next sum: the sum's copy (norm/wide) is int16 as
    before, and y named int16 is smoothed as its int8 form would be (channel 5, 30 times the
    others, moved into the Gemm's weights), under the smoothed name, int16; the Gemm's output
    is no worse than int8 y's."""
    proto = carried_stream()
    graph = optimized_graph(proto)
    auto = _quantized(proto, ())
    named = _quantized(proto, ("y",))
    assert {"y/smooth", "y/wide"} <= set(wide_values(named))
    assert [n.name for n in named.nodes if n.op == "LayerNormalization"] == \
        [n.name for n in auto.nodes if n.op == "LayerNormalization"] == \
        ["norm/smooth", "norm/wide", "norm2"]
    gemm = next(n for n in named.nodes if n.op in ("Gemm", "MatMul"))
    assert named.type_of(gemm.inputs[0]).dtype == "int16" and gemm.inputs[1] == "w/smooth"
    test = samples(4, 9)
    assert value_sqnr_db(graph, named, "p", test, stored=False) >= \
        value_sqnr_db(graph, auto, "p", test, stored=False)


def test_an_int16_norm_output_is_closer_to_fp32() -> None:
    """The norm's output int16 (and the sum it reads): its own rounding far below int8's, and
    its error from the input on closer to fp32 (by less: the int8 model input's error
    remains). A norm without outlier channels: none to smooth either way."""
    proto = _norm_after("plain")
    feeds = _feeds(8, 0)
    graph = optimized_graph(proto)
    int8 = _quantized(proto, (), feeds)
    wide = _quantized(proto, ("m", "m2", "s", "n"), feeds)
    assert [n.name for n in int8.nodes if n.op == "LayerNormalization"] == ["norm"]
    test = feeds  # the calibration data itself: no clipping, only each type's rounding
    assert value_sqnr_db(graph, wide, "n", test) > value_sqnr_db(graph, int8, "n", test) + 40
    assert value_sqnr_db(graph, wide, "n", test, stored=False) > \
        value_sqnr_db(graph, int8, "n", test, stored=False) + 3  # the int8 input a's error


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_a_named_norm_output_runs_bit_exactly(preset: str) -> None:
    proto = carried_stream()
    profile = profile_of(proto, samples(8, 0), optimized_graph(proto))
    built = compile_model(proto, profile,
                          CompileOptions(quant=QuantOptions(int16_tensors=("y",))), preset)
    norms = [i for i in built.compiled.program.instructions if i.op is isa.LAYERNORM]
    # norm/smooth (int16 now), norm/wide (the sum's copy), norm2
    assert [(i.args["wide"], i.args["out_wide"]) for i in norms] == [(1, 1), (1, 1), (1, 0)]
    assert built.compiled.program.host_segments == ()
    check_bit_exact(built.qgraph, built.compiled, samples(2, 1))


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_a_norm_reads_an_int16_reshape_of_a_gemm_output(preset: str) -> None:
    """m int16, read by the norm through a Reshape (its rows in the Gemm's order): LAYERNORM
    reads both planes through the View, bit-exact, no host segment."""
    proto = _norm_after("view")
    profile = profile_of(proto, _feeds(8, 0), optimized_graph(proto))
    built = compile_model(proto, profile,
                          CompileOptions(quant=QuantOptions(int16_tensors=("m",))), preset)
    norms = [i for i in built.compiled.program.instructions if i.op is isa.LAYERNORM]
    assert {(i.args["wide"], i.args["out_wide"]) for i in norms} == {(1, 0)}
    assert built.compiled.program.host_segments == ()
    check_bit_exact(built.qgraph, built.compiled, _feeds(2, 1))


def _feeds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"a": rng.normal(0, 1, (1, S, C)).astype(np.float32)} for _ in range(count)]


def _norm_after(kind: str):
    """a [1, S, C] -> MatMul -> m; with kind "view" m -> Reshape [S, C] -> LayerNorm -> y
    (the norm reads a view of m, its rows in order); with "transpose" m -> Transpose -> y
    (its rows strided); with "concat" LayerNorm(m) -> n, Concat(n, a) -> y; with "plain"
    LayerNorm(m + a @ w3) -> n, n -> MatMul -> y."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.normal(0, C ** -0.5, (C, C)).astype(np.float32),
             "gamma": np.ones(C, np.float32), "beta": np.zeros(C, np.float32),
             "flat": np.array([S, C], np.int64)}
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"], name="dense")]
    if kind == "view":
        nodes += [helper.make_node("Reshape", ["m", "flat"], ["f"], name="flatten"),
                  helper.make_node("LayerNormalization", ["f", "gamma", "beta"], ["y"],
                                   name="norm")]
        out = [S, C]
    elif kind == "transpose":
        inits.update(gamma=np.ones(S, np.float32), beta=np.zeros(S, np.float32))
        nodes += [helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 1], name="turn"),
                  helper.make_node("LayerNormalization", ["t", "gamma", "beta"], ["y"],
                                   name="norm")]
        out = [1, C, S]
    elif kind == "plain":
        inits["w2"] = rng.normal(0, C ** -0.5, (C, C)).astype(np.float32)
        inits["w3"] = rng.normal(0, C ** -0.5, (C, C)).astype(np.float32)
        nodes += [helper.make_node("MatMul", ["a", "w3"], ["m2"], name="dense3"),
                  helper.make_node("Add", ["m", "m2"], ["s"], name="residual"),
                  helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["n"],
                                   name="norm"),
                  helper.make_node("MatMul", ["n", "w2"], ["y"], name="dense2")]
        out = [1, S, C]
    else:
        nodes += [helper.make_node("LayerNormalization", ["m", "gamma", "beta"], ["n"],
                                   name="norm"),
                  helper.make_node("Concat", ["n", "a"], ["y"], name="join", axis=1)]
        out = [1, 2 * S, C]
    return model(nodes, {"a": [1, S, C]}, {"y": out}, inits, opset=17)


@pytest.mark.parametrize("kind, name, says", [
    ("transpose", "m", "read by LayerNormalization 'norm'"),
    ("concat", "n", "made by LayerNormalization 'norm'"),
])
def test_what_the_unit_cannot_do_is_refused_in_one_line(kind: str, name: str, says: str) -> None:
    proto = _norm_after(kind)
    with pytest.raises(QuantizeError) as caught:
        _quantized(proto, (name,), _feeds(4, 0))
    message = str(caught.value)
    assert "\n" not in message and "int16 tensor" in message and repr(name) in message and \
        says in message
