"""int16 residual streams: a LayerNorm input an Add computes is int16 when the profile shows that
int8 loses it (`quantizer.wide`: a channel 100 times the others leaves the rest under 8 int8
steps), the ADD writes it as two byte planes and LAYERNORM reads them; the projection added
into such a stream is measured alike and requantized to int16 (REQUANT wide=1), which the ADD
reads (a_wide, b_wide). Bit-exact on every preset, and the LayerNorm's output far closer to
fp32 than with int8. A residual without outliers stays int8; "never" and "always" override the
measure."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.backend.program import BackendOptions
from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.options import QuantOptions
from simulator import isa
from tests.e2e.flow import check_bit_exact, output_sqnr_db, quantized
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

S, C = 12, 48


def residual_block(outlier: float):
    """y = LayerNorm(a + b): a stream a and an update b that carries only channel 5, `outlier`
    times a's spread (BERT's outlier dimensions); the LayerNorm's gamma shrinks channel 5
    back, so y's other channels hold what a brought."""
    rng = np.random.default_rng(0)
    gamma = rng.uniform(0.5, 1.5, C).astype(np.float32)
    gamma[5] = 1 / outlier
    only = np.zeros(C, np.float32)
    only[5] = outlier
    nodes = [helper.make_node("Mul", ["update", "only"], ["b"], name="outlier"),
             helper.make_node("Add", ["a", "b"], ["r"], name="residual"),
             helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], name="norm")]
    inits = {"only": only, "gamma": gamma, "beta": rng.normal(0, 0.1, C).astype(np.float32)}
    return model(nodes, {"a": [1, S, C], "update": [1, S, C]}, {"y": [1, S, C]}, inits,
                 opset=17)


def samples(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{name: rng.normal(0, 1, (1, S, C)).astype(np.float32) for name in ("a", "update")}
            for _ in range(count)]


def sqnr_db(proto, qgraph, output: str = "y") -> float:
    return output_sqnr_db(optimized_graph(proto), qgraph, samples(4, 9), output)


def wide_values(qgraph) -> list[str]:
    return sorted(name for name, value in qgraph.values.items() if value.type.dtype == "int16")


def test_auto_makes_an_outlier_residual_int16_and_it_pays() -> None:
    proto = residual_block(outlier=100.0)
    wide = quantized(proto, samples(8, 0))
    narrow = quantized(proto, samples(8, 0), QuantOptions(wide_norm_inputs="never"))
    assert wide_values(wide) == ["r"] and wide_values(narrow) == []
    assert sqnr_db(proto, wide) > sqnr_db(proto, narrow) + 10


def test_a_residual_without_outliers_stays_int8_unless_always() -> None:
    proto = residual_block(outlier=1.0)
    assert wide_values(quantized(proto, samples(8, 0))) == []
    assert wide_values(quantized(proto, samples(8, 0),
                                 QuantOptions(wide_norm_inputs="always"))) == ["r"]


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow),
                                    pytest.param("large", marks=pytest.mark.slow)])
def test_an_int16_residual_runs_bit_exactly(preset: str) -> None:
    proto = residual_block(outlier=100.0)
    profile = profile_of(proto, samples(8, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(), preset)
    program = built.compiled.program
    wide = [i.op.mnemonic for i in program.instructions
            if i.op in (isa.ADD, isa.LAYERNORM) and i.args["wide"]]
    assert "ADD" in wide and "LAYERNORM" in wide
    check_bit_exact(built.qgraph, built.compiled, samples(2, 1))


def projected_block(outlier: float = 100.0):
    """y = LayerNorm(a + (h @ W + bias)): the projection added into the stream carries the
    outlier channel (W's column 5 is `outlier` times the others), as BERT's attention-output
    and feed-forward projections do."""
    rng = np.random.default_rng(1)
    w = rng.normal(0, C ** -0.5, (C, C)).astype(np.float32)
    w[:, 5] *= outlier
    gamma = rng.uniform(0.5, 1.5, C).astype(np.float32)
    gamma[5] = 1 / outlier
    nodes = [helper.make_node("MatMul", ["update", "w"], ["m"], name="dense"),
             helper.make_node("Add", ["bias", "m"], ["b"], name="dense_bias"),
             helper.make_node("Add", ["b", "a"], ["r"], name="residual"),
             helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], name="norm")]
    inits = {"w": w, "bias": rng.normal(0, 0.1, C).astype(np.float32), "gamma": gamma,
             "beta": rng.normal(0, 0.1, C).astype(np.float32)}
    return model(nodes, {"a": [1, S, C], "update": [1, S, C]}, {"y": [1, S, C]}, inits,
                 opset=17)


