"""Embeddings on the accelerator: a model input of integer token ids bound as int32, the
constant table's rows picked by the indexed DMA (GATHER) into a tensor the next layer loads,
position embeddings folded to a constant, and a Gather of an activation's row (the CLS token)
a strided view. Each runs bit-exactly against the integer reference with no host segment; bad
data (an index outside the table, floats for token ids, another sequence length) is one line,
exit 2."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from compiler.backend.program import BackendOptions
from compiler.errors import CompileError
from ember.flow import CompileOptions, compile_model, optimized_graph
from simulator import isa, machine
from simulator.errors import SimulatorError
from tests.cli import assert_one_line_error, invoke
from tests.e2e.flow import check_bit_exact
from tests.onnx_builder import weights
from tests.quantizer.util import profile_of

VOCAB = 40


def embedder(batch: int = 1, seq: int = 6, dim: int = 24, out: int = 8, cls: bool = False,
             seed: int = 0, ids_dtype=TensorProto.INT64) -> onnx.ModelProto:
    """ids [B, S] → Gather(table [V, D]) + position embeddings (a Gather of a constant
    table by a constant Range, which folds) → MatMul [D, out] → y [B, S, out]; with `cls`,
    the first token's row, Gather(h, 0, axis=1), → y [B, out]."""
    rng = np.random.default_rng(seed)
    inits = {"table": weights(rng, VOCAB, dim), "positions": weights(rng, 16, dim, scale=0.1),
             "start": np.int64(0), "limit": np.int64(seq), "delta": np.int64(1),
             "w": weights(rng, dim, out, scale=dim ** -0.5), "first": np.int64(0)}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["tokens"], name="embed"),
             helper.make_node("Range", ["start", "limit", "delta"], ["at"], name="at"),
             helper.make_node("Gather", ["positions", "at"], ["pos"], name="embed_pos"),
             helper.make_node("Add", ["tokens", "pos"], ["e"], name="add_pos"),
             helper.make_node("MatMul", ["e", "w"], ["h"], name="proj")]
    y_shape = [batch, seq, out]
    if cls:
        nodes.append(helper.make_node("Gather", ["h", "first"], ["y"], axis=1, name="cls"))
        y_shape = [batch, out]
    else:
        nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "embedder", [helper.make_tensor_value_info("ids", ids_dtype, [batch, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


def token_ids(shape, count: int, seed: int = 0, dtype=np.int64) -> list[dict]:
    """Token ids over the whole table, negative ones (counted from its end) among them."""
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(-VOCAB, VOCAB, shape).astype(dtype)} for _ in range(count)]


def compiled(proto: onnx.ModelProto, preset: str = "default"):
    shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    profile = profile_of(proto, token_ids(shape, 6), optimized_graph(proto))
    return compile_model(proto, profile, CompileOptions(), preset)


@pytest.mark.parametrize("preset", ["edge", "default", "large"])
@pytest.mark.parametrize("cls", [False, True], ids=["tokens", "cls"])
def test_embedding_lookup_is_bit_exact(preset: str, cls: bool) -> None:
    proto = embedder(batch=2, cls=cls)
    built = compiled(proto, preset)
    program = built.compiled.program
    assert not program.host_segments
    assert [b.dtype for b in program.inputs] == ["int32"]
    gathers = [i for i in program.instructions if i.op is isa.GATHER]
    assert len(gathers) == 1 and gathers[0].args["count"] == 12
    check_bit_exact(built.qgraph, built.compiled, token_ids([2, 6], 3, seed=1))


def test_int32_token_ids() -> None:
    """An int32 input is bound as it is too."""
    built = compiled(embedder(ids_dtype=TensorProto.INT32))
    check_bit_exact(built.qgraph, built.compiled, token_ids([1, 6], 2, seed=2, dtype=np.int32))


def test_the_position_table_folds_and_the_token_table_is_quantized_per_tensor() -> None:
    """Position embeddings (a Gather by a constant Range) are a constant Add operand; the token
    table is int8 codes over its own range, the output in its parameters."""
    built = compiled(embedder())
    gathers = [n for n in built.qgraph.nodes if n.op == "Gather"]
    assert [n.name for n in gathers] == ["embed"]
    table = built.qgraph.values[gathers[0].inputs[0]]
    assert table.type.dtype == "int8" and table.type.quant.axis is None
    assert built.qgraph.type_of("tokens").quant == table.type.quant
    assert built.qgraph.type_of("ids").dtype == "int64"


def test_an_index_outside_the_table_names_the_input_and_the_index() -> None:
    built = compiled(embedder())
    program = built.compiled.program
    ids = np.zeros((1, 6), np.int32)
    ids[0, 3] = VOCAB
    with pytest.raises(SimulatorError, match=r"input 'ids': index 40 at \[0, 3\] is out of "
                                             r"range \[-40, 40\)"):
        machine.run(program, {"ids": ids})


def _files(tmp_path, proto: onnx.ModelProto):
    model = tmp_path / "embedder.onnx"
    onnx.save(proto, model)
    calib = tmp_path / "calib.npz"
    np.savez(calib, ids=np.concatenate([s["ids"] for s in token_ids([1, 6], 4)]))
    profile, program = tmp_path / "p.json", tmp_path / "m.ember"
    assert invoke("quantize-profile", model, "--data", calib, "-o", profile).exit_code == 0
    result = invoke("compile", model, "--int8", "--profile", profile, "-o", program)
    assert result.exit_code == 0, result.output
    return model, profile, program


def test_the_cli_runs_token_ids(tmp_path) -> None:
    model, profile, program = _files(tmp_path, embedder())
    data = tmp_path / "ids.npz"
    np.savez(data, ids=np.concatenate([s["ids"] for s in token_ids([1, 6], 3, seed=4)]))
    assert invoke("simulate", program, "-i", data, "-o", tmp_path / "out.npz").exit_code == 0
    assert np.load(tmp_path / "out.npz")["y"].shape == (3, 1, 6, 8)
    assert invoke("run", model, "-i", data).exit_code == 0
    result = invoke("accuracy", model, program, "--profile", profile, "--data", data)
    assert result.exit_code == 0, result.output


def test_bad_token_ids_are_one_line(tmp_path) -> None:
    model, _, program = _files(tmp_path, embedder())
    out = tmp_path / "out.npz"
    outside = tmp_path / "outside.npz"
    np.savez(outside, ids=np.full((1, 6), VOCAB + 2, np.int64))
    assert_one_line_error(invoke("simulate", program, "-i", outside, "-o", out),
                          "input 'ids'", "index 42", "out of range [-40, 40)")
    floats = tmp_path / "floats.npz"
    np.savez(floats, ids=np.zeros((1, 6), np.float32))
    assert_one_line_error(invoke("simulate", program, "-i", floats, "-o", out),
                          "input 'ids'", "float32", "expected integers")
    assert_one_line_error(invoke("run", model, "-i", floats), "input 'ids'", "int64")
    longer = tmp_path / "longer.npz"
    np.savez(longer, ids=np.zeros((1, 9), np.int64))
    assert_one_line_error(invoke("simulate", program, "-i", longer, "-o", out),
                          "input 'ids'", "[1, 9]", "[1, 6]")
    assert not out.exists()


def _ids_read_twice() -> onnx.ModelProto:
    """Token ids gathered and also cast to float (a weight per token)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Unsqueeze", ["f", "last"], ["f3"], name="unsq"),
             helper.make_node("Mul", ["e", "f3"], ["y"], name="scale")]
    graph = helper.make_graph(
        nodes, "both", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8])],
        [onnx.numpy_helper.from_array(weights(rng, VOCAB, 8), "table"),
         onnx.numpy_helper.from_array(np.array([-1], np.int64), "last")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


def test_ids_read_as_indices_and_as_floats_are_one_line_or_the_hosts() -> None:
    """A program binds an input one way: ids both gathered and cast to float are refused in one
    line naming both readers; with --allow-host the cast runs on the host, reading the same
    int32 binding, bit-exact."""
    proto = _ids_read_twice()
    shape = [1, 6]
    profile = profile_of(proto, token_ids(shape, 4), optimized_graph(proto))
    with pytest.raises(CompileError, match=r"model input 'ids' is read both as integer indices "
                                           r"\(node\(s\) 'embed'\) and cast to float"):
        compile_model(proto, profile, CompileOptions())
    built = compile_model(proto, profile,
                          CompileOptions(backend=BackendOptions(allow_host=True)))
    assert [b.dtype for b in built.compiled.program.inputs] == ["int32"]
    check_bit_exact(built.qgraph, built.compiled, token_ids(shape, 2, seed=3))
