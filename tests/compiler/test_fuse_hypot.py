"""The written-out magnitude fusion: Before (Sqrt of the sum of two squares, each Pow(x, 2) or
x * x) / Expected (one Hypot), the fp32 output equal to onnxruntime's on the original graph; what
must not fuse; and the fused magnitude bit-exact on the accelerator (ADD op hypot), far closer
to fp32 than the written-out form, whose power rounds to int8."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fuse_hypot import fuse_hypot
from compiler.pipeline import GRAPH_PASSES, optimize
from ember import ort
from ember.flow import CompileOptions, compile_model, optimized_graph
from quantizer.quantize import quantize
from quantizer.reference import run_int8
from simulator import isa
from tests.e2e.flow import check_bit_exact, output_sqnr_db
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

C, W = 16, 24  # a spectrum of C bins (real and imaginary: 2C channels) over W frames


def spectrum(square: str = "Pow", extra_reader: bool = False):
    """x [1, 1, 1, W + 7] → Conv (2C basis filters) → real, imaginary halves → their squares
    summed → Sqrt → a 1x1 Conv: an STFT's magnitude as silero-vad writes it."""
    rng = np.random.default_rng(4)
    n = helper.make_node
    nodes = [n("Conv", ["x", "basis"], ["z"], name="stft"),
             n("Slice", ["z", "s0", "s1", "axis"], ["re"], name="real"),
             n("Slice", ["z", "s1", "s2", "axis"], ["im"], name="imag")]
    for part in ("re", "im"):
        nodes.append(n("Pow", [part, "two"], [f"{part}2"], name=f"{part}/square")
                     if square == "Pow" else
                     n("Mul", [part, part], [f"{part}2"], name=f"{part}/square"))
    nodes += [n("Add", ["re2", "im2"], ["power"], name="power"),
              n("Sqrt", ["power"], ["mag"], name="magnitude"),
              n("Conv", ["mag", "w"], ["y"], name="encoder")]
    inits = {"basis": rng.normal(0, 1, (2 * C, 1, 1, 8)).astype(np.float32),
             "s0": np.array([0], np.int64), "s1": np.array([C], np.int64),
             "s2": np.array([2 * C], np.int64), "axis": np.array([1], np.int64),
             "two": np.array(2.0, np.float32),
             "w": rng.normal(0, C ** -0.5, (8, C, 1, 1)).astype(np.float32)}
    outputs = {"y": [1, 8, 1, W]}
    if extra_reader:
        outputs["power"] = [1, C, 1, W]
    return model(nodes, {"x": [1, 1, 1, W + 7]}, outputs, inits, opset=17)


def samples(count: int, seed: int) -> list[dict]:
    """Frames whose loudness spans 40 dB, as speech and silence do."""
    rng = np.random.default_rng(seed)
    return [{"x": (rng.normal(0, 1, (1, 1, 1, W + 7)) * 10 ** rng.uniform(-2, 0))
             .astype(np.float32)} for _ in range(count)]


@pytest.mark.parametrize("square", ["Pow", "Mul"])
def test_a_written_out_magnitude_becomes_one_hypot(square: str) -> None:
    proto = spectrum(square)
    graph = eliminate_dead(fuse_hypot(fold_constants(import_model(proto))))
    assert [node.op for node in graph.nodes] == ["Conv", "Slice", "Slice", "Hypot", "Conv"]
    hypot = graph.nodes[3]
    assert hypot.inputs == ("re", "im") and hypot.outputs == ("mag",)
    for feeds in samples(2, 1):
        np.testing.assert_allclose(evaluate(graph, feeds)["y"],
                                   ort.run(ort.session(proto), feeds)["y"], rtol=1e-4,
                                   atol=1e-6)


def test_a_power_read_elsewhere_is_left_written_out() -> None:
    graph = fuse_hypot(fold_constants(import_model(spectrum(extra_reader=True))))
    assert "Hypot" not in [node.op for node in graph.nodes]


