"""int16 through Softmax: an int16 input (its scores or logits finer than int8's steps, a
mask added to the scores along their rows) and
int16 probabilities (steps of 2^-15, or coarser where a reader's accumulator narrows them),
on the vector unit's SOFTMAX (wide, out_wide, fine_bits): the exp of an int16 distance as the
product of a table entry for its high byte and one for its low byte (`numerics.wide_exps`).
Bit-exact against the integer reference on two presets, batched; closer to fp32 than int8;
the QDQ export keeps the types; what the unit cannot do refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.backend.program import BackendOptions
from compiler.graph import int8
from ember.cost import CycleModel, Wide
from ember.flow import CompileOptions, compile_model, optimized_graph, quantize_model
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from quantizer.qdq import export_qdq
from simulator import isa, numerics
from simulator.arch import Arch
from tests.e2e.flow import check_bit_exact, model_samples, value_sqnr_db
from tests.e2e.test_attention import attention
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

S, C, K = 6, 16, 40  # positions, features, classes


def logits(op: str = "Softmax"):
    """A recognizer's head: x [1, S, C] -> MatMul by a constant [C, K] -> m -> Reshape [S, K]
    -> r -> Softmax (or LogSoftmax) over the classes -> y, the model's output."""
    rng = np.random.default_rng(0)
    inits = {"w": (rng.normal(0, 1, (C, K)) * 3 * C ** -0.5).astype(np.float32),
             "flat": np.array([S, K], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="classes"),
             helper.make_node("Reshape", ["m", "flat"], ["r"], name="flatten"),
             helper.make_node(op, ["r"], ["y"], axis=-1, name="softmax")]
    return model(nodes, {"x": [1, S, C]}, {"y": [S, K]}, inits, opset=17)


def _built(proto, names, preset: str = "default"):
    profile = profile_of(proto, model_samples(proto, 8), optimized_graph(proto))
    built = compile_model(proto, profile,
                          CompileOptions(quant=QuantOptions(int16_tensors=tuple(names))), preset)
    assert built.compiled.program.host_segments == ()
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))
    return built


def _softmax_flags(built) -> set[tuple[int, int, int]]:
    return {(i.args["wide"], i.args["out_wide"], i.args["fine_bits"])
            for i in built.compiled.program.instructions if i.op is isa.SOFTMAX}


@pytest.mark.parametrize("preset", ["edge", "default"])
@pytest.mark.parametrize("names, flags", [
    (("m",), (1, 0, 0)),        # int16 logits, read through the Reshape
    (("y",), (0, 1, 7)),        # int16 probabilities, steps of 2^-15
    (("m", "y"), (1, 1, 7)),
])
def test_int16_softmax_runs_bit_exactly(names, flags, preset: str) -> None:
    built = _built(logits(), names, preset)
    assert _softmax_flags(built) == {flags}
    softmax = next(n for n in built.qgraph.nodes if n.op == "Softmax")
    assert [built.qgraph.type_of(v).dtype for v in (softmax.inputs[0], softmax.outputs[0])] == \
        ["int16" if wide else "int8" for wide in flags[:2]]


@pytest.mark.parametrize("preset", ["edge", "default"])
def test_attention_probabilities_int16_beside_int16_values(preset: str) -> None:
    """P int16 read by P·V with V int16: the two share the int32 accumulator, so both are
    narrowed (`quantizer.wide.product_bits`), P to 14-bit codes of steps 2^-13 (fine_bits 5);
    two images in a batch."""
    proto = attention(s=12, d=32, heads=2, batch=2, bias=True)
    with pytest.warns(UserWarning, match="14-bit codes"):
        built = _built(proto, ("vb", "p"), preset)
    assert _softmax_flags(built) == {(0, 1, 5)}
    assert built.qgraph.type_of("p").quant.scale[0] == 2.0 ** -13


@pytest.mark.parametrize("preset", ["edge", "default"])
def test_masked_scores_int16_into_int16_probabilities(preset: str) -> None:
    """Attention's scores plus a mask computed from the model's keep flags ([B, 1, 1, S], by
    ADD over the scores' rows, which are in order), int16, read by SOFTMAX wide=1; the
    probabilities int16 too; two images in a batch."""
    proto = attention(s=12, d=32, heads=2, batch=2, bias=True, computed_mask=True)
    built = _built(proto, ("scaled", "masked", "p"), preset)
    assert _softmax_flags(built) == {(1, 1, 7)}
    adds = [i for i, node in zip(built.compiled.program.instructions,
                                 built.compiled.program.source)
            if i.op is isa.ADD and node == "add_mask"]
    assert adds and all(i.args["a_wide"] and i.args["wide"] and not i.args["b_wide"]
                        for i in adds)


