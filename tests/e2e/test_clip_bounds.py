"""Clip whose bounds are computed from constants (Constant nodes, Cast, Squeeze: constant folding
resolves them) is a lookup table on the accelerator, bit-exactly; a bound computed at run time
has no int8 form: one line naming the node and what lowers, and --allow-host keeps it in fp32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from compiler.backend.program import BackendOptions
from compiler.graph.evaluate import evaluate
from ember import ort
from ember.flow import CompileOptions, compile_model, optimized_graph
from tests.cli import assert_one_line_error, invoke
from tests.e2e.flow import check_bit_exact, compile_and_check, samples
from tests.onnx_builder import model, weights
from tests.quantizer.util import profile_of

SHAPE = [1, 3, 6, 6]


def clip_model(run_time_max: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x → Conv → Clip(lo, hi): lo an int64 Constant cast to float, hi a [1] Constant squeezed
    (or, `run_time_max`, the mean of the Conv's output)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Constant", [], ["lo64"], name="lo_const",
                              value=helper.make_tensor("v", TensorProto.INT64, [], [0])),
             helper.make_node("Cast", ["lo64"], ["lo"], name="lo_cast", to=TensorProto.FLOAT),
             helper.make_node("Constant", [], ["hi1"], name="hi_const",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
             helper.make_node("Squeeze", ["hi1"], ["hi"], name="hi_squeeze")]
    if run_time_max:
        nodes += [helper.make_node("ReduceMean", ["c"], ["peak"], name="peak", keepdims=0)]
    nodes += [helper.make_node("Clip", ["c", "lo", "peak" if run_time_max else "hi"], ["y"],
                               name="clip")]
    return model(nodes, {"x": SHAPE}, {"y": [1, 8, 6, 6]}, {"w": weights(rng, 8, 3, 3, 3)})


@pytest.mark.parametrize("run_time_max", [False, True])
def test_clip_with_computed_bounds_equals_onnxruntime_in_fp32(run_time_max: bool) -> None:
    proto = clip_model(run_time_max)
    session = ort.session(proto)
    for feed in samples({"x": SHAPE}, 3):
        np.testing.assert_allclose(evaluate(optimized_graph(proto), feed)["y"],
                                   ort.run(session, feed)["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("preset", ["edge", "default"])
def test_clip_with_bounds_constant_folding_computes_runs_on_the_accelerator(preset) -> None:
    compiled, _ = compile_and_check(clip_model(), preset)
    assert compiled.program.host_segments == ()


def test_a_run_time_clip_bound_is_one_line_naming_the_node(tmp_path) -> None:
    path, data = tmp_path / "clip.onnx", tmp_path / "calib.npz"
    onnx.save(clip_model(run_time_max=True), path)
    np.savez(data, x=np.stack([s["x"] for s in samples({"x": SHAPE}, 4)]))
    assert invoke("quantize-profile", path, "--data", data, "-o", tmp_path / "p.json") \
        .exit_code == 0
    result = invoke("compile", path, "--int8", "--profile", tmp_path / "p.json",
                    "-o", tmp_path / "m.ember")
    assert_one_line_error(result, "node 'clip' (Clip)", "its max input 'peak' is computed at "
                          "run time", "only a constant one, or one that constant folding "
                          "computes, has an int8 form")
    assert not (tmp_path / "m.ember").exists()


def test_a_run_time_clip_bound_runs_on_the_host_with_allow_host() -> None:
    proto = clip_model(run_time_max=True)
    profile = profile_of(proto, samples({"x": SHAPE}, 8), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(backend=BackendOptions(allow_host=True)),
                          "edge")
    assert [s["nodes"] for s in built.compiled.summary.host_segments] == [
        ["c/DequantizeLinear", "peak/DequantizeLinear", "clip"]]
    check_bit_exact(built.qgraph, built.compiled, samples({"x": SHAPE}, 2, 1))