def sqnr_db(graph, qgraph) -> float:
    return output_sqnr_db(graph, qgraph, samples(8, 9), "y")


def test_the_fused_magnitude_keeps_what_int8_power_loses() -> None:
    proto = spectrum()
    fused = optimized_graph(proto)
    written = optimize(import_model(proto), [p for p in GRAPH_PASSES if p is not fuse_hypot])
    assert "Hypot" in [n.op for n in fused.nodes] and "Hypot" not in [n.op for n in written.nodes]
    calibration = samples(16, 0)
    good = quantize(fused, profile_of(proto, calibration, fused))
    poor = quantize(written, profile_of(proto, calibration, written))
    assert sqnr_db(fused, good) > sqnr_db(fused, poor) + 6


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow)])
def test_a_hypot_runs_bit_exactly_on_the_accelerator(preset: str) -> None:
    proto = spectrum()
    profile = profile_of(proto, samples(8, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(), preset)
    program = built.compiled.program
    assert program.host_segments == ()
    # The two parts, split into a Conv each (`split_sliced_conv`), are int16 (REQUANT wide),
    # the magnitude's ADD reads both planes of each.
    assert any(i.op is isa.ADD and i.args["op"] == 3 and i.args["a_wide"] and i.args["b_wide"]
               for i in program.instructions)
    assert any(i.op is isa.REQUANT and i.args["wide"] for i in program.instructions)
    check_bit_exact(built.qgraph, built.compiled, samples(3, 1))


def test_int16_parts_pay() -> None:
    """The spectrum's parts in int16 (`quantizer.wide`: each part a Conv's own output, one scale
    for both) keep more of the quiet frames than int8 parts."""
    from quantizer.options import QuantOptions
    proto = spectrum()
    graph = optimized_graph(proto)
    profile = profile_of(proto, samples(16, 0), graph)
    wide = quantize(graph, profile)
    narrow = quantize(graph, profile, QuantOptions(wide_norm_inputs="never"))
    parts = [n.inputs for n in wide.nodes if n.op == "Hypot"][0]
    assert all(wide.type_of(p).dtype == "int16" for p in parts)
    assert wide.type_of(parts[0]).quant == wide.type_of(parts[1]).quant
    # +1.5 dB here, where the int8 magnitude and encoder bound the output; silero-vad's output
    # gains 7 dB (benchmarks/real_models.py).
    assert sqnr_db(graph, wide) > sqnr_db(graph, narrow) + 1


def test_the_qdq_export_writes_hypot_as_onnx_does_and_onnxruntime_runs_it() -> None:
    import onnxruntime

    from quantizer.qdq import export_qdq
    proto = spectrum()
    graph = optimized_graph(proto)
    qgraph = quantize(graph, profile_of(proto, samples(8, 0), graph))
    exported = export_qdq(qgraph)
    ops = [node.op_type for node in exported.graph.node]
    assert "Hypot" not in ops and "Sqrt" in ops
    session = onnxruntime.InferenceSession(exported.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    for feeds in samples(2, 3):
        want = run_int8(qgraph, feeds)["y"]
        got = session.run(None, feeds)[0]
        scale = np.abs(want).max()
        assert np.abs(want - got).max() < 0.05 * scale


def test_an_onnx_model_cannot_name_embers_own_hypot() -> None:
    """ONNX has no Hypot (its checker refuses it in the default domain); in another domain
    the importer names it as unsupported, and its list of supported operators leaves it out."""
    from compiler.errors import CompileError
    from compiler.graph.ops import supported_ops
    proto = model([helper.make_node("Hypot", ["a", "b"], ["y"], name="h")],
                  {"a": [1, 4], "b": [1, 4]}, {"y": [1, 4]}, {}, opset=17)
    with pytest.raises(CompileError, match="Hypot"):
        import_model(proto)
    assert "Hypot" not in supported_ops().split(", ")
