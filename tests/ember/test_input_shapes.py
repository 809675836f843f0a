"""--input-shape on every command that reads a model: a dynamic model compiles at the shape it
was profiled at or at the one given (only the batch axis may differ from the profile's), and
the program header records it for `ember accuracy`."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from ember.flow import CompileOptions
from simulator.program import Program
from tests.cli import DIGITS, invoke
from tests.e2e.test_batch import dynamic_batch_model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shapes")
    onnx.save(dynamic_batch_model(), tmp / "dyn.onnx")
    np.savez(tmp / "ten.npz", image=np.random.default_rng(2).standard_normal(
        (10, 3, 8, 8)).astype(np.float32))
    for name, shape in (("p1.json", ("--input-shape", "image=1,3,8,8")), ("free.json", ())):
        result = invoke("quantize-profile", tmp / "dyn.onnx", "--data", tmp / "ten.npz",
                        *shape, "-o", tmp / name)
        assert result.exit_code == 0, result.output
    return tmp


def test_the_profile_records_the_shapes_it_was_made_at(files) -> None:
    runs = json.loads((files / "p1.json").read_text())["runs"]
    assert runs[0]["options"]["input_shapes"] == {"image": [1, 3, 8, 8]}
    runs = json.loads((files / "free.json").read_text())["runs"]
    assert runs[0]["options"]["input_shapes"] == {"image": [None, 3, 8, 8]}
    shown = invoke("profile", "show", files / "free.json", "--json")
    assert json.loads(shown.stdout)["input_shapes"] == {"image": [None, 3, 8, 8]}
    table = invoke("profile", "show", files / "p1.json").stdout
    assert "10 samples of image[1,3,8,8]" in " ".join(table.split())  # the title may wrap


def test_compile_takes_the_profiled_shape_and_records_it(files) -> None:
    result = invoke("compile", files / "dyn.onnx", "--profile", files / "p1.json",
                    "-o", files / "d.ember")
    assert result.exit_code == 0, result.output
    program = Program.load(files / "d.ember")
    assert program.inputs[0].shape == (1, 3, 8, 8)
    assert program.metadata["options"]["input_shapes"] == {"image": [1, 3, 8, 8]}


def test_compile_takes_input_shape_for_another_batch(files) -> None:
    result = invoke("compile", files / "dyn.onnx", "--profile", files / "free.json",
                    "--input-shape", "image=3,3,8,8", "-o", files / "d3.ember")
    assert result.exit_code == 0, result.output
    assert Program.load(files / "d3.ember").inputs[0].shape == (3, 3, 8, 8)


def test_a_profile_without_a_batch_size_compiles_for_batch_1_and_says_so(files) -> None:
    result = invoke("compile", files / "dyn.onnx", "--profile", files / "free.json",
                    "-o", files / "free.ember")
    assert result.exit_code == 0, result.output
    assert ("dynamic input 'image' compiled as image=1,3,8,8, from the profile "
            "(--input-shape to choose)") in result.stderr
    assert Program.load(files / "free.ember").inputs[0].shape == (1, 3, 8, 8)


def test_a_shape_the_profile_was_not_made_at_is_an_error(files) -> None:
    result = invoke("compile", files / "dyn.onnx", "--profile", files / "p1.json",
                    "--input-shape", "image=4,3,9,8", "-o", files / "x.ember")
    assert result.exit_code == 2
    assert ("--input-shape image=4,3,9,8 does not fit" in result.output
            and "profiled at image=1,3,8,8: dimension 2 is 9, the profile's 8" in result.output)


def test_a_static_models_header_records_no_shapes(digits_profile, tmp_path) -> None:
    """Programs of static models stay byte-identical: nothing new in their header."""
    result = invoke("compile", DIGITS / "model.onnx", "--profile", digits_profile,
                    "-o", tmp_path / "digits.ember")
    assert result.exit_code == 0, result.output
    metadata = Program.load(tmp_path / "digits.ember").metadata
    assert "input_shapes" not in metadata["options"] and "preprocessing" not in metadata


def test_accuracy_takes_the_programs_shape_and_refuses_another(files) -> None:
    result = invoke("compile", files / "dyn.onnx", "--profile", files / "p1.json",
                    "--input-shape", "image=3,3,8,8", "-o", files / "acc3.ember")
    assert result.exit_code == 0, result.output
    result = invoke("accuracy", files / "dyn.onnx", files / "acc3.ember", "--profile",
                    files / "p1.json", "--data", files / "ten.npz", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["bit_exact"] is True and report["samples"] == 9
    assert "1 of 10 samples left out: they do not fill a batch of 3" in report["notes"][0]
    result = invoke("accuracy", files / "dyn.onnx", files / "acc3.ember", "--profile",
                    files / "p1.json", "--data", files / "ten.npz",
                    "--input-shape", "image=1,3,8,8")
    assert result.exit_code == 2
    assert "--input-shape image=1,3,8,8 differs from" in result.output
    assert "compiled for image=3,3,8,8" in result.output


def test_run_runs_every_sample_in_batches(files) -> None:
    result = invoke("run", files / "dyn.onnx", "-i", files / "ten.npz", "--input-shape",
                    "image=4,3,8,8", "-o", files / "out.npz", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["samples"] == 10
    assert "10 samples in 3 runs of the model's batch 4" in result.stderr
    assert np.load(files / "out.npz")["y"].shape == (10, 10)


def test_run_of_an_evaluation_file_runs_every_sample(tmp_path) -> None:
    """`ember run -i eval.npz` used to run the first sample only, without saying so."""
    result = invoke("run", DIGITS / "model.onnx", "-i", DIGITS / "eval.npz", "--samples", "5",
                    "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    assert "5 samples in 5 runs" in result.stderr
    assert np.load(tmp_path / "out.npz")["logits"].shape == (5, 10)


def test_simulate_and_report_check_a_given_shape_against_the_programs(files) -> None:
    result = invoke("compile", files / "dyn.onnx", "--profile", files / "p1.json",
                    "--input-shape", "image=2,3,8,8", "-o", files / "d2.ember")
    assert result.exit_code == 0, result.output
    same = invoke("simulate", files / "d2.ember", "-i", files / "ten.npz",
                  "--input-shape", "image=2,3,8,8")
    assert same.exit_code == 0, same.output
    for command in (("simulate", files / "d2.ember", "-i", files / "ten.npz"),
                    ("report", files / "d2.ember")):
        result = invoke(*command, "--input-shape", "image=4,3,8,8")
        assert result.exit_code == 2
        assert ("compiled for image=2,3,8,8, not 4,3,8,8: a program's shapes are fixed; "
                "recompile with `ember compile --input-shape image=4,3,8,8`") in result.output


def test_the_shapes_round_trip_through_the_header_and_a_forged_one_is_refused() -> None:
    options = CompileOptions(input_shapes={"image": (4, 3, 8, 8)})
    assert CompileOptions.from_header(options.to_header()) == options
    assert "input_shapes" not in CompileOptions().to_header()
    for forged in ("4,3,8,8", {"image": ["4"]}, {"image": [0, 3]}, {"image": [True]}):
        with pytest.raises(ValueError, match="input_shapes"):
            CompileOptions.from_header({"input_shapes": forged})
