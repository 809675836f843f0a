"""int16 through a MatMul of two activations (attention's Q·Kᵀ and P·V): either operand, both,
and the product may be int16. The streamed operand's two planes each pass through the array
(COMPUTE x_offset 0 and -128), the stationary one's two planes are each PRELOADed (w_offset 0
and -128), the passes shifted 16, 8, 8 and 0 (`numerics.activation_passes`), and REQUANT
wide=1 writes an int16 product's planes. Bit-exact against the integer reference on two
presets, batched; the codes narrowed so that the int32 accumulator holds any sum
(`quantizer.wide.product_bits`); each product closer to fp32 than int8's; the array's cycles
two or four times int8's; what is left refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from ember.flow import CompileOptions, compile_model, optimized_graph, quantize_model
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from quantizer.qdq import export_qdq
from quantizer.wide import product_bits
from simulator import isa, numerics
from tests.e2e.flow import check_bit_exact, compute_cycles, model_samples, value_sqnr_db
from tests.e2e.test_attention import PRODUCTS, attention, product
from tests.quantizer.util import profile_of

# Which of a product's values are int16: its streamed operand a, stationary b, output y.
WIDE = {"a": ("ap",), "b": ("bp",), "a, b": ("ap", "bp"), "a, b, y": ("ap", "bp", "y")}


def _compiled(proto, names, preset: str = "default", batch_samples: int = 2):
    profile = profile_of(proto, model_samples(proto, 8), optimized_graph(proto))
    built = compile_model(proto, profile,
                          CompileOptions(quant=QuantOptions(int16_tensors=tuple(names))), preset)
    check_bit_exact(built.qgraph, built.compiled, model_samples(proto, batch_samples, 1))
    return built


@pytest.mark.parametrize("preset", ["edge", "default"])
@pytest.mark.parametrize("wide", WIDE)
@pytest.mark.parametrize("form", ["rank 2, Bᵀ", "rank 3, Bᵀ, K above the array",
                                  "rank 4, broadcast heads"])
def test_int16_operands_run_bit_exactly(form: str, wide: str, preset: str) -> None:
    a_shape, b_shape, transpose_b = PRODUCTS[form]
    built = _compiled(product(a_shape, b_shape, transpose_b), WIDE[wide], preset)
    program = built.compiled.program
    assert program.host_segments == ()
    for name in WIDE[wide]:
        if name != "y":  # the output's int16 codes: the host reads both planes
            assert built.qgraph.type_of(name).dtype == "int16", name
    shifts = {i.args["shift"] for i in program.instructions if i.op is isa.COMPUTE}
    want = {0, 8, 16} if "b" in wide and "a" in wide.split(", ") else {0, 8}
    assert shifts == want
    low_offsets = {i.args["w_offset"] for i in program.instructions if i.op is isa.PRELOAD}
    assert (-numerics.WIDE_LOW_OFFSET in low_offsets) == ("b" in wide)


@pytest.mark.parametrize("preset", ["edge", "default"])
def test_attention_with_int16_q_k_v_and_context_runs_bit_exactly(preset: str) -> None:
    """Q, K and V int16 (through their Reshapes and Transposes, Kᵀ by a corner turn), the
    context int16, written in place into the heads' merge and read by the output projection;
    two images in a batch, projections with biases."""
    proto = attention(s=12, d=32, heads=2, batch=2, bias=True)
    built = _compiled(proto, ("qb", "kb", "vb", "ctx"), preset, batch_samples=3)
    assert built.compiled.program.host_segments == ()
    for name in ("qh", "kt", "vh", "ctx", "ctxm"):
        assert built.qgraph.type_of(name).dtype == "int16", name


def test_int16_attention_is_closer_to_fp32() -> None:
    """Each int16 operand's own error is far below int8's, and the context is closer to fp32
    than int8's (by less: the int8 input, weights, scores and probabilities still add
    theirs)."""
    proto = attention(s=16, d=32, heads=2, seed=1)
    graph = optimized_graph(proto)
    profile = profile_of(proto, model_samples(proto, 8), graph)
    feeds = model_samples(proto, 4, 1)
    int8 = quantize_model(proto, profile, QuantOptions()).qgraph
    wide = quantize_model(proto, profile,
                          QuantOptions(int16_tensors=("qp", "kp", "vp", "ctx"))).qgraph
    for name in ("qh", "kt", "vh"):  # what the type alone loses
        assert value_sqnr_db(graph, wide, name, feeds) > \
            value_sqnr_db(graph, int8, name, feeds) + 30, name
    assert value_sqnr_db(graph, wide, "ctx", feeds, stored=False) > \
        value_sqnr_db(graph, int8, "ctx", feeds, stored=False) + 1


def test_array_cycles_are_one_pass_per_pair_of_planes() -> None:
    """An int16 operand doubles the product's array passes, two int16 operands quadruple them:
    the same COMPUTEs, each of its own cycles."""
    proto = product((2, 9, 40), (2, 40, 19), True)
    cycles = {wide: compute_cycles(_compiled(proto, names).compiled.program, "product")
              for wide, names in {"int8": (), **WIDE}.items()}
    assert cycles["a"] == cycles["b"] == 2 * cycles["int8"]
    assert cycles["a, b"] == cycles["a, b, y"] == 4 * cycles["int8"]


def test_codes_leave_the_accumulator_room_for_any_sum() -> None:
    """Two int16 operands share the accumulator's bits: with K terms, K * 2^(b-1) * 2^(b-1)
    fits int32 (and one bit more would not); an int16 operand beside an int8 one keeps up to
    16 bits. The quantizer narrows both operands' codes so, and the worst-case sum of the
    passes is exact."""
    for k in (1, 8, 40, 64, 384, 4096):
        b = product_bits(k, True)
        assert k * 4 ** (b - 1) <= 2**31 - 1 < k * 4 ** b or b == 16
        a = product_bits(k, False)
        assert k * 2 ** (a - 1) * 2**8 <= 2**31 - 1
        assert a == 16 or k * 2**a * 2**8 > 2**31 - 1
    proto = product((2, 9, 40), (2, 40, 19), True)
    qgraph = _compiled(proto, ("ap", "bp")).qgraph
    bits = product_bits(40, True)
    for name in ("ap", "bp"):
        lo, hi = qgraph.nodes[[n.outputs[0] for n in qgraph.nodes].index(name)].attrs["qclamp"]
        assert (lo, hi) == (-2 ** (bits - 1), 2 ** (bits - 1) - 1), name
    worst = np.full((1, 40), -2 ** (bits - 1), np.int16)
    passes = sum(numerics.shift_wrap(numerics.array_pass(None, numerics.centre(pa, oa),
                                                         numerics.centre(pb, ob)), shift)
                 for pa, oa, pb, ob, shift in _planes_of(worst, worst.T))
    assert int(numerics.wrap32(passes).ravel()[0]) == 40 * 4 ** (bits - 1)


@pytest.mark.parametrize("a_wide, b_wide", [(True, True), (True, False), (False, True)])
def test_the_passes_sum_to_the_product(a_wide: bool, b_wide: bool) -> None:
    """Over random codes (int16, or int8 less a zero point), the shifted passes of the planes
    add up to `numerics.int_matmul`'s product, and COMPUTE's shift field holds the largest
    shift."""
    rng = np.random.default_rng(0)
    a = rng.integers(-2**12, 2**12, (5, 24)).astype(np.int16) if a_wide else \
        rng.integers(-128, 128, (5, 24)).astype(np.int8)
    b = rng.integers(-2**12, 2**12, (24, 7)).astype(np.int16) if b_wide else \
        rng.integers(-128, 128, (24, 7)).astype(np.int8)
    planes = [numerics.split_wide(x) if wide else (x,) for x, wide in ((a, a_wide), (b, b_wide))]
    offsets = (0, -numerics.WIDE_LOW_OFFSET)
    total = np.zeros((5, 7), np.int32)
    for pa, pb, shift in numerics.activation_passes(a_wide, b_wide):
        total = numerics.array_pass(total, numerics.centre(planes[0][pa], offsets[pa]),
                                    numerics.centre(planes[1][pb], offsets[pb]), shift)
    np.testing.assert_array_equal(total, numerics.int_matmul(a, b))
    word = isa.encode(isa.COMPUTE(sp=0, acc=0, m_inner=1, k=1, n=1,
                                  shift=numerics.ARRAY_SHIFT_MAX))
    assert isa.decode(word).args["shift"] == numerics.ARRAY_SHIFT_MAX


def _planes_of(a: np.ndarray, b: np.ndarray):
    """(a plane, its offset, b plane, its offset, shift) of each pass of two int16 operands."""
    planes = {"a": numerics.split_wide(a), "b": numerics.split_wide(b)}
    offsets = (0, -numerics.WIDE_LOW_OFFSET)
    for pa, pb, shift in numerics.activation_passes(True, True):
        yield planes["a"][pa], offsets[pa], planes["b"][pb], offsets[pb], shift


def test_qdq_export_keeps_the_int16_products() -> None:
    """The QDQ export runs the int16 operands as int16 QuantizeLinear pairs."""
    proto = attention(s=8, d=16, heads=2)
    profile = profile_of(proto, model_samples(proto, 8), optimized_graph(proto))
    qgraph = quantize_model(proto, profile,
                            QuantOptions(int16_tensors=("qp", "kp", "ctx"))).qgraph
    exported = export_qdq(qgraph)
    types = {v.name: v.type.tensor_type.elem_type for v in exported.graph.value_info}
    assert types.get("qh") == types.get("ctx") == 5  # TensorProto.INT16


@pytest.mark.parametrize("name, says, axis", [
    ("p", "made by Softmax 'softmax'", -2),  # along a column: its copies move 8-bit codes
    ("scaled", "read by Add 'add_mask'", -1),
])
def test_what_is_left_is_refused_in_one_line(name: str, says: str, axis: int) -> None:
    proto = attention(s=8, d=16, heads=2, softmax_axis=axis)
    profile = profile_of(proto, model_samples(proto, 8), optimized_graph(proto))
    with pytest.raises(QuantizeError) as caught:
        quantize_model(proto, profile, QuantOptions(int16_tensors=(name,)))
    message = str(caught.value)
    assert "\n" not in message and f"int16 tensor {name!r}" in message and says in message
