"""Attention on the accelerator: MatMuls of two activations on the array (one operand the
stationary tile, both zero points subtracted by the array's offsets), Kᵀ by a corner-turning
LOAD, the heads' merge written in place, the score scale folded into the query weights, and
the masked softmax over row-major scores. Each runs bit-exactly with no host segment (and
with --allow-host, around the nodes kept in fp32)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.backend.program import BackendOptions
from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fold_scale import fold_scale
from ember import ort
from ember.compare import max_relative_error
from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.options import QuantOptions
from simulator import isa
from tests.cli import assert_one_line_error, invoke
from tests.e2e.flow import check_bit_exact, compile_and_check, samples
from tests.e2e.test_products import product as broadcast_product
from tests.onnx_builder import model, weights
from tests.quantizer.util import profile_of


def attention(s: int = 8, d: int = 16, heads: int = 2, batch: int = 1, seed: int = 0,
              divide: bool = False, bias: bool = False, mask: tuple | None = None,
              computed_mask: bool = False, causal: bool = False, softmax_axis: int = -1):
    """A multi-head attention block: QKV projections by constant weights (with bias Adds),
    heads split by Reshape/Transpose, Q·Kᵀ scaled by 1/√Dh (or divided by √Dh) plus a float
    mask input [B, 1, 1, S], Softmax, P·V, heads merged by Transpose/Reshape, the output
    projection and the residual Add. `mask`: the mask's shape, [B, 1, 1, S] unless given;
    with `computed_mask` it is computed from an input `keep` [B, S] as BERT exports do:
    (1 - Unsqueeze(keep)) * -10; with `causal` it is a constant [1, 1, S, S], -10 above the
    diagonal. `softmax_axis`: the axis the Softmax normalizes."""
    rng = np.random.default_rng(seed)
    dh = d // heads
    nodes, inits = [], {}
    for name in ("q", "k", "v", "o"):
        inits[f"w{name}"] = weights(rng, d, d, scale=d ** -0.5)
    inits["heads"] = np.array([batch, s, heads, dh], np.int64)
    inits["merged"] = np.array([batch, s, d], np.int64)
    inits["scale"] = np.float32(dh ** 0.5 if divide else dh ** -0.5)
    for name in ("q", "k", "v"):
        projected = f"{name}p"
        nodes.append(helper.make_node("MatMul", ["x", f"w{name}"], [projected],
                                      name=f"proj_{name}"))
        if bias:
            inits[f"b{name}"] = weights(rng, d, scale=0.1)
            nodes.append(helper.make_node("Add", [projected, f"b{name}"], [f"{name}b"],
                                          name=f"bias_{name}"))
            projected = f"{name}b"
        nodes.append(helper.make_node("Reshape", [projected, "heads"], [f"{name}r"],
                                      name=f"split_{name}"))
    nodes += [helper.make_node("Transpose", ["qr"], ["qh"], perm=[0, 2, 1, 3], name="heads_q"),
              helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 2, 3, 1], name="heads_k"),
              helper.make_node("Transpose", ["vr"], ["vh"], perm=[0, 2, 1, 3], name="heads_v"),
              helper.make_node("MatMul", ["qh", "kt"], ["scores"], name="qk"),
              helper.make_node("Div" if divide else "Mul", ["scores", "scale"], ["scaled"],
                               name="scale_scores"),
              helper.make_node("Add", ["scaled", "mask"], ["masked"], name="add_mask"),
              helper.make_node("Softmax", ["masked"], ["p"], axis=softmax_axis, name="softmax"),
              helper.make_node("MatMul", ["p", "vh"], ["ctx"], name="pv"),
              helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3], name="merge_t"),
              helper.make_node("Reshape", ["ctxt", "merged"], ["ctxm"], name="merge"),
              helper.make_node("MatMul", ["ctxm", "wo"], ["o"], name="proj_o"),
              helper.make_node("Add", ["x", "o"], ["y"], name="residual")]
    inputs = {"x": [batch, s, d], "mask": list(mask or (batch, 1, 1, s))}
    if causal:
        del inputs["mask"]
        inits["mask"] = (np.triu(np.ones((s, s)), 1) * -10.0).astype(np.float32)[None, None]
    if computed_mask:
        del inputs["mask"]
        inputs["keep"] = [batch, s]
        inits.update(axes=np.array([1, 2], np.int64), one=np.float32(1.0),
                     drop_value=np.float32(-10.0))
        nodes[:0] = [helper.make_node("Unsqueeze", ["keep", "axes"], ["keep4"], name="unsqueeze"),
                     helper.make_node("Sub", ["one", "keep4"], ["drop"], name="invert"),
                     helper.make_node("Mul", ["drop", "drop_value"], ["mask"], name="mask_scale")]
    return model(nodes, inputs, {"y": [batch, s, d]}, inits)


def product(a_shape, b_shape, transpose_b: bool = False, seed: int = 0):
    """Two activations (each a MatMul of its own input by a constant; rank 4 split from rank 3
    by a Reshape) multiplied; with transpose_b, b is stored with its last two axes swapped and
    a Transpose swaps them back (as Kᵀ)."""
    rng = np.random.default_rng(seed)
    nodes, inits, inputs = [], {}, {}
    stored_b = list(b_shape[:-2]) + [b_shape[-1], b_shape[-2]] if transpose_b else list(b_shape)
    for name, shape in (("a", list(a_shape)), ("b", stored_b)):
        inits[f"w{name}"] = weights(rng, 4, shape[-1])
        flat = [shape[0] * shape[1], *shape[2:]] if len(shape) == 4 else shape
        inputs[name] = flat[:-1] + [4]
        projected = f"{name}f" if len(shape) == 4 else f"{name}p"
        nodes.append(helper.make_node("MatMul", [name, f"w{name}"], [projected],
                                      name=f"proj_{name}"))
        if len(shape) == 4:
            inits[f"{name}shape"] = np.array(shape, np.int64)
            nodes.append(helper.make_node("Reshape", [projected, f"{name}shape"], [f"{name}p"],
                                          name=f"heads_{name}"))
    b = "bp"
    if transpose_b:
        perm = list(range(len(b_shape)))
        perm[-2:] = perm[-1], perm[-2]
        nodes.append(helper.make_node("Transpose", ["bp"], ["bt"], perm=perm, name="turn"))
        b = "bt"
    nodes.append(helper.make_node("MatMul", ["ap", b], ["y"], name="product"))
    out = [*np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])), a_shape[-2],
           b_shape[-1]]
    return model(nodes, inputs, {"y": out}, inits)


PRODUCTS = {
    "rank 2": ((5, 20), (20, 7), False),
    "rank 2, Bᵀ": ((5, 20), (20, 7), True),
    "rank 3, Bᵀ, K above the array": ((2, 9, 40), (2, 40, 19), True),
    "rank 4 heads": ((2, 3, 9, 12), (2, 3, 12, 19), False),
    "rank 4, Kᵀ": ((1, 2, 40, 8), (1, 2, 8, 40), True),
    "rank 4, broadcast heads": ((2, 1, 5, 8), (2, 3, 8, 6), False),
}


@pytest.mark.parametrize("preset", ["edge", "default"])
@pytest.mark.parametrize("form", PRODUCTS)
def test_activation_matmul_runs_on_the_array_bit_exactly(form: str, preset: str) -> None:
    a_shape, b_shape, transpose_b = PRODUCTS[form]
    compiled, _ = compile_and_check(product(a_shape, b_shape, transpose_b), preset)
    program = compiled.program
    assert program.host_segments == ()
    product_insns = [i for i in program.instructions if i.op is isa.COMPUTE and i.args["x_offset"]]
    assert product_insns, "the activation MatMul streams its rows less a's zero point"
    turned = [i for i in program.instructions if i.op is isa.LOAD and i.args["transpose"]]
    assert bool(turned) == transpose_b  # a Transpose before the MatMul is a corner turn


def gemm(trans_a: int, trans_b: int, seed: int = 0):
    """Gemm of two activations (each a MatMul of its own input), transposed as the flags say."""
    rng = np.random.default_rng(seed)
    a_shape, b_shape = ((20, 6) if trans_a else (6, 20)), ((9, 20) if trans_b else (20, 9))
    nodes = [helper.make_node("MatMul", [n, f"w{n}"], [f"{n}p"], name=f"proj_{n}")
             for n in "ab"]
    nodes.append(helper.make_node("Gemm", ["ap", "bp"], ["y"], alpha=0.5, transA=trans_a,
                                  transB=trans_b, name="product"))
    return model(nodes, {"a": [a_shape[0], 4], "b": [b_shape[0], 4]}, {"y": [6, 9]},
                 {"wa": weights(rng, 4, a_shape[1]), "wb": weights(rng, 4, b_shape[1])})


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_of_two_activations_runs_on_the_array_bit_exactly(trans_a: int, trans_b: int):
    compiled, _ = compile_and_check(gemm(trans_a, trans_b), "edge")
    assert compiled.program.host_segments == ()
    turned = [i for i in compiled.program.instructions if i.op is isa.LOAD and i.args["transpose"]]
    assert bool(turned) == bool(trans_a or trans_b)


BROADCAST_SUMS = {  # the forms products take (tests.e2e.test_products.FORMS), summed
    "gate first": ((2, 10, 3, 3), (2, 10, 1, 1), True),
    "scalar activation": ((2, 10, 3, 4), (2, 1, 1, 1), False),
    "per pixel": ((1, 10, 3, 4), (1, 1, 3, 4), True),
    "one value per channel for the batch": ((2, 10, 3, 4), (1, 10, 1, 1), False),
}


@pytest.mark.parametrize("op", ["Add", "Sub"])
@pytest.mark.parametrize("form", BROADCAST_SUMS)
def test_sum_of_a_broadcast_activation_bit_exact(form: str, op: str) -> None:
    """ADD with b_once/b_splat sums (and Sub subtracts, either operand broadcast) as MUL
    multiplies, on the accelerator."""
    a_shape, b_shape, swap = BROADCAST_SUMS[form]
    compiled, _ = compile_and_check(broadcast_product(a_shape, b_shape, op, swap), "edge")
    assert compiled.program.host_segments == ()
    assert any(i.op is isa.ADD for i in compiled.program.instructions)


ATTENTION = {  # (S, D, heads, batch): S below and above the lanes (8, 16, 32)
    "edge S=8 H=2": ("edge", 8, 16, 2, 1),
    "edge S=20 H=4": ("edge", 20, 32, 4, 1),
    "default S=24 H=4 B=2": ("default", 24, 32, 4, 2),
    "default S=12 H=2": ("default", 12, 16, 2, 1),
    "large S=40 H=2": ("large", 40, 32, 2, 1),
    "large S=8 H=4": ("large", 8, 16, 4, 1),
    "default S=20 H=4, biases, Div": ("default", 20, 32, 4, 1, dict(bias=True, divide=True)),
    "edge S=12 H=2 B=2, a mask per query row": ("edge", 12, 16, 2, 2, dict(mask=(2, 1, 12, 12))),
    "edge S=12 H=2 B=2, one mask for the batch": ("edge", 12, 16, 2, 2, dict(mask=(1, 1, 1, 12))),
    "default S=12 H=2 B=2, a computed mask": ("default", 12, 16, 2, 2, dict(computed_mask=True)),
    "edge S=12 H=2 B=2, a constant causal mask": ("edge", 12, 16, 2, 2, dict(causal=True)),
    "edge S=12 H=2, Softmax over the query rows": ("edge", 12, 16, 2, 1, dict(softmax_axis=2)),
}


@pytest.mark.parametrize("kept", [(), ("qk",), ("pv",), ("heads_k",), ("merge_t",)])
def test_attention_with_nodes_kept_on_the_host_stays_bit_exact(kept: tuple) -> None:
    """With --allow-host and nodes kept in fp32, a host segment reads the strided views the
    MatMuls read (Kᵀ, the heads) and writes what they wrote in place, at their strides; the
    output projection after a P·V on the host copies the context, written row-major, into
    the order it reads (a strided copy) and stays on the accelerator."""
    proto = attention(12, 16, 2, 1)
    shapes = {"x": [1, 12, 16], "mask": [1, 1, 1, 12]}
    profile = profile_of(proto, samples(shapes, 8), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(QuantOptions(keep_fp32=kept),
                                                         BackendOptions(allow_host=True)), "edge")
    assert len(built.compiled.program.host_segments) == (1 if kept else 0) + \
        (kept in (("qk",), ("heads_k",)))
    check_bit_exact(built.qgraph, built.compiled, samples(shapes, 2, 1))


@pytest.mark.parametrize("options", [QuantOptions(activation_dtype="uint8"),
                                     QuantOptions(symmetric_activations=True)],
                         ids=["uint8", "symmetric"])
def test_attention_with_other_activation_codes_stays_bit_exact(options) -> None:
    """uint8 codes (offset to int8) and zero points of 0 reach the array's offsets too."""
    proto = attention(12, 16, 2, 1)
    shapes = {"x": [1, 12, 16], "mask": [1, 1, 1, 12]}
    profile = profile_of(proto, samples(shapes, 8), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(options), "default")
    assert built.compiled.program.host_segments == ()
    check_bit_exact(built.qgraph, built.compiled, samples(shapes, 2, 1))


