"""Exact per-channel sums of each Conv/Gemm/MatMul input (`quantize-profile --channel-means`),
for the quantizer's bias correction: exact to the last unit whatever the batching, the workers
or a merge, written and read back, checked on load, none without the option."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from profiler import format as pf
from profiler import accumulate
from profiler.accumulate import exact_sums
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources.arrays import ArrayFile

C = 4


def conv_gemm_model() -> onnx.ModelProto:
    """x[batch,3,6,6] → Conv(3→C) → r; r → GlobalAveragePool → Flatten → f → Gemm(C→2)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((C, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((C, 2)).astype(np.float32), "g")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["r"], pads=[1] * 4),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "g"], ["y"])]
    graph = helper.make_graph(
        nodes, "cg", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                    ["batch", 3, 6, 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run_on(x: np.ndarray, tmp_path, name: str = "d.npz", **options) -> pf.Profile:
    model = conv_gemm_model()
    path = tmp_path / name
    np.savez(path, x=x)
    specs = input_specs(model, {})
    return profile(model, ArrayFile(path, specs), specs, RunOptions(**options))


def data(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 3, 6, 6)) * 10.0 ** rng.integers(-20, 20, (n, 3, 1, 1))
            ).astype(np.float32)


def exact(values: np.ndarray) -> list[Fraction]:
    return [sum(map(Fraction, values[:, c].astype(np.float64).tolist()), Fraction(0))
            for c in range(values.shape[1])]


def test_exact_sums_are_exact_and_add_up_over_any_split(monkeypatch) -> None:
    rows = data(40).reshape(-1, 3)
    rows[0, 0], rows[1, 1] = 1e-45, -3.4e38  # a subnormal and float32's largest magnitude
    sums = exact_sums(rows)
    assert [Fraction(s, 2**pf.SUM_EXPONENT) for s in sums] == exact(rows)
    assert [a + b for a, b in zip(exact_sums(rows[:17]), exact_sums(rows[17:]))] == sums
    monkeypatch.setattr(accumulate, "_SUM_BLOCK", 5)  # many blocks, flushed every few
    monkeypatch.setattr(accumulate, "_SUM_TERMS", 12)
    assert exact_sums(rows) == sums
    # Any axis, read in place: a (samples, channels, positions) tensor's channels.
    image = data(5)
    assert exact_sums(image, 1) == exact_sums(np.moveaxis(image, 1, -1).reshape(-1, 3))
    rows[2, 2] = np.nan
    assert exact_sums(rows) is None


def test_the_profile_records_each_readers_channel_axis_exactly(tmp_path) -> None:
    x = data(6)
    p = run_on(x, tmp_path, channel_means=True)
    assert p.tensors["x"].channel_sum == tuple(exact_sums(np.moveaxis(x, 1, -1).reshape(-1, 3)))
    np.testing.assert_allclose(p.tensors["x"].channel_means(), x.mean(axis=(0, 2, 3)),
                               rtol=1e-6)
    # A Flatten's output keeps its own sums: the Gemm reads it, not the pool.
    assert p.tensors["f"].channel_sum is not None and len(p.tensors["f"].channel_sum) == C
    assert p.tensors["r"].channel_sum is None and p.tensors["y"].channel_sum is None
    assert all(t.channel_sum is None for t in run_on(x, tmp_path, "e.npz").tensors.values())


def test_sums_are_the_same_over_batches_workers_and_merges(tmp_path) -> None:
    x = data(8)
    whole = run_on(x, tmp_path, channel_means=True)
    batched = run_on(x, tmp_path, "b.npz", channel_means=True, batch=3)
    halves = pf.merge([run_on(x[:5], tmp_path, "h1.npz", channel_means=True),
                       run_on(x[5:], tmp_path, "h2.npz", channel_means=True)])
    for other in (batched, halves):
        for name in ("x", "f"):
            assert other.tensors[name].channel_sum == whole.tensors[name].channel_sum


def test_sums_round_trip_and_bad_ones_are_refused(tmp_path) -> None:
    p = run_on(data(3), tmp_path, channel_means=True)
    path = tmp_path / "p.json"
    pf.save(p, path)
    assert pf.load(path).tensors["x"].channel_sum == p.tensors["x"].channel_sum
    doc = json.loads(path.read_text())
    for bad in ([1.5, 0, 0], [0] * 5, [10**200, 0, 0], "0"):  # 5 channels do not divide 324
        doc["tensors"]["x"]["channel_sum"] = bad
        path.write_text(json.dumps(doc))
        with pytest.raises(pf.ProfileError, match="channel_sum"):
            pf.load(path)


def test_the_command_records_them_and_show_says_so(tmp_path) -> None:
    from tests.cli import invoke
    model = tmp_path / "cg.onnx"
    onnx.save(conv_gemm_model(), str(model))
    x = data(4)
    np.savez(tmp_path / "d.npz", x=x)
    for flags, name in (((), "plain.json"), (("--channel-means",), "means.json")):
        made = invoke("quantize-profile", model, "--data", tmp_path / "d.npz", *flags,
                      "-o", tmp_path / name)
        assert made.exit_code == 0, made.output
    assert "means (--channel-means, for --bias-correction): none" in \
        invoke("profile", "show", tmp_path / "plain.json").output
    assert "for --bias-correction): 2 tensors" in \
        invoke("profile", "show", tmp_path / "means.json").output
    shown = json.loads(invoke("profile", "show", tmp_path / "means.json", "--json").output)
    np.testing.assert_allclose(shown["tensors"]["x"]["channel_means"], x.mean(axis=(0, 2, 3)),
                               rtol=1e-6)
