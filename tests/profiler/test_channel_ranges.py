"""A LayerNorm output's range per channel of its last axis (`TensorStats.channel_min`), for the
quantizer's smoothing: recorded by the profiler, exact over any batching and merge, written
and read back, checked on load; none for other tensors or for a Reshape of the norm's output."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ember.cluster import Cluster
from ember.profiling import profile
from profiler import format as pf
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources.arrays import ArrayFile

S, C = 5, 6


def norm_model() -> onnx.ModelProto:
    """x[batch,S,C] -> LayerNormalization -> y; y reshaped to [batch, S*C] -> flat."""
    gamma = np.arange(1, C + 1, dtype=np.float32)
    inits = [numpy_helper.from_array(gamma, "gamma"),
             numpy_helper.from_array(np.zeros(C, np.float32), "beta"),
             numpy_helper.from_array(np.array([0, S * C], np.int64), "shape")]
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"]),
             helper.make_node("Reshape", ["y", "shape"], ["flat"])]
    graph = helper.make_graph(
        nodes, "norm", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                      ["batch", S, C])],
        [helper.make_tensor_value_info("flat", onnx.TensorProto.FLOAT, ["batch", S * C])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run_on(data: np.ndarray, tmp_path, name: str = "d.npz", cluster: str = "local", **options):
    model = norm_model()
    path = tmp_path / name
    np.savez(path, x=data)
    specs = input_specs(model, {})
    with Cluster(cluster) as where:
        return profile(where, model, ArrayFile(path, specs), specs, RunOptions(**options))


def data(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, S, C)).astype(np.float32)


def test_a_norm_output_has_its_channels_ranges_and_nothing_else_does(tmp_path):
    x = data(9)
    p = run_on(x, tmp_path)
    mean, std = x.mean(-1, keepdims=True), np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    want = ((x - mean) / std * np.arange(1, C + 1)).reshape(-1, C)
    y = p.tensors["y"]
    np.testing.assert_allclose(y.channel_min, want.min(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.channel_max, want.max(0), rtol=1e-5, atol=1e-5)
    assert y.channel_min.min() == pytest.approx(y.min) and \
        y.channel_max.max() == pytest.approx(y.max)
    assert p.tensors["flat"].channel_min is None and p.tensors["x"].channel_min is None


def test_channel_ranges_are_exact_over_batches_workers_and_merges(tmp_path):
    x = data(12)
    whole = run_on(x, tmp_path, "all.npz")
    for options in ({"batch": 1}, {"batch": 5}, {"cluster": "local:2"}):
        other = run_on(x, tmp_path, "again.npz", **options)
        np.testing.assert_array_equal(other.tensors["y"].channel_min,
                                      whole.tensors["y"].channel_min)
        np.testing.assert_array_equal(other.tensors["y"].channel_max,
                                      whole.tensors["y"].channel_max)
    shards = [run_on(part, tmp_path, f"s{i}.npz") for i, part in enumerate(np.split(x, [4]))]
    merged = pf.merge(shards)
    assert merged.tensors["y"].to_json() == whole.tensors["y"].to_json()


def test_channel_ranges_round_trip_and_malformed_ones_are_refused(tmp_path):
    p = run_on(data(4), tmp_path)
    pf.save(p, tmp_path / "p.json")
    loaded = pf.load(tmp_path / "p.json")
    assert loaded.to_json() == p.to_json()
    doc = json.loads((tmp_path / "p.json").read_text())
    y = doc["tensors"]["y"]
    for change, message in ((lambda t: t.pop("channel_max"), "channel_min"),
                            (lambda t: t.update(channel_min=t["channel_max"][::-1] + [0.0]),
                             "channel_min/channel_max"),
                            (lambda t: t.update(channel_max=[v + 1e6 for v in t["channel_max"]]),
                             r"within \[min, max\]"),
                            (lambda t: t.update(channel_min=["a"] * C), "finite numbers")):
        bad = json.loads(json.dumps(doc))
        change(bad["tensors"]["y"])
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(Exception, match=message):
            pf.load(path)
    assert y["channel_min"] and len(y["channel_min"]) == C