@pytest.mark.parametrize("divide", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_the_score_scale_folds_into_the_query_weights(divide: bool, bias: bool) -> None:
    """Mul by 1/√Dh (or Div by √Dh) of Q·Kᵀ moves into Q's projection (weight, bias), through
    the heads' Reshape and Transpose: no node is left for it, the product takes its output's
    name, and the fp32 function stays onnxruntime's."""
    proto = attention(8, 16, 2, 1, divide=divide, bias=bias)
    graph = fold_constants(import_model(proto))
    after = fold_scale(graph)
    assert len(after.nodes) == len(graph.nodes) - 1
    assert "scale_scores" not in {n.name for n in after.nodes}
    assert next(n for n in after.nodes if n.name == "qk").outputs == ("scaled",)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 8, 16)).astype(np.float32),
             "mask": np.zeros((1, 1, 1, 8), np.float32)}
    assert max_relative_error(evaluate(after, feeds)["y"],
                              ort.run(ort.session(proto), feeds)["y"]) <= 1e-5


def test_the_score_scale_stays_when_the_query_is_read_twice() -> None:
    proto = attention(8, 16, 2, 1)
    proto.graph.output.append(helper.make_tensor_value_info("qp", onnx.TensorProto.FLOAT,
                                                            [1, 8, 16]))
    proto.graph.output.append(helper.make_tensor_value_info("kp", onnx.TensorProto.FLOAT,
                                                            [1, 8, 16]))
    graph = fold_constants(import_model(proto))
    assert fold_scale(graph) is graph