def test_int16_softmax_is_closer_to_fp32() -> None:
    """What the type alone loses, far below int8's for the probabilities, and the model's
    output closer to fp32 with int16 logits and probabilities than with int8 ones (by less:
    the int8 input's and weights' errors remain)."""
    proto = logits()
    graph = optimized_graph(proto)
    profile = profile_of(proto, model_samples(proto, 8), graph)
    feeds = model_samples(proto, 4, 1)
    base = quantize_model(proto, profile, QuantOptions()).qgraph
    wide = quantize_model(proto, profile, QuantOptions(int16_tensors=("m", "y"))).qgraph
    def sqnr(qgraph, stored=True):
        return value_sqnr_db(graph, qgraph, "y", feeds, stored, coded="y/q")
    assert sqnr(wide) > sqnr(base) + 40
    assert sqnr(wide, stored=False) > sqnr(base, stored=False) + 3  # int8 x and weights remain


def test_wide_exps_are_the_exp_of_the_distance() -> None:
    """Every distance of int16 codes: the product of the two entries is exp(-s d) in Q20 to
    within two of its last bits, and distance 0 is exactly 2^20."""
    scale = 0.02 / 256
    table = int8.softmax_table(scale, "int16")
    assert table.size == numerics.WIDE_EXP_ENTRIES
    d = np.arange(1 << 16)
    got = numerics.wide_exps(d, table)
    want = np.exp(-scale * d) * 2.0 ** numerics.SOFTMAX_EXP_BITS
    assert got[0] == 1 << numerics.SOFTMAX_EXP_BITS
    assert np.abs(got - want).max() <= 2


def test_qdq_export_keeps_int16_probabilities() -> None:
    proto = logits()
    profile = profile_of(proto, model_samples(proto, 8), optimized_graph(proto))
    qgraph = quantize_model(proto, profile, QuantOptions(int16_tensors=("m", "y"))).qgraph
    exported = export_qdq(qgraph)
    types = {v.name: v.type.tensor_type.elem_type for v in exported.graph.value_info}
    assert types.get("m") == 5  # TensorProto.INT16
    assert qgraph.type_of("y/q").quant.scale[0] == 2.0 ** -15


def test_log_softmax_stays_8_bit() -> None:
    proto = logits("LogSoftmax")
    profile = profile_of(proto, model_samples(proto, 8), optimized_graph(proto))
    with pytest.raises(QuantizeError) as caught:
        quantize_model(proto, profile, QuantOptions(int16_tensors=("m",)))
    message = str(caught.value)
    assert "\n" not in message and "'m'" in message and \
        "read by LogSoftmax 'softmax'" in message


def test_the_cycle_estimate_prices_the_planes() -> None:
    """The budget's estimate (`ember.cost`): SOFTMAX's three passes over the rows, two more
    for an int16 input and one for an int16 output, as the unit's cycles count them."""
    proto = logits()
    profile = profile_of(proto, model_samples(proto, 8), optimized_graph(proto))
    qgraph = quantize_model(proto, profile, QuantOptions()).qgraph
    model = CycleModel(qgraph, Arch.load("default"))
    softmax = next(n for n in qgraph.nodes if n.op == "Softmax")
    both = Wide(values=frozenset({softmax.inputs[0], softmax.outputs[0]}))
    assert model.node_cycles(softmax, both) == 2 * model.node_cycles(softmax, Wide())


@pytest.mark.parametrize("names", [("p",), ("masked",), ("masked", "p")], ids="+".join)
def test_a_softmax_kept_in_fp32_reads_and_writes_int16(names) -> None:
    """The Softmax kept on the host (--keep-fp32, --allow-host): the host segment reads the
    int16 masked scores from both planes and quantizes the int16 probabilities into both, its
    bindings int16 where the value is; bit-exact, two images in a batch."""
    proto = attention(s=12, d=32, heads=2, batch=2, bias=True, computed_mask=True)
    profile = profile_of(proto, model_samples(proto, 8), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(
        quant=QuantOptions(int16_tensors=names, keep_fp32=("softmax",)),
        backend=BackendOptions(allow_host=True)))
    (segment,) = built.compiled.program.host_segments
    assert [b["dtype"] for b in segment["inputs"] + segment["outputs"]] == \
        ["int16" if name in names else "int8" for name in ("masked", "p")]
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, 3, 1))
