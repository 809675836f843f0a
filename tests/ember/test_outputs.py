"""Outputs never destroy inputs, unwritable outputs are one-line errors, and a model whose
external data lies outside its folder is refused in one line by every command that loads it."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import external_data_helper

from ember.cli import cli
from tests.conftest import DIGITS
from tests.onnx_builder import conv_bn_relu


def invoke(*args) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def files(tmp_path_factory, digits_profile) -> dict[str, Path]:
    """The digits model, its data, profile, program and a saved report: made once, copied
    into each test's own folder."""
    root = tmp_path_factory.mktemp("outputs")
    paths = {"model": root / "m.onnx", "calib": root / "calib.npz", "eval": root / "eval.npz",
             "profile": root / "p.json", "program": root / "g.ember", "perf": root / "perf.json"}
    shutil.copy(DIGITS / "model.onnx", paths["model"])
    shutil.copy(DIGITS / "calib.npz", paths["calib"])
    shutil.copy(DIGITS / "eval.npz", paths["eval"])
    shutil.copy(digits_profile, paths["profile"])
    with np.load(paths["eval"]) as data:
        np.savez(root / "in.npz", input=data["input"][:1])
    paths["input"] = root / "in.npz"
    code, out = invoke("compile", paths["model"], "--profile", paths["profile"], "-o",
                       paths["program"])
    assert code == 0, out
    code, out = invoke("simulate", paths["program"], "-i", paths["input"], "--report",
                       paths["perf"])
    assert code == 0, out
    return paths


@pytest.fixture
def here(files, tmp_path) -> dict[str, Path]:
    copies = {}
    for key, path in files.items():
        copies[key] = tmp_path / path.name
        shutil.copy(path, copies[key])
    return copies


# (command line with {key} for a file, the file it must leave untouched)
OVERWRITES = [
    ("compile {model} --profile {profile} -o {model}", "model"),
    ("compile {model} --profile {profile} --emit-onnx {model}", "model"),
    ("compile {model} --profile {profile} -o {profile}", "profile"),
    ("compile {model} --profile {profile} -o {x} --emit-onnx {x}", None),
    ("quantize-profile {model} --data {calib} -o {model}", "model"),
    ("quantize-profile {model} --data {calib} -o {calib}", "calib"),
    ("profile merge {profile} {profile} -o {profile}", "profile"),
    ("simulate {program} -i {input} -o {program}", "program"),
    ("simulate {program} -i {input} --report {input}", "input"),
    ("simulate {program} -i {input} --report {x} --trace {x}", None),
    ("report {program} -o {program}", "program"),
    ("report {perf} --html {perf}", "perf"),
    ("report {program} --html {x} -o {x}", None),
    ("accuracy {model} --profile {profile} --data {eval} --html {model}", "model"),
    ("accuracy {model} {program} --profile {profile} --data {eval} --emit-onnx {program}",
     "program"),
    ("run {model} -i {input} -o {input}", "input"),
]


@pytest.mark.parametrize("line, kept", OVERWRITES, ids=[line for line, _ in OVERWRITES])
def test_an_output_over_an_input_or_another_output_is_refused(here, tmp_path, line, kept):
    here["x"] = tmp_path / "x.out"
    before = {key: path.read_bytes() for key, path in here.items() if path.exists()}
    code, out = invoke(*line.format(**here).split())
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1 and "would overwrite" in out
    if kept:
        assert out.count(str(here[kept])) == 2  # the output and the input it names
    assert {key: path.read_bytes() for key, path in here.items() if path.exists()} == before
    assert not here["x"].exists()


def test_an_output_hard_linked_to_an_input_is_refused(here, tmp_path):
    link = tmp_path / "link.onnx"
    os.link(here["model"], link)
    code, out = invoke("compile", here["model"], "--profile", here["profile"], "-o", link)
    assert code == 2 and "would overwrite" in out and str(link) in out
    assert here["model"].read_bytes() == link.read_bytes() == (DIGITS / "model.onnx").read_bytes()


def test_a_default_output_over_an_input_is_refused(here, tmp_path):
    model = tmp_path / "m.ember"  # the default program name is MODEL with .ember: itself
    shutil.copy(here["model"], model)
    code, out = invoke("compile", model, "--profile", here["profile"])
    assert code == 2 and "would overwrite" in out, out
    assert model.read_bytes() == here["model"].read_bytes()


WRITES = [
    "compile {model} --profile {profile} -o {o}",
    "compile {model} --profile {profile} -o {x} --emit-onnx {o}",
    "quantize-profile {model} --data {calib} -o {o}",
    "simulate {program} -i {input} -o {o}",
    "simulate {program} -i {input} --report {o}",
    "simulate {program} -i {input} --trace {o}",
    "report {perf} --html {o}",
    "report {perf} -o {o}",
    "accuracy {model} --profile {profile} --data {eval} --samples 4 --html {o}",
    "accuracy {model} --profile {profile} --data {eval} --samples 4 --emit-onnx {o}",
    "run {model} -o {o}",
]


@pytest.mark.parametrize("line", WRITES)
def test_an_unwritable_output_is_one_line(here, tmp_path, monkeypatch, line):
    """As if the folder were read-only: no file can be made in it (chmod does not stop root,
    who runs the tests here)."""
    out_dir = tmp_path / "ro"
    out_dir.mkdir()
    here["o"], here["x"] = out_dir / "out.file", tmp_path / "x.out"
    mkstemp = tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == out_dir:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
        return mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    code, out = invoke(*line.format(**here).split())
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1 and "cannot write" in out and str(here["o"]) in out
    assert list(out_dir.iterdir()) == []  # no output, no temporary file


def test_a_write_that_fails_midway_is_one_line(here, tmp_path, monkeypatch):
    """A full disk or a permission lost after the temporary file was made: still one line."""
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    code, out = invoke("report", here["perf"], "-o", tmp_path / "r.json")
    assert code == 2 and "cannot write" in out and len(out.strip().splitlines()) == 1, out
    assert not any(p.name.startswith(".r.json") for p in tmp_path.iterdir())


@pytest.fixture
def escaping_model(tmp_path) -> Path:
    """A model whose weights are external data in a file beside its folder, not inside it."""
    proto = conv_bn_relu()
    weight = next(t for t in proto.graph.initializer if t.name == "w")
    (tmp_path / "w.bin").write_bytes(weight.raw_data or onnx.numpy_helper.to_array(weight)
                                     .tobytes())
    external_data_helper.set_external_data(weight, location="../w.bin")
    weight.data_location = onnx.TensorProto.EXTERNAL
    weight.ClearField("raw_data")
    weight.ClearField("float_data")
    (tmp_path / "model").mkdir()
    path = tmp_path / "model" / "m.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.mark.parametrize("command", [["show"], ["run"], ["show", "--no-optimize"]])
def test_external_data_outside_the_folder_is_one_line(escaping_model, command):
    code, out = invoke(*command, escaping_model)
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1 and str(escaping_model) in out
