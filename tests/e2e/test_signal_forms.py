"""What audio and sequence front ends write (silero-vad's STFT and encoder): 1-D convolutions, a
reflect Pad of a rank-2 signal, channel Slices of a 1-D convolution's output, and LSTM states
read back as [N, C, L] values. All on the accelerator, bit-exact, no host segment: 1-D
convolutions run as 2-D ones a row high (`conv1d_as_2d`), rank-2/3 Pads as Pads of a
one-channel map (`pad_as_4d`), and a value whose bytes are another order of its elements is
copied into its own order where a reader needs it (`Walk.in_order`). Named int16, the signal
runs through the reflect Pad (each plane's border copied) and the magnitude is written int16."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.graph.ir import Graph
from compiler.passes.conv1d_as_2d import conv1d_as_2d
from compiler.passes.pad_as_4d import pad_as_4d
from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.backend.program import BackendOptions
from ember.flow import CompileOptions, compile_model, optimized_graph, quantize_model
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from tests.e2e.flow import check_bit_exact, compile_and_check, model_samples, value_sqnr_db
from tests.quantizer.util import profile_of
from tests.onnx_builder import model


def stft_encoder(seed: int = 0, frames: int = 4, hop: int = 16):
    """x [N, hop * frames] → reflect Pad → Unsqueeze → Conv1d (an STFT basis, stride hop) →
    real and imaginary halves (channel Slices) → magnitude → two Conv1d + Relu."""
    rng = np.random.default_rng(seed)
    bins = 9
    inits = {"pads": np.array([0, hop, 0, hop], np.int64), "axis": np.array([1], np.int64),
             "basis": rng.normal(0, 0.3, (2 * bins, 1, 2 * hop)).astype(np.float32),
             "w1": rng.normal(0, 0.3, (12, bins, 3)).astype(np.float32),
             "b1": rng.normal(0, 0.1, 12).astype(np.float32),
             "w2": rng.normal(0, 0.3, (8, 12, 3)).astype(np.float32),
             "two": np.float32(2.0),
             "s0": np.array([0], np.int64), "s1": np.array([bins], np.int64),
             "s2": np.array([2 * bins], np.int64), "ax1": np.array([1], np.int64)}
    n = helper.make_node
    nodes = [n("Pad", ["x", "pads"], ["padded"], mode="reflect"),
             n("Unsqueeze", ["padded", "axis"], ["signal"]),
             n("Conv", ["signal", "basis"], ["spec"], strides=[hop]),
             n("Slice", ["spec", "s0", "s1", "ax1"], ["re"]),
             n("Slice", ["spec", "s1", "s2", "ax1"], ["im"]),
             n("Pow", ["re", "two"], ["re2"]), n("Pow", ["im", "two"], ["im2"]),
             n("Add", ["re2", "im2"], ["power"]), n("Sqrt", ["power"], ["magnitude"]),
             n("Conv", ["magnitude", "w1", "b1"], ["c1"], pads=[1, 1]),
             n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "w2"], ["y"], pads=[1, 1], strides=[2])]
    length = hop * frames
    out = (frames + 2) // 2 + (1 if (frames + 2) % 2 else 0)
    return model(nodes, {"x": [2, length]}, {"y": [2, 8, out]}, inits)


def test_the_passes_lift_the_signal_forms_and_keep_fp32() -> None:
    proto = stft_encoder()
    graph = import_model(proto)
    lifted = pad_as_4d(conv1d_as_2d(graph))
    assert all(lifted.type_of(n.inputs[1]).rank == 4 for n in lifted.nodes if n.op == "Conv")
    assert [lifted.type_of(n.inputs[0]).rank for n in lifted.nodes if n.op == "Pad"] == [4]
    x = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(lifted, x)["y"], evaluate(graph, x)["y"], rtol=1e-5,
                               atol=1e-5)
    assert isinstance(lifted, Graph)


@pytest.mark.parametrize("preset", ["edge", "default", "large"])
def test_an_stft_encoder_runs_whole_on_the_accelerator(preset: str) -> None:
    compiled, _ = compile_and_check(stft_encoder(), preset)
    assert compiled.program.host_segments == ()


@pytest.mark.parametrize("preset", ["edge", "default"])
def test_a_magnitude_kept_in_fp32_reads_int16_parts(preset: str) -> None:
    """The quantizer's own int16 parts of a spectrum (`--wide-norm-inputs always`) stay int16
    when their magnitude is kept in fp32: the host segment reads both planes of each (its
    bindings' `plane`), bit-exact (a budget with --allow-host kept silero-vad's magnitude, and
    its program stopped at the host segment's int16 binding)."""
    proto = stft_encoder()
    profile = profile_of(proto, model_samples(proto, 8, 0), optimized_graph(proto))
    magnitude = next(n.name for n in optimized_graph(proto).nodes if n.op == "Hypot")
    for keep in ((), (magnitude,)):
        built = compile_model(proto, profile, CompileOptions(
            quant=QuantOptions(wide_norm_inputs="always", keep_fp32=keep),
            backend=BackendOptions(allow_host=True)), preset)
        assert any(built.qgraph.type_of(v).dtype == "int16" for v in built.qgraph.values)
        segments = built.compiled.program.host_segments
        assert len(segments) == len(keep)
        for segment in segments:
            planes = [b["plane"] for b in segment["inputs"] if b["dtype"] == "int16"]
            assert len(planes) == 2 and all(p > 0 for p in planes)
        check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 2, 1))