def test_the_projection_into_an_outlier_stream_is_int16_too_and_it_pays() -> None:
    proto = projected_block()
    wide = quantized(proto, samples(8, 0))
    narrow = quantized(proto, samples(8, 0), QuantOptions(wide_norm_inputs="never"))
    # The Gemm of the tokens' rows (fold_bias), its Reshape back (a view) and the sum.
    assert wide_values(wide) == ["b", "dense/gemm", "r"]
    assert sqnr_db(proto, wide) > sqnr_db(proto, narrow) + 10


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow)])
def test_an_int16_projection_runs_bit_exactly(preset: str) -> None:
    proto = projected_block()
    profile = profile_of(proto, samples(8, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(), preset)
    program = built.compiled.program
    assert any(i.op is isa.REQUANT and i.args["wide"] for i in program.instructions)
    assert any(i.op is isa.ADD and (i.args["a_wide"] or i.args["b_wide"]) and i.args["wide"]
               for i in program.instructions)
    check_bit_exact(built.qgraph, built.compiled, samples(2, 1))


def test_the_accuracy_report_and_the_qdq_export_carry_int16(tmp_path) -> None:
    """`ember accuracy --per-layer` names the int16 values' precision; `--emit-onnx` writes
    them as int16 QuantizeLinear/DequantizeLinear (opset 21), which onnxruntime runs."""
    import json

    import onnx
    import onnxruntime

    from tests.cli import invoke
    proto = projected_block()
    model_path = tmp_path / "block.onnx"
    onnx.save(proto, model_path)
    for name, count, seed in (("calib", 8, 0), ("eval", 3, 1)):
        drawn = samples(count, seed)
        np.savez(tmp_path / f"{name}.npz",
                 **{k: np.concatenate([s[k] for s in drawn]) for k in drawn[0]})
    profile, program, export = tmp_path / "p.json", tmp_path / "m.ember", tmp_path / "q.onnx"
    assert invoke("quantize-profile", model_path, "--data", tmp_path / "calib.npz", "-o",
                  profile).exit_code == 0
    assert invoke("compile", model_path, "--int8", "--profile", profile, "-o",
                  program).exit_code == 0
    result = invoke("accuracy", model_path, program, "--profile", profile, "--data",
                    tmp_path / "eval.npz", "--per-layer", "--json", "--emit-onnx", export)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    precision = {layer["name"]: layer["precision"] for layer in report["layers"]}
    assert precision["r"] == precision["b"] == "int16" and precision["y"] == "int8"
    assert report["bit_exact"] is True
    session = onnxruntime.InferenceSession(str(export), providers=["CPUExecutionProvider"])
    feed = samples(1, 2)[0]
    assert session.run(None, feed)[0].shape == (1, S, C)


def carried_stream(outlier: float = 30.0):
    """Two residual blocks, the first LayerNorm's output both the next projection's input and
    the stream carried into the second sum (BERT's post-norm layers): z = LayerNorm(y + (y @ W
    + bias)), y = LayerNorm(a + b). y's gamma makes channel 5 `outlier` times the others, so
    int8 loses y's other channels in the second sum."""
    rng = np.random.default_rng(2)
    only = np.zeros(C, np.float32)
    only[5] = outlier
    gamma = rng.uniform(0.5, 1.5, C).astype(np.float32)
    gamma[5] = outlier
    w = rng.normal(0, C ** -0.5, (C, C)).astype(np.float32)
    w[5, :] /= outlier
    nodes = [helper.make_node("Mul", ["update", "only"], ["b"], name="outlier"),
             helper.make_node("Add", ["a", "b"], ["r"], name="residual"),
             helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], name="norm"),
             helper.make_node("MatMul", ["y", "w"], ["m"], name="dense"),
             helper.make_node("Add", ["bias", "m"], ["p"], name="dense_bias"),
             helper.make_node("Add", ["p", "y"], ["r2"], name="residual2"),
             helper.make_node("LayerNormalization", ["r2", "gamma2", "beta"], ["z"],
                              name="norm2")]
    inits = {"only": only, "gamma": gamma, "beta": rng.normal(0, 0.1, C).astype(np.float32),
             "w": w, "bias": rng.normal(0, 0.1, C).astype(np.float32),
             "gamma2": rng.uniform(0.5, 1.5, C).astype(np.float32)}
    return model(nodes, {"a": [1, S, C], "update": [1, S, C]}, {"z": [1, S, C]}, inits,
                 opset=17)


def test_a_norm_output_carried_in_an_outlier_stream_is_int16_and_copied_for_the_array() -> None:
    """y is an operand of the int16 sum r2 and the input of a Gemm: the quantizer computes it
    twice, an int16 copy (norm/wide) for the sum and the int8 original for the array, and the
    output gains over int8 y."""
    proto = carried_stream()
    wide = quantized(proto, samples(8, 0))
    assert {"y/wide", "r2", "r"} <= set(wide_values(wide)) and "y" not in wide_values(wide)
    # The int8 original is smoothed too (`quantizer.smooth`: y's channel 5 is 30 times the
    # others'); the int16 copy is not.
    assert [n.name for n in wide.nodes if n.op == "LayerNormalization"] == \
        ["norm/smooth", "norm/wide", "norm2"]
    gemm = next(n for n in wide.nodes if n.op in ("Gemm", "MatMul"))
    assert wide.type_of(gemm.inputs[0]).dtype == "int8"
    narrow = quantized(proto, samples(8, 0), QuantOptions(wide_norm_inputs="never"))
    assert sqnr_db(proto, wide, "z") > sqnr_db(proto, narrow, "z") + 4


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow)])
def test_an_int16_norm_output_runs_bit_exactly(preset: str) -> None:
    proto = carried_stream()
    profile = profile_of(proto, samples(8, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(), preset)
    program = built.compiled.program
    assert any(i.op is isa.LAYERNORM and i.args["out_wide"] for i in program.instructions)
    check_bit_exact(built.qgraph, built.compiled, samples(2, 1))


def test_a_residual_read_by_a_norm_kept_in_fp32_stays_int8() -> None:
    """The LayerNorm kept in fp32 on the host (as the budget's --allow-host keeps one): the sum
    it reads, which int8 loses, stays int8 all the same (a host segment reads 8-bit codes),
    and the program with its host segment compiles and runs bit-exactly."""
    proto = residual_block(outlier=100.0)
    profile = profile_of(proto, samples(8, 0), optimized_graph(proto))
    options = CompileOptions(quant=QuantOptions(keep_fp32=("norm",)),
                             backend=BackendOptions(allow_host=True))
    built = compile_model(proto, profile, options, "default")
    assert wide_values(built.qgraph) == []
    assert built.compiled.program.host_segments
    check_bit_exact(built.qgraph, built.compiled, samples(2, 1))
