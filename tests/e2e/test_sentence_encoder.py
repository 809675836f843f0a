"""A BERT-style sentence encoder as transformers export it, whole on the accelerator: token ids
and an attention mask as int64 inputs, the mask's Casts moved onto the input (its quantization,
by the host), its Expand sunk past the pooling's Mul and sums, float32's lowest as the additive
mask (`quantizer.masks`), the masked mean pooling's ReduceSum and Div in int8. Bit-exact on
every preset; padded sentences keep cosine ≥ 0.99 to fp32, and the padding's token ids change
nothing."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from compiler.backend.program import BackendOptions
from compiler.graph.evaluate import evaluate
from ember.flow import CompileOptions, compile_model, optimized_graph
from examples import zoo
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from tests.cli import assert_one_line_error, invoke
from tests.e2e.flow import check_bit_exact
from tests.quantizer.util import profile_of

TOKENS, WIDTH = 16, 32


def sentences(count: int, seed: int) -> list[dict]:
    """Token ids with 4 to 16 real tokens each, the rest padding (id 0, mask 0)."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(count):
        length = int(rng.integers(4, TOKENS + 1))
        ids = np.zeros((1, TOKENS), np.int64)
        ids[0, :length] = rng.integers(1, 256, length)
        mask = (np.arange(TOKENS) < length).astype(np.int64)[None]
        found.append({"input_ids": ids, "attention_mask": mask})
    return found


@pytest.fixture(scope="module")
def encoder():
    proto = zoo.transformer_encoder(tokens=TOKENS, width=WIDTH, mask=True)
    profile = profile_of(proto, sentences(16, 0), optimized_graph(proto))
    return proto, profile


def test_the_mask_is_the_inputs_quantization_and_its_expand_is_gone(encoder) -> None:
    proto, _ = encoder
    graph = optimized_graph(proto)
    ops = [node.op for node in graph.nodes]
    assert "Expand" not in ops
    casts = [node for node in graph.nodes if node.op == "Cast"]
    assert [node.inputs for node in casts] == [("attention_mask",)]


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow),
                                    pytest.param("large", marks=pytest.mark.slow)])
def test_a_masked_sentence_encoder_is_bit_exact(encoder, preset: str) -> None:
    proto, profile = encoder
    built = compile_model(proto, profile, CompileOptions(), preset)
    program = built.compiled.program
    assert program.host_segments == ()
    assert sorted(b.dtype for b in program.inputs) == ["int32", "int8"]
    check_bit_exact(built.qgraph, built.compiled, sentences(2, 1))


def test_padded_sentences_keep_cosine_to_fp32(encoder) -> None:
    """float32's lowest in the mask would make one int8 step of the scores larger than every
    score; the mask's ranges keep the scores' own resolution."""
    proto, profile = encoder
    built = compile_model(proto, profile, CompileOptions())
    graph = optimized_graph(proto)
    for feeds in sentences(6, 2):
        reference = evaluate(graph, feeds)["pooled"].ravel()
        got = run_int8(built.qgraph, feeds)["pooled"].ravel()
        cosine = reference @ got / np.linalg.norm(reference) / np.linalg.norm(got)
        assert cosine >= 0.99, cosine


def test_the_padding_token_ids_change_nothing(encoder) -> None:
    """A masked key's score saturates at the lowest code, ln(256·16) below any row's largest:
    its weight rounds to zero, so whatever ids the padding holds, the output is the same."""
    proto, profile = encoder
    built = compile_model(proto, profile, CompileOptions())
    feeds = sentences(1, 3)[0]
    feeds["attention_mask"][0, 8:] = 0
    other = {**feeds, "input_ids": feeds["input_ids"].copy()}
    other["input_ids"][0, 8:] = np.arange(100, 100 + TOKENS - 8)
    np.testing.assert_array_equal(run_int8(built.qgraph, feeds)["pooled"],
                                  run_int8(built.qgraph, other)["pooled"])


def test_a_mask_of_the_wrong_shape_is_one_line(tmp_path) -> None:
    """The compiled program takes [1, 16] ids and mask: a mask of 12 tokens is refused naming
    it and both shapes, exit 2, no output written."""
    proto = zoo.transformer_encoder(tokens=TOKENS, width=WIDTH, mask=True)
    model_path = tmp_path / "encoder.onnx"
    onnx.save(proto, model_path)
    calib = tmp_path / "calib.npz"
    samples = sentences(4, 0)
    np.savez(calib, **{name: np.concatenate([s[name] for s in samples]) for name in samples[0]})
    profile, program = tmp_path / "p.json", tmp_path / "m.ember"
    assert invoke("quantize-profile", model_path, "--data", calib, "-o", profile).exit_code == 0
    assert invoke("compile", model_path, "--int8", "--profile", profile, "-o",
                  program).exit_code == 0
    bad = tmp_path / "bad.npz"
    np.savez(bad, input_ids=samples[0]["input_ids"], attention_mask=np.ones((1, 12), np.int64))
    out = tmp_path / "out.npz"
    assert_one_line_error(invoke("simulate", program, "-i", bad, "-o", out),
                          "input 'attention_mask'", "[1, 12]", "[1, 16]")
    assert not out.exists()
    good = tmp_path / "good.npz"
    np.savez(good, **samples[1])
    assert invoke("simulate", program, "-i", good, "-o", out).exit_code == 0


def test_the_qdq_export_casts_the_integer_mask_and_onnxruntime_runs_it(encoder) -> None:
    """The mask's quantization reads int64 codes (`Quant.CAST`); ONNX's QuantizeLinear takes
    floats only, so the export casts it first, and onnxruntime's run of the export stays
    close to the integer reference."""
    import onnxruntime

    from quantizer.qdq import export_qdq
    proto, profile = encoder
    qgraph = compile_model(proto, profile, CompileOptions()).qgraph
    model = export_qdq(qgraph)
    casts = [node for node in model.graph.node if node.op_type == "Cast"]
    assert any(node.input[0] == "attention_mask" for node in casts)
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    for feeds in sentences(3, 4):
        want = run_int8(qgraph, feeds)[qgraph.outputs[0]]
        got = session.run(None, feeds)[0]
        cosine = float((want * got).sum() / np.linalg.norm(want) / np.linalg.norm(got))
        assert cosine > 0.99


def test_a_reader_of_the_masks_cast_kept_in_fp32_reads_the_cast(encoder) -> None:
    """The mask's Cast is the input's quantization, but a reader kept in fp32 (as the budget's
    --allow-host keeps one) reads floats: the Cast is emitted for it, not the int64 input
    (which failed the graph's type check), and the program with its host segment is
    bit-exact."""
    proto, profile = encoder
    options = CompileOptions(quant=QuantOptions(keep_fp32=("mask.heads/mask.float/early",)),
                             backend=BackendOptions(allow_host=True))
    built = compile_model(proto, profile, options, "default")
    casts = [node for node in built.qgraph.nodes if node.op == "Cast"]
    assert [(node.inputs, built.qgraph.type_of(node.outputs[0]).dtype) for node in casts] == \
        [(("attention_mask",), "float32")]
    assert built.compiled.program.host_segments
    check_bit_exact(built.qgraph, built.compiled, sentences(2, 1))
