"""A new user's path: reaching `ember` after `make demo`, output paths checked before any work,
output modes, unwrapped tables when piped, and what --help documents (exit codes, examples)."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.cli import DIGITS, invoke
from tests.onnx_builder import conv_bn_relu

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_says_how_to_reach_ember_before_its_first_bare_command() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.DOTALL)
    assert blocks[0].splitlines()[0].startswith("make demo")  # still the one-command demo
    typed = [block.start() for block in re.finditer(r"```sh\n(.*?)```", readme, re.DOTALL)
             if re.search(r"^ember ", block.group(1), re.MULTILINE)]
    assert typed and readme.index("source .venv/bin/activate") < typed[0]
    assert ".venv/bin/ember" in readme


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_ends_by_saying_how_to_reach_ember() -> None:
    # --no-print-directory: under `make test` (MAKELEVEL 1) make would add "Leaving directory".
    dry = subprocess.run(["make", "--no-print-directory", "-n", "demo"], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert "source .venv/bin/activate" in "".join(dry.stdout.splitlines()[-2:])  # its last words


@pytest.fixture(scope="module")
def program(tmp_path_factory, digits_profile) -> Path:
    path = tmp_path_factory.mktemp("program") / "digits.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--profile", digits_profile, "-o", path)
    assert result.exit_code == 0, result.output
    return path


# Each command with an output in a folder that does not exist ({missing}), and the function
# that would do its work, as the command looks it up: it must never be called.
EARLY = [
    ("simulate {program} -i {input} -o {missing}", "simulator.machine", "run"),
    ("simulate {program} -i {input} --report {missing}", "simulator.machine", "run"),
    ("simulate {program} -i {input} --trace {missing}", "simulator.machine", "run"),
    ("quantize-profile {model} --data {calib} -o {missing}", "ember.commands.profile",
     "profile_model"),
    ("compile {model} --profile {profile} -o {missing}", "ember.commands.compile",
     "compile_model"),
    ("compile {model} --profile {profile} -o {x} --emit-onnx {missing}",
     "ember.commands.compile", "compile_model"),
    ("report {program} --html {missing}", "simulator.machine", "run"),
    ("report {program} -o {missing}", "simulator.machine", "run"),
    ("accuracy {model} --profile {profile} --data {eval} --html {missing}",
     "ember.commands.accuracy", "measure"),
    ("profile merge {profile} {profile} --allow-same-data -o {missing}", "profiler.format",
     "merge"),
    ("run {model} -o {missing}", "ember.commands.run", "evaluate"),
]


@pytest.mark.parametrize("line, module, work", EARLY, ids=[line for line, _, _ in EARLY])
def test_an_output_in_a_missing_folder_fails_before_any_work(program, digits_profile, tmp_path,
                                                             monkeypatch, line, module,
                                                             work) -> None:
    def never(*args, **kwargs):
        raise AssertionError(f"{module}.{work} ran before the output path was checked")

    monkeypatch.setattr(importlib.import_module(module), work, never)
    np.savez(tmp_path / "in.npz", input=np.zeros((1, 1, 8, 8), np.float32))
    missing = tmp_path / "no" / "such" / "out.file"
    paths = {"program": program, "input": tmp_path / "in.npz", "missing": missing,
             "model": DIGITS / "model.onnx", "calib": DIGITS / "calib.npz",
             "eval": DIGITS / "eval.npz", "profile": digits_profile, "x": tmp_path / "x.out"}
    result = invoke(*line.format(**paths).split())
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"ember: error: {missing}: directory {missing.parent} " \
                                    f"does not exist"


def test_every_output_gets_the_mode_open_would_give(program, digits_profile, tmp_path) -> None:
    old = os.umask(0o027)
    try:
        np.savez(tmp_path / "in.npz", input=np.zeros((1, 1, 8, 8), np.float32))
        lines = [
            ["quantize-profile", DIGITS / "model.onnx", "--data", DIGITS / "calib.npz", "-o",
             tmp_path / "p.json"],
            ["profile", "merge", digits_profile, digits_profile, "--allow-same-data", "-o",
             tmp_path / "m.json"],
            ["compile", DIGITS / "model.onnx", "--profile", digits_profile, "-o",
             tmp_path / "g.ember", "--emit-onnx", tmp_path / "q.onnx"],
            ["simulate", program, "-i", tmp_path / "in.npz", "-o", tmp_path / "o.npz",
             "--report", tmp_path / "perf.json", "--trace", tmp_path / "t.json"],
            ["report", tmp_path / "perf.json", "--html", tmp_path / "perf.html", "-o",
             tmp_path / "r.json"],
            ["run", DIGITS / "model.onnx", "-o", tmp_path / "run.npz"],
            ["accuracy", DIGITS / "model.onnx", "--profile", digits_profile, "--data",
             DIGITS / "eval.npz", "--samples", "4", "--html", tmp_path / "a.html"],
            ["examples", "build", "--only", "mlp", "--out", tmp_path / "ex"],
        ]
        for line in lines:
            result = invoke(*line)
            assert result.exit_code == 0, (line, result.output)
    finally:
        os.umask(old)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "in.npz"]
    assert len(written) == 12
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == \
        {p.name: oct(0o640) for p in written}


def test_tables_do_not_wrap_when_piped(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    long_name = "features.block_17.depthwise_separable.pointwise_projection.output_activation"
    proto = conv_bn_relu()
    proto.graph.node[-1].output[0] = proto.graph.output[0].name = long_name
    onnx.save(proto, tmp_path / "m.onnx")
    result = invoke("run", tmp_path / "m.onnx")  # CliRunner's stdout is not a terminal
    assert result.exit_code == 0, result.output
    assert any(long_name in line for line in result.output.splitlines()), result.output


def test_examples_build_offers_every_zoo_model() -> None:
    from examples.zoo import MODELS
    result = invoke("examples", "build", "--help")
    assert all(name in result.output for name in MODELS)


def test_help_documents_the_exit_codes() -> None:
    text = " ".join(invoke("--help").output.split())
    assert "Exit codes: 0 success, 1 internal error, 2 bad usage or input, 3 an accuracy gate " \
           "failed (the report is still written), 130 interrupted (Ctrl-C)." in text


def test_an_option_the_program_fixes_must_match_it(program, digits_profile) -> None:
    common = ("accuracy", DIGITS / "model.onnx", program, "--profile", digits_profile, "--data",
              DIGITS / "eval.npz", "--samples", 2)
    result = invoke(*common, "--calibration", "mse", "--per-tensor")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"ember: error: {program}: --calibration mse was given, but the program was compiled "
        f"with --calibration minmax; --per-tensor was given, but the program was compiled with "
        f"--per-channel; drop them, or compile the program again with them")
    assert "--keep-fp32 fc was given, but the program was compiled with no --keep-fp32" in \
        invoke(*common, "--keep-fp32", "fc").output
    agreeing = invoke(*common, "--calibration", "minmax", "--per-channel", "--json")
    assert agreeing.exit_code == 0, agreeing.output


def test_int8_is_the_documented_default_and_changes_nothing(digits_profile, program,
                                                            tmp_path) -> None:
    help_text = " ".join(invoke("compile", "--help").output.split())
    assert "--int8 Quantize weights and activations to int8 for the accelerator: the default " \
           "and only precision" in help_text
    flagged = tmp_path / "flagged.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "-o", flagged)
    assert result.exit_code == 0, result.output
    assert flagged.read_bytes() == program.read_bytes()


def test_simulate_and_report_spell_their_outputs_alike(program, tmp_path) -> None:
    np.savez(tmp_path / "in.npz", input=np.zeros((1, 1, 8, 8), np.float32))
    common = ("simulate", program, "-i", tmp_path / "in.npz")
    assert invoke(*common, "--report", tmp_path / "s.json", "--html",
                  tmp_path / "s.html").exit_code == 0
    assert invoke(*common, "--report", tmp_path / "old.html").exit_code == 0  # older spelling
    assert invoke("report", tmp_path / "s.json", "--report", tmp_path / "r.json", "--html",
                  tmp_path / "r.html").exit_code == 0
    for page in ("s.html", "old.html", "r.html"):
        assert (tmp_path / page).read_text().lstrip().lower().startswith("<!doctype html")
    assert json.loads((tmp_path / "r.json").read_text())["cycles"] == \
        json.loads((tmp_path / "s.json").read_text())["cycles"]


def test_profile_merge_has_a_default_output(digits_profile, tmp_path) -> None:
    first = tmp_path / "part1.json"
    shutil.copy(digits_profile, first)
    result = invoke("profile", "merge", first, digits_profile, "--allow-same-data")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "part1.merged.json").is_file()
    assert str(tmp_path / "part1.merged.json") in result.output


def test_examples_build_never_names_its_temporary_file(tmp_path, monkeypatch) -> None:
    import errno
    import tempfile

    def refuse(*args, dir=None, prefix="", suffix="", **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES),
                              f"{dir}/{prefix}abc{suffix}")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    result = invoke("examples", "build", "--only", "mlp", "--out", tmp_path)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == \
        f"ember: error: {tmp_path}: cannot write example 'mlp': Permission denied"


@pytest.mark.parametrize("line", [
    "compile {model} --profile {profile} -o {x} --emit-onnx {o}",
    "quantize-profile {model} --data {calib} -o {o}",
    "simulate {program} -i {input} --trace {o}",
    "report {program} --html {o}",
    "run {model} -o {o}",
])
def test_a_failed_rename_names_the_output_not_the_temporary_file(program, digits_profile,
                                                                 tmp_path, monkeypatch,
                                                                 line) -> None:
    """os.replace's own message names both files, the temporary one first."""
    import errno

    def cross_device(source, target):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(source), None, str(target))

    np.savez(tmp_path / "in.npz", input=np.zeros((1, 1, 8, 8), np.float32))
    paths = {"program": program, "input": tmp_path / "in.npz", "o": tmp_path / "out.file",
             "model": DIGITS / "model.onnx", "calib": DIGITS / "calib.npz",
             "profile": digits_profile, "x": tmp_path / "x.out"}
    monkeypatch.setattr(os, "replace", cross_device)
    result = invoke(*line.format(**paths).split())
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"ember: error: {paths['o']}: cannot write: " \
                                    f"{os.strerror(errno.EXDEV)}"
    assert not any(".tmp" in p.name for p in tmp_path.iterdir())


def test_a_saved_report_refuses_another_hazard_check(tmp_path, program) -> None:
    np.savez(tmp_path / "in.npz", input=np.zeros((1, 1, 8, 8), np.float32))
    perf = tmp_path / "perf.json"
    assert invoke("simulate", program, "-i", tmp_path / "in.npz", "--report", perf).exit_code == 0
    result = invoke("report", perf, "--no-check-hazards")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"ember: error: {perf}: --no-check-hazards was given, but the report was simulated "
        f"with --check-hazards; drop it, or simulate again with it")
    assert invoke("report", perf, "--check-hazards").exit_code == 0
