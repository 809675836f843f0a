"""`ember quantize-profile` and `ember profile merge|show` through click's CliRunner."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from ember.cli import cli
from profiler import format as pf

from .conftest import samples


def ember(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def tensors(path):
    return json.loads(path.read_text())["tensors"]


def test_quantize_profile_writes_the_profile_and_a_summary(model_path, calib_path, tmp_path):
    out = tmp_path / "tiny.profile.json"
    result = ember("quantize-profile", model_path, "--data", calib_path)
    assert result.exit_code == 0, result.output
    assert "40" in result.output and "widest" in result.output and "(constant)" in result.output
    p = pf.load(out)
    assert p.samples == 40 and set(p.tensors) >= {"x", "w", "conv", "relu", "y", "zero"}
    assert p.runs[0]["data"]["kind"] == "npz"


def test_workers_give_the_same_tensors_as_one_process(model_path, calib_path, tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert ember("quantize-profile", model_path, "--data", calib_path, "-o", one).exit_code == 0
    result = ember("quantize-profile", model_path, "--data", calib_path, "-o", two,
                   "--workers", 2)
    assert result.exit_code == 0, result.output
    assert tensors(one) == tensors(two)


def test_merge_of_shards_equals_one_run_and_show_prints_it(model_path, tmp_path):
    data = samples(30)
    np.savez(tmp_path / "all.npz", x=data)
    np.savez(tmp_path / "a.npz", x=data[:11])
    np.savez(tmp_path / "b.npz", x=data[11:])
    for name in ("all", "a", "b"):
        result = ember("quantize-profile", model_path, "--data", tmp_path / f"{name}.npz",
                       "-o", tmp_path / f"{name}.json")
        assert result.exit_code == 0, result.output
    result = ember("profile", "merge", tmp_path / "a.json", tmp_path / "b.json",
                   "-o", tmp_path / "merged.json")
    assert result.exit_code == 0 and "30 samples" in result.output
    assert tensors(tmp_path / "merged.json") == tensors(tmp_path / "all.json")
    shown = ember("profile", "show", tmp_path / "merged.json")
    assert shown.exit_code == 0 and "relu" in shown.output and "activation" in shown.output
    as_json = json.loads(ember("profile", "show", tmp_path / "merged.json", "--json").output)
    assert as_json["samples"] == 30 and as_json["tensors"]["zero"]["min"] == 0.0


def test_errors_are_one_line_exit_2_and_keep_the_previous_profile(model_path, tmp_path):
    out = tmp_path / "p.json"
    out.write_text("previous")
    np.savez(tmp_path / "bad.npz", x=np.zeros((3, 2, 4, 5), np.float32))
    result = ember("quantize-profile", model_path, "--data", tmp_path / "bad.npz", "-o", out)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "input 'x' expects shape" in result.output
    assert out.read_text() == "previous"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["bad.npz", "p.json", "tiny.onnx"]


def test_merging_different_models_and_bad_files_fail_cleanly(model_path, calib_path, tmp_path):
    (tmp_path / "junk.json").write_text("{not json")
    result = ember("profile", "show", tmp_path / "junk.json")
    assert result.exit_code == 2 and "not a JSON profile" in result.output
    assert ember("quantize-profile", model_path, "--random", 4, "-o",
                 tmp_path / "r.json").exit_code == 0
    import onnx

    from .conftest import conv_model
    onnx.save(conv_model(batch=2), str(tmp_path / "other.onnx"))
    assert ember("quantize-profile", tmp_path / "other.onnx", "--random", 4, "-o",
                 tmp_path / "o.json").exit_code == 0
    result = ember("profile", "merge", tmp_path / "r.json", tmp_path / "o.json", "-o",
                   tmp_path / "m.json")
    assert result.exit_code == 2 and "different input shapes or batch size" in result.output
    assert not (tmp_path / "m.json").exists()


def test_usage_errors_and_help(model_path, calib_path):
    assert ember("quantize-profile", model_path).exit_code == 2
    assert ember("quantize-profile", model_path, "--data", calib_path, "--random", 3
                 ).exit_code == 2
    help_text = ember("quantize-profile", "--help").output
    for flag in ("--data", "--random", "--samples", "--batch", "--workers", "--seed",
                 "--allow-nonfinite", "--input-shape", "--resize", "--mean", "--std",
                 "--layout", "--channel-order", "CalibrationDataReader", "ember profile merge"):
        assert flag in help_text


def test_an_interrupted_run_leaves_no_partial_profile(model_path, tmp_path):
    out = tmp_path / "p.json"
    out.write_text("previous")
    (tmp_path / "stop.py").write_text(
        "import numpy as np\n"
        "def data():\n"
        "    yield {'x': np.zeros((1, 2, 4, 4), np.float32)}\n"
        "    raise KeyboardInterrupt\n")
    result = ember("quantize-profile", model_path, "--data", f"{tmp_path}/stop.py:data",
                   "-o", out)
    assert result.exit_code == 130
    assert out.read_text() == "previous"
    assert sorted(f.name for f in tmp_path.iterdir() if f.suffix != ".pyc" and
                  f.name != "__pycache__") == ["p.json", "stop.py", "tiny.onnx"]
