"""Sizes declared by a file (an ONNX input shape, an .npy header) are checked before anything is
allocated: each of these once ended in a MemoryError (exit 1)."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.cli import invoke
from tests.conftest import DIGITS
from tests.onnx_builder import model


def lying_npy(shape, dtype="<f4") -> bytes:
    """An .npy whose header declares `shape` over 1 KiB of data."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + bytes(1024)


def assert_one_line_exit_2(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.strip().count("\n") == 0


@pytest.fixture(scope="module")
def digits_program(digits_profile, tmp_path_factory):
    program = tmp_path_factory.mktemp("huge") / "digits.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "-o", program)
    assert result.exit_code == 0, result.output
    return program


@pytest.mark.parametrize("command", [("run",), ("quantize-profile", "--random", "1")])
def test_a_huge_model_input_names_the_input(tmp_path, command) -> None:
    path = tmp_path / "big.onnx"
    onnx.save(model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                    {"x": [1, 10**6, 10**6]}, {"y": [1, 10**6, 10**6]}), path)
    result = invoke(command[0], path, *command[1:], *(("-o", tmp_path / "p.json")
                                                      if command[0] != "run" else ()))
    assert_one_line_exit_2(result, "big.onnx: input 'x' is too large: shape [1, 1000000, "
                                   "1000000] of float32 is 4,000,000,000,000 bytes, over the "
                                   "limit of 4 GiB for one tensor")


def test_run_refuses_an_npy_declaring_more_than_it_holds(tmp_path) -> None:
    (tmp_path / "lie.npy").write_bytes(lying_npy((10**12, 1, 8, 8)))
    result = invoke("run", DIGITS / "model.onnx", "-i", tmp_path / "lie.npy")
    assert_one_line_exit_2(result, "lie.npy: its header declares shape [1000000000000, 1, 8, 8]"
                                   " of float32 (256,000,000,000,000 bytes), but the file holds "
                                   "1,024 bytes of data")


def test_simulate_refuses_an_npz_declaring_more_than_it_holds(digits_program, tmp_path) -> None:
    with zipfile.ZipFile(tmp_path / "lie.npz", "w") as archive:
        archive.writestr("input.npy", lying_npy((10**12, 1, 8, 8)))
    result = invoke("simulate", digits_program, "-i", tmp_path / "lie.npz")
    assert_one_line_exit_2(result, "lie.npz: array 'input' declares shape [1000000000000, 1, 8, "
                                   "8] of float32")


def test_an_array_over_the_tensor_limit_is_refused_before_loading(digits_program,
                                                                  tmp_path) -> None:
    # A sparse file: the bytes the header declares are there, but reading them all at once
    # would be one 5 GiB array.
    path = tmp_path / "sparse.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (5 << 28,)})
        f.truncate(f.tell() + (5 << 30))
    result = invoke("simulate", digits_program, "-i", path)
    assert_one_line_exit_2(result, "sparse.npy: its array is too large: shape [1342177280] of "
                                   "float32 is 5,368,709,120 bytes, over the limit")


@pytest.mark.parametrize("option", ["--labels", "--data"])
def test_accuracy_refuses_files_declaring_more_than_they_hold(digits_profile, tmp_path,
                                                              option) -> None:
    if option == "--labels":
        (tmp_path / "lie.npy").write_bytes(lying_npy((10**12,), "<i8"))
        extra = ("--data", DIGITS / "eval.npz", "--labels", tmp_path / "lie.npy")
        message = "lie.npy: its header declares shape [1000000000000] of int64"
    else:
        with zipfile.ZipFile(tmp_path / "lie.npz", "w") as archive:
            archive.writestr("input.npy", lying_npy((10**12,)))
        extra = ("--data", tmp_path / "lie.npz")
        message = "lie.npz: array 'input' declares shape [1000000000000] of float32"
    result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile, *extra)
    assert_one_line_exit_2(result, message)
