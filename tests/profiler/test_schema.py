"""A profile is checked key by key on load: every bad field is a one-line ProfileError naming
the file, the tensor and the key, never an internal error or a silently wrong program; and
merging refuses to count the same data twice."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.cli import cli
from profiler import format as pf
from profiler.errors import ProfileError

from .conftest import conv_model, samples
from .test_format import run_on


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict:
    """A real profile of the tiny conv model, as its JSON document."""
    folder = tmp_path_factory.mktemp("schema")
    pf.save(run_on(conv_model(), samples(6), folder), folder / "p.json")
    return json.loads((folder / "p.json").read_text())


def _write(tmp_path, doc) -> str:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _negative_bin(doc):
    """A histogram with one negative bin, its total kept: what entropy calibration would read."""
    hist = doc["tensors"]["conv"]["hist"]
    moved = hist[1] + 3
    hist[1] -= moved
    hist[2] += moved


def _swap_min_max(doc):
    t = doc["tensors"]["y"]
    t["min"], t["max"] = t["max"], t["min"]


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def mutate(doc):
        node = doc
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return mutate


BAD = [
    ("min NaN", _set("tensors", "conv", "min", float("nan")), "tensor 'conv': min = nan"),
    ("min -Inf", _set("tensors", "conv", "min", float("-inf")), "tensor 'conv': min = -inf"),
    ("max Inf", _set("tensors", "conv", "max", float("inf")), "tensor 'conv': max = inf"),
    ("string min", _set("tensors", "conv", "min", "-1.5"), "tensor 'conv': min = '-1.5'"),
    ("tiny bins", _set("tensors", "conv", "bin_width_log2", -5000),
     "tensor 'conv': bin_width_log2 = -5000"),
    ("float count", _set("tensors", "conv", "count", 1e300), "tensor 'conv': count = 1e+300"),
    ("huge count", _set("tensors", "conv", "count", 10**30), "tensor 'conv': count"),
    ("tensors as a list", _set("tensors", []), "tensors = []: expected an object"),
    ("min > max", _swap_min_max, "tensor 'y': min"),
    ("negative bin", _negative_bin, "tensor 'conv': hist = "),
    ("bool count", _set("tensors", "conv", "nonfinite", True), "tensor 'conv': nonfinite"),
    ("bad kind", _set("tensors", "conv", "kind", "bias"), "tensor 'conv': kind = 'bias'"),
    ("unknown key", _set("tensors", "conv", "scale", 1.0), "tensor 'conv': unknown key 'scale'"),
    ("first bin", _set("tensors", "conv", "first_bin", 10**40), "tensor 'conv': first_bin"),
    ("negative samples", _set("samples", -6), "samples = -6"),
    ("samples beyond the runs", _set("samples", 12), "samples = 12, but its runs hold 6"),
    ("runs as a string", _set("runs", "x"), "runs = 'x'"),
    ("run digest", _set("runs", 0, "data", "sha256", 5), "runs[0].data.sha256 = 5"),
    ("shapes", _set("model", "input_shapes", "x", "1,2"), "model.input_shapes"),
    ("run shapes", _set("runs", 0, "options", "input_shapes", {"x": [1, "3"]}),
     "runs[0].options.input_shapes = {'x': [1, '3']}: expected an object of lists"),
    ("run without options", lambda doc: doc["runs"][0].pop("options"),
     "runs[0].options = None: expected an object"),
    ("tool", _set("tool", "version", 1), "tool.version = 1"),
]


@pytest.mark.parametrize("mutate, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_bad_field_is_a_one_line_error_naming_file_tensor_and_key(good, tmp_path, mutate,
                                                                       message):
    doc = copy.deepcopy(good)
    mutate(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(ProfileError) as err:
        pf.load(path)
    text = str(err.value)
    assert text.startswith(f"{path}: malformed profile: ") and "\n" not in text, text
    assert message in text, text


def test_a_missing_tensor_key_and_an_overlong_integer(good, tmp_path):
    doc = copy.deepcopy(good)
    del doc["tensors"]["relu"]["hist"]
    with pytest.raises(ProfileError, match="tensor 'relu': missing key 'hist'"):
        pf.load(_write(tmp_path, doc))
    text = json.dumps(good).replace('"samples": 6', '"samples": 1' + "0" * 5000, 1)
    (tmp_path / "long.json").write_text(text)
    with pytest.raises(ProfileError, match="not a JSON profile"):
        pf.load(tmp_path / "long.json")


def test_the_cli_exits_2_with_one_line(good, tmp_path):
    doc = copy.deepcopy(good)
    doc["tensors"]["conv"]["max"] = float("nan")
    path = _write(tmp_path, doc)
    result = CliRunner().invoke(cli, ["profile", "show", path])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "tensor 'conv': max = nan" in result.output


def _leaves(doc) -> list[tuple]:
    """Paths to the fields worth mutating: every key, but only a few bins of each histogram."""
    found = []

    def walk(node, path):
        found.append(path)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, path + (key,))
        elif isinstance(node, list):
            picks = range(len(node)) if len(node) <= 3 else (0, 1, len(node) // 2, len(node) - 1)
            for i in picks:
                walk(node[i], path + (i,))
    walk(doc, ())
    return found[1:]


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=5)


@settings(max_examples=100)
@given(data=st.data())
def test_a_mutated_profile_loads_consistently_or_fails_in_one_line(good, tmp_path_factory, data):
    doc = copy.deepcopy(good)
    leaves = _leaves(doc)
    # Mostly the fields of tensors that hold values, where a wrong number does the most harm.
    fields = [path for path in leaves if len(path) in (3, 4) and path[0] == "tensors"
              and doc["tensors"][path[1]]["count"]]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(fields) | st.sampled_from(fields)
                         | st.sampled_from(leaves))
        node = doc
        try:
            for key in path[:-1]:
                node = node[key]
            if data.draw(st.booleans()) and isinstance(node[path[-1]], (int, float)):
                node[path[-1]] = node[path[-1]] + data.draw(st.sampled_from([-1, 1, -0.5, 2**60]))
            else:
                node[path[-1]] = data.draw(JSON)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced this field's parent
    folder = tmp_path_factory.mktemp("fuzz")
    path = _write(folder, doc)
    try:
        loaded = pf.load(path)
    except ProfileError as err:
        assert str(err).startswith(path) and "\n" not in str(err)
        return
    # Accepted: it must be a profile ember itself could have written.
    for name, t in loaded.tensors.items():
        assert t.count == int(t.hist.sum()) and (t.hist >= 0).all(), name
        if t.count:
            assert t.min <= t.max and t.bin_edges[0] <= t.min and t.max < t.bin_edges[-1]
    pf.save(loaded, folder / "again.json")
    assert pf.load(folder / "again.json").to_json() == loaded.to_json()


def test_merging_a_profile_with_itself_is_refused_unless_asked(tmp_path):
    p = run_on(conv_model(), samples(5), tmp_path)
    with pytest.raises(ProfileError, match="same data .*--allow-same-data"):
        pf.merge([p, p])
    assert pf.merge([p, p], allow_same_data=True).samples == 10
    other = run_on(conv_model(), samples(5, seed=2), tmp_path, "o.npz")
    with pytest.raises(ProfileError, match="same data"):
        pf.merge([pf.merge([p, other]), p])


def test_merge_command_refuses_the_same_file_twice(tmp_path):
    pf.save(run_on(conv_model(), samples(5), tmp_path), tmp_path / "a.json")
    a, out = tmp_path / "a.json", tmp_path / "m.json"
    result = CliRunner().invoke(cli, ["profile", "merge", str(a), str(a), "-o", str(out)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "same data" in result.output and not out.exists()
    result = CliRunner().invoke(cli, ["profile", "merge", str(a), str(a), "-o", str(out),
                                      "--allow-same-data"])
    assert result.exit_code == 0 and "10 samples" in result.output
