"""One data option group on every command that reads samples: the same data forms and image
preprocessing for quantize-profile, accuracy, simulate -i and run -i; a warning when images are
preprocessed otherwise than the calibration images were; every sample run, and said so."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from PIL import Image

from simulator.program import Program
from tests.cli import DIGITS, invoke
from tests.e2e.test_batch import dynamic_batch_model

IMAGENET = ("--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The dynamic-batch model, six 8x8 images, a profile of them with ImageNet normalisation
    and the program compiled from it."""
    tmp = tmp_path_factory.mktemp("data")
    onnx.save(dynamic_batch_model(), tmp / "m.onnx")
    rng = np.random.default_rng(3)
    (tmp / "images").mkdir()
    for n in range(6):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
            tmp / "images" / f"{n}.png")
    for args in (("quantize-profile", tmp / "m.onnx", "--data", tmp / "images", *IMAGENET,
                  "--input-shape", "image=1,3,8,8", "-o", tmp / "p.json"),
                 ("compile", tmp / "m.onnx", "--profile", tmp / "p.json", "-o", tmp / "m.ember")):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    return tmp


def test_the_program_records_the_profiles_preprocessing(files) -> None:
    recorded = Program.load(files / "m.ember").metadata["preprocessing"]
    assert recorded == {"resize": [8, 8], "mean": [0.485, 0.456, 0.406],
                        "std": [0.229, 0.224, 0.225], "layout": "NCHW", "channel_order": "RGB"}


def test_accuracy_preprocesses_images_and_warns_when_they_differ(files) -> None:
    common = ("accuracy", files / "m.onnx", "--profile", files / "p.json", "--data",
              files / "images", "--json")
    raw = invoke(*common)
    assert raw.exit_code == 0, raw.output
    assert ("images preprocessed with --mean 0 --std 1, but the calibration images had "
            "--mean 0.485,0.456,0.406 --std 0.229,0.224,0.225") in raw.stderr
    same = invoke(*common, *IMAGENET)
    assert same.exit_code == 0, same.output
    assert "warning" not in same.stderr
    assert json.loads(same.stdout)["samples"] == 6
    # Normalised as calibrated, the int8 model tracks fp32 far better than on raw pixels.
    sqnr = {name: json.loads(r.stdout)["outputs"][0]["sqnr_db"]
            for name, r in (("raw", raw), ("same", same))}
    assert sqnr["same"] > sqnr["raw"]


def test_simulate_takes_an_image_folder_and_checks_the_programs_preprocessing(files) -> None:
    common = ("simulate", files / "m.ember", "-i", files / "images", "-o", files / "o.npz")
    result = invoke(*common)
    assert result.exit_code == 0, result.output
    assert "calibration images had --mean 0.485,0.456,0.406" in result.stderr
    assert "6 samples in 6 runs of 1" in result.stderr
    result = invoke(*common, *IMAGENET, "--samples", "4")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    assert np.load(files / "o.npz")["y"].shape == (4, 1, 10)


def test_simulate_and_run_take_a_folder_of_arrays(files, tmp_path) -> None:
    rng = np.random.default_rng(4)
    (tmp_path / "arrays").mkdir()
    for n in range(3):
        np.save(tmp_path / "arrays" / f"{n}.npy",
                rng.standard_normal((3, 8, 8)).astype(np.float32))
    result = invoke("simulate", files / "m.ember", "-i", tmp_path / "arrays",
                    "-o", tmp_path / "o.npz")
    assert result.exit_code == 0, result.output
    assert np.load(tmp_path / "o.npz")["y"].shape == (3, 1, 10)
    result = invoke("run", files / "m.onnx", "--input-shape", "image=1,3,8,8", "-i",
                    tmp_path / "arrays", "-o", tmp_path / "r.npz")
    assert result.exit_code == 0, result.output
    assert np.load(tmp_path / "r.npz")["y"].shape == (3, 10)


def test_simulate_of_a_calibration_file_says_it_runs_every_sample(digits_profile,
                                                                  tmp_path) -> None:
    """`simulate -i calib.npz` used to report one sample's cycles without saying so."""
    assert invoke("compile", DIGITS / "model.onnx", "--profile", digits_profile,
                  "-o", tmp_path / "d.ember").exit_code == 0
    result = invoke("simulate", tmp_path / "d.ember", "-i", DIGITS / "eval.npz",
                    "--samples", "3", "--json")
    assert result.exit_code == 0, result.output
    assert "3 samples in 3 runs of 1" in result.stderr and "report times one run" in result.stderr
    assert json.loads(result.stdout)["run"]["inputs"]["runs"] == 3


@pytest.mark.parametrize("command", [
    ("quantize-profile", "{model}", "--data", "{npz}", "-o", "{tmp}/p.json"),
    ("accuracy", "{model}", "--profile", "{profile}", "--data", "{npz}"),
    ("simulate", "{program}", "-i", "{npz}"),
    ("run", "{model}", "--input-shape", "image=1,3,8,8", "-i", "{npz}"),
])
def test_image_options_on_arrays_are_said_to_do_nothing(files, tmp_path, command) -> None:
    np.savez(tmp_path / "x.npz", image=np.zeros((2, 3, 8, 8), np.float32))
    paths = {"model": files / "m.onnx", "npz": tmp_path / "x.npz", "tmp": tmp_path,
             "profile": files / "p.json", "program": files / "m.ember"}
    result = invoke(*[part.format(**paths) for part in command], "--mean", "0.5",
                    "--layout", "NHWC")
    assert result.exit_code == 0, result.output
    assert ("only a folder of images uses --mean, --layout; this data is arrays, taken as "
            "they are") in result.stderr
