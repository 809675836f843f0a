"""The profile file: round trip, rejection of bad files, fingerprint checks, exact merging."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from profiler import format as pf
from profiler.errors import ProfileError
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources.arrays import ArrayFile

from .conftest import conv_model, samples


def run_on(model, data, tmp_path, name="d.npz"):
    path = tmp_path / name
    np.savez(path, x=data)
    specs = input_specs(model, {})
    return profile(model, ArrayFile(path, specs), specs, RunOptions())


def tensors_json(p):
    return {name: t.to_json() for name, t in p.tensors.items()}


def test_round_trip(tmp_path):
    p = run_on(conv_model(), samples(10), tmp_path)
    pf.save(p, tmp_path / "p.json")
    loaded = pf.load(tmp_path / "p.json")
    assert loaded.to_json() == p.to_json()
    assert loaded.samples == 10 and loaded.path == str(tmp_path / "p.json")
    conv = loaded.tensors["conv"]
    assert isinstance(conv.hist, np.ndarray) and len(conv.bin_edges) == len(conv.hist) + 1
    assert conv.bin_edges[0] <= conv.min and conv.max < conv.bin_edges[-1]
    assert [t.kind for t in loaded.tensors.values()][:2] == ["input", "weight"]


def test_constant_tensor_is_recorded_with_zero_range(tmp_path):
    zero = run_on(conv_model(), samples(5), tmp_path).tensors["zero"]
    assert (zero.min, zero.max, zero.count) == (0.0, 0.0, 5 * 12)
    assert zero.hist.tolist() == [60]


def test_merged_shards_equal_one_run(tmp_path):
    data = samples(30)
    model = conv_model()
    whole = run_on(model, data, tmp_path, "all.npz")
    shards = [run_on(model, part, tmp_path, f"s{i}.npz")
              for i, part in enumerate(np.split(data, [7, 19]))]
    merged = pf.merge(shards)
    assert tensors_json(merged) == tensors_json(whole)
    assert merged.samples == 30 and len(merged.runs) == 3


def test_merging_profiles_of_different_models_fails(tmp_path):
    a = run_on(conv_model(seed=0), samples(3), tmp_path)
    b = run_on(conv_model(seed=5), samples(3), tmp_path)
    with pytest.raises(ProfileError, match="different models.*different weights"):
        pf.merge([a, b])


def test_the_recorded_shapes_merge_over_the_batch_axis_only(tmp_path):
    """Ranges are per sample: shards at batch sizes 1 and 4 merge (the batch axis becomes
    unknown), shards at other image sizes do not."""
    p = run_on(conv_model(), samples(4), tmp_path)
    assert p.input_shapes == {"x": [1, 2, 4, 4]}

    def shard(shape, digest):
        run = {**p.runs[0], "options": {**p.runs[0]["options"], "input_shapes": {"x": shape}},
               "data": {**p.runs[0]["data"], "sha256": digest * 64}}
        return pf.Profile(p.model, p.tool_version, p.samples, (run,), p.tensors)
    assert pf.merge([p, shard([4, 2, 4, 4], "a")]).input_shapes == {"x": [None, 2, 4, 4]}
    with pytest.raises(ProfileError, match=r"profiled at different input shapes: "
                                           r"x\[1,2,4,4\] and x\[1,2,9,9\]"):
        pf.merge([p, shard([1, 2, 9, 9], "b")])


@pytest.mark.parametrize("text, message", [
    ('{"format": "ember.profile", "version": 1, "tool"', "not a JSON profile, or truncated"),
    ("hello", "not a JSON profile"),
    ('{"format": "ember.profile", "version": 99}', "version 99, this ember reads version 1"),
    ('{"some": "json"}', "not an ember profile"),
])
def test_bad_profile_files_are_rejected(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message) as err:
        pf.load(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_truncated_profile_and_a_tampered_histogram_are_rejected(tmp_path):
    pf.save(run_on(conv_model(), samples(4), tmp_path), tmp_path / "p.json")
    text = (tmp_path / "p.json").read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(ProfileError, match="truncated"):
        pf.load(tmp_path / "cut.json")
    doc = json.loads(text)
    doc["tensors"]["conv"]["hist"][0] += 1
    (tmp_path / "odd.json").write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match="malformed profile: tensor 'conv'"):
        pf.load(tmp_path / "odd.json")
    with pytest.raises(ProfileError, match="cannot read"):
        pf.load(tmp_path / "missing.json")


def test_check_matches_says_what_differs(tmp_path):
    model = conv_model()
    p = run_on(model, samples(3), tmp_path)
    pf.check_matches(p, model)
    edited = conv_model()
    edited.graph.node[1].op_type = "Sigmoid"
    with pytest.raises(ProfileError, match="different graph"):
        pf.check_matches(p, edited)
    with pytest.raises(ProfileError, match=r"batch size: profiled x\[1, 2, 4, 4\], model has "
                                           r"x\[8, 2, 4, 4\]"):
        pf.check_matches(p, conv_model(batch=8))
    retrained = conv_model()
    w = numpy_helper.to_array(retrained.graph.initializer[0]).copy()
    w[0, 0, 0, 0] += 1
    retrained.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w"))
    with pytest.raises(ProfileError, match="different weights"):
        pf.check_matches(p, retrained)


def test_fingerprint_ignores_node_names_and_survives_a_round_trip(tmp_path):
    model = conv_model()
    p = run_on(model, samples(2), tmp_path)
    renamed = conv_model()
    renamed.graph.node[0].name = "renamed"
    onnx.save(renamed, str(tmp_path / "m.onnx"))
    pf.check_matches(p, onnx.load(str(tmp_path / "m.onnx")))


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    path.write_text("old")
    p = run_on(conv_model(), samples(2), tmp_path)

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(pf.os, "replace", fail)
    with pytest.raises(ProfileError, match="p.json: cannot write: disk full$"):
        pf.save(p, path)
    assert path.read_text() == "old"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["d.npz", "p.json"]


def test_saving_into_a_missing_folder_is_a_profile_error(tmp_path):
    p = run_on(conv_model(), samples(2), tmp_path)
    with pytest.raises(ProfileError, match=r"p\.json: cannot write: No such file") as caught:
        pf.save(p, tmp_path / "no" / "such" / "p.json")
    assert ".tmp" not in str(caught.value)  # the temporary file is ours, not the user's