@pytest.mark.parametrize("case", ATTENTION)
def test_attention_block_runs_whole_on_the_accelerator_bit_exactly(case: str) -> None:
    preset, s, d, heads, batch, *options = ATTENTION[case]
    compiled, _ = compile_and_check(attention(s, d, heads, batch, **(options or [{}])[0]),
                                    preset)
    program = compiled.program
    assert program.host_segments == ()
    assert any(i.op is isa.SOFTMAX for i in program.instructions)
    # Q and V heads are strided views and the merge is written in place: the only identity
    # copies left are none (no LUT of the heads' data movement).
    sources = {program.source[n] for n, i in enumerate(program.instructions) if i.op is isa.LUT}
    assert not sources & {"heads_q", "heads_k", "heads_v", "merge_t"}


@pytest.fixture(scope="module")
def attention_files(tmp_path_factory):
    """The attention block, its calibration data and its program (edge)."""
    folder = tmp_path_factory.mktemp("attention")
    onnx.save(attention(8, 16, 2, 1), folder / "model.onnx")
    rng = np.random.default_rng(0)
    np.savez(folder / "data.npz", x=rng.standard_normal((4, 8, 16)).astype(np.float32),
             mask=rng.standard_normal((4, 1, 1, 8)).astype(np.float32))
    np.savez(folder / "bad.npz", x=rng.standard_normal((2, 8, 16)).astype(np.float32),
             mask=np.zeros((2, 1, 1, 9), np.float32))
    assert invoke("quantize-profile", folder / "model.onnx", "--data", folder / "data.npz",
                  "-o", folder / "model.profile.json").exit_code == 0
    result = invoke("compile", folder / "model.onnx", "--int8", "--profile",
                    folder / "model.profile.json", "--target", "edge", "-o",
                    folder / "model.ember")
    assert result.exit_code == 0, result.output
    return folder


@pytest.mark.parametrize("command", ["run", "simulate"])
def test_a_mask_of_the_wrong_shape_names_the_input_and_both_shapes(attention_files,
                                                                   command: str) -> None:
    target = attention_files / ("model.onnx" if command == "run" else "model.ember")
    result = invoke(command, target, "-i", attention_files / "bad.npz")
    assert_one_line_error(result, "'mask'", "9", "8")
    assert "(2, 1, 1, 9)" in result.output or "[2, 1, 1, 9]" in result.output