def _int16_signal(proto, preset: str = "default", names=("x", "magnitude")):
    profile = profile_of(proto, model_samples(proto, 8, 0), optimized_graph(proto))
    return compile_model(proto, profile, CompileOptions(
        quant=QuantOptions(int16_tensors=names)), preset)


@pytest.mark.parametrize("preset", ["edge", "default"])
def test_an_int16_signal_and_magnitude_run_bit_exactly(preset: str) -> None:
    """silero-vad reached 30 dB only with its audio and its spectrum's magnitude int16 (8-bit
    audio loses the quiet frames). The input's group runs through the rank-2 reflect Pad (its
    border copies of input samples, each plane copied) and the views into the STFT's Convs,
    which stream both planes; the Hypot writes an int16 magnitude (ADD op hypot, wide) that
    the encoder's Conv streams. Whole on the accelerator, bit-exact, batched."""
    proto = stft_encoder()
    built = _int16_signal(proto, preset)
    wide = {v for v in built.qgraph.values if not built.qgraph.values[v].is_const
            and built.qgraph.type_of(v).dtype == "int16"}
    assert {"x/q", "Pad_0/y_4d", "padded", "signal", "magnitude"} <= wide
    program = built.compiled.program
    assert program.host_segments == ()
    assert any(i.op.mnemonic == "ADD" and i.args["op"] == 3 and i.args["wide"]
               for i in program.instructions)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))


def test_the_int16_signal_and_magnitude_are_closer_to_fp32() -> None:
    """Each value's own error (16-bit codes of its range against 8-bit ones) is over 30 dB
    smaller; the integer reference's magnitude, which carries the int8 spectrum parts' error
    too, is closer to fp32 as well."""
    proto = stft_encoder()
    graph = optimized_graph(proto)
    profile = profile_of(proto, model_samples(proto, 8, 0), graph)
    feeds = model_samples(proto, 4, 1)
    narrow, wide = (quantize_model(proto, profile, QuantOptions(int16_tensors=names))
                    for names in ((), ("x", "magnitude")))
    for name in ("padded", "magnitude"):
        assert value_sqnr_db(graph, wide.qgraph, name, feeds) > \
            value_sqnr_db(graph, narrow.qgraph, name, feeds) + 30
    computed = [value_sqnr_db(graph, q.qgraph, "magnitude", feeds, stored=False)
                for q in (narrow, wide)]
    assert computed[1] > computed[0] + 1


def test_an_int16_signal_through_a_constant_pad_is_refused() -> None:
    """A constant Pad's border is the LOAD's one pad byte: the gate refuses int16 there in one
    line naming the Pad and the tensor named."""
    proto = stft_encoder()
    next(a for n in proto.graph.node if n.op_type == "Pad" for a in n.attribute
         if a.name == "mode").s = b"constant"
    with pytest.raises(QuantizeError) as caught:
        _int16_signal(proto, names=("x",))
    message = str(caught.value)
    assert "\n" not in message and "(with 'x', which it flows into or from unchanged): read by " \
        "Pad 'Pad_0'" in message and "edge, reflect or wrap Pads" in message


@pytest.mark.parametrize("preset", ["edge", "default"])
def test_naming_one_spectrum_part_int16_takes_the_other(preset: str) -> None:
    """A Hypot squares codes of one scale: its two operands are one int16 group, so naming the
    real part makes the imaginary one int16 in the same parameters (no Rescale between them),
    and the magnitude's ADD reads both planes of each. Bit-exact, batched."""
    proto = stft_encoder()
    profile = profile_of(proto, model_samples(proto, 8, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(quant=QuantOptions(
        int16_tensors=("re",), wide_norm_inputs="never")), preset)
    qgraph = built.qgraph
    assert qgraph.type_of("re").dtype == qgraph.type_of("im").dtype == "int16"
    assert qgraph.values["re"].type.quant == qgraph.values["im"].type.quant
    assert not any(node.op == "Rescale" for node in qgraph.nodes)
    check_bit_exact(qgraph, built.compiled, model_samples(proto, 3, 1))
