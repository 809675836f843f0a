"""What the fuzzers found (tests/ember/test_fuzz.py, benchmarks/fuzz.py), each reduced to the
smallest file that showed it: every one now ends in one line and exit 2.

The cases that print through onnxruntime's C++ logger or Python's warnings go through the
fuzzing sandbox, which sees the command's real stderr (file descriptor 2), as a user does."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import warnings

import numpy as np
import onnx
import pytest

from compiler.backend.codegen.host import check_segments
from compiler.errors import CompileError
from compiler.frontend.onnx import import_model
from compiler.passes.fold_batchnorm import fold_batchnorm
from ember.fuzzing import sandbox
from simulator import isa, numerics
from simulator.arch import PRESETS, Arch
from simulator.errors import SimulatorError
from simulator.program import Program
from tests import onnx_builder
from tests.cli import DIGITS, assert_one_line_error, invoke
from tests.simulator.test_program_header import forged


def test_forged_requant_shift_is_one_line():
    """A REQUANT whose parameter block (forged DRAM) holds shifts out of range: the error named
    the whole array of shifts, over several lines."""
    with pytest.raises(SimulatorError) as err:
        numerics.rounding_shift(np.arange(40), np.arange(40) * 1000)
    assert "\n" not in str(err.value)
    assert "got 1000 (and 38 more outside)" in str(err.value)


@pytest.mark.parametrize("elem_type,name", [(0, "UNDEFINED"),
                                            (onnx.TensorProto.FLOAT8E4M3FN, "FLOAT8E4M3FN")])
def test_model_input_of_an_element_type_no_data_has(tmp_path, elem_type, name):
    """quantize-profile --random on an input typed UNDEFINED (KeyError) or float8 (a buffer
    numpy cannot hash): internal errors."""
    model = onnx.load(DIGITS / "model.onnx")
    model.graph.input[0].type.tensor_type.elem_type = elem_type
    onnx.save(model, tmp_path / "m.onnx")
    result = invoke("quantize-profile", tmp_path / "m.onnx", "--random", "1", "-o",
                    tmp_path / "m.profile.json")
    assert_one_line_error(result, "model input 'input' has element type " + name)


def test_onnxruntime_warnings_stay_off_stderr(tmp_path):
    """An opset onnxruntime warns about: its log line came before ember's own message."""
    model = onnx.load(DIGITS / "model.onnx")
    model.opset_import[0].version = 6
    onnx.save(model, tmp_path / "m.onnx")
    outcome = sandbox.run(["quantize-profile", "m.onnx", "--random", "1", "-o",
                           "m.profile.json"], tmp_path, ("m.profile.json",))
    assert outcome.failure is None, outcome.stderr
    assert outcome.stderr.count("\n") == 1, outcome.stderr


def test_batchnorm_folding_that_overflows_float32_does_not_warn():
    """Folding a huge gamma over a tiny variance overflows float32: numpy's RuntimeWarning was a
    second line on stderr before the error that names the weight."""
    proto = onnx_builder.conv_bn_relu()
    for t in proto.graph.initializer:
        if t.name == "gamma":
            t.CopyFrom(onnx.numpy_helper.from_array(np.full(4, 3e38, np.float32), "gamma"))
    graph = import_model(proto)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        folded = fold_batchnorm(graph)
    assert not np.isfinite(folded.values["conv/W_bn"].const).all()


def test_npy_header_that_is_not_a_python_literal(tmp_path):
    """numpy parses the header with Python's tokenizer: an unclosed brace raised TokenError."""
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 8, 8), \n"
    (tmp_path / "x.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text))
                                     + text.encode() + bytes(256))
    result = invoke("run", DIGITS / "model.onnx", "-i", tmp_path / "x.npy")
    assert_one_line_error(result, "x.npy: cannot read array file (a malformed .npy header")


def test_architecture_file_that_is_not_utf8(tmp_path):
    (tmp_path / "a.toml").write_bytes((PRESETS / "default.toml").read_bytes() + b"# \xb2\n")
    with pytest.raises(SimulatorError, match="a.toml: not valid TOML: the file is not UTF-8"):
        Arch.load(tmp_path / "a.toml")


@pytest.fixture(scope="module")
def host_program(digits_profile, tmp_path_factory):
    """The digits CNN with its pool on the host, in a host segment."""
    path = tmp_path_factory.mktemp("findings") / "host.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "--keep-fp32", "pool", "--allow-host", "-o", path)
    assert result.exit_code == 0, result.output
    return path


@pytest.mark.parametrize("kernel_shape", ["x", {"tuple": ["a", 2]}, {"tuple": [2]}, 2.5])
def test_host_segment_attributes_are_checked_on_load(host_program, kernel_shape):
    """A host segment's node attributes go through the operator's shape rule when the program
    is loaded: a forged kernel_shape was found only when the kernel failed mid-run."""
    path = host_program
    program = Program.load(path)
    segment = json.loads(json.dumps(program.host_segments[0]))
    pool = next(n for n in segment["graph"]["nodes"] if n["name"] == "pool")
    pool["attrs"]["kernel_shape"] = kernel_shape
    forged = dataclasses.replace(program, host_segments=(segment,))
    with pytest.raises(CompileError, match=r"host.ember: host segment 0 .*node 'pool'"):
        check_segments(forged, str(path))


def _digits_with(tmp_path, change) -> str:
    model = onnx.load(DIGITS / "model.onnx")
    change(model)
    onnx.save(model, tmp_path / "m.onnx")
    return "m.onnx"


def test_onnxruntime_errors_while_running_stay_off_stderr(tmp_path):
    """A kernel that fails while running (3 input channels for a 1-channel convolution):
    onnxruntime logged the error on stderr before ember's own line said the same."""
    model = _digits_with(tmp_path, lambda m: m.graph.input[0].type.tensor_type.shape.dim[1]
                         .__setattr__("dim_value", 3))
    outcome = sandbox.run(["quantize-profile", model, "--random", "1", "-o", "m.profile.json"],
                          tmp_path, ("m.profile.json",))
    assert outcome.exit_code == 2 and outcome.failure is None, outcome.stderr
    assert "Input channels C is not equal" in outcome.stderr


@pytest.mark.parametrize("axis,size,shape", [(2, -2, "[1,1,-2,8]"), (0, 0, "[0,1,8,8]")])
def test_model_input_of_a_size_below_one(tmp_path, axis, size, shape):
    """quantize-profile --random drew samples of the declared shape: numpy's ValueError for a
    negative size; for a batch of 0, batches without samples, forever (found as a hang)."""
    model = _digits_with(tmp_path, lambda m: m.graph.input[0].type.tensor_type.shape.dim[axis]
                         .__setattr__("dim_value", size))
    outcome = sandbox.run(["quantize-profile", model, "--random", "2", "-o", "m.profile.json"],
                          tmp_path, ("m.profile.json",), timeout_s=20)
    assert outcome.exit_code == 2 and outcome.failure is None, outcome
    assert f"model input 'input' has shape {shape}: expected positive sizes" in outcome.stderr


def test_a_model_input_of_batch_zero_runs_empty(tmp_path):
    """Found by the final campaign: `ember run` on a batch of 0 (ONNX allows empty tensors)
    failed in the Conv reference's reshape; it gives the empty outputs onnxruntime gives."""
    def batch_zero(m):
        for value in (m.graph.input[0], m.graph.output[0]):
            value.type.tensor_type.shape.dim[0].dim_value = 0
    model = tmp_path / _digits_with(tmp_path, batch_zero)
    result = invoke("run", model, "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "out.npz") as out:
        assert out["logits"].shape == (0, 10)


def test_minus_one_and_a_named_dimension_fingerprint_alike():
    """A profile made from the model as loaded (-1 read as "?") must match the model as given."""
    from profiler.fingerprint import fingerprint
    minus_one, named = (onnx.load(DIGITS / "model.onnx") for _ in range(2))
    minus_one.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    named.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "?"
    assert fingerprint(minus_one) == fingerprint(named)


def test_an_old_opset_model_the_converter_cannot_infer(tmp_path):
    """Found by the final campaign: onnx's version converter raised its shape-inference error
    (a Flatten with no input, at opset 7) past ember's catch."""
    def broken(m):
        m.opset_import[0].version = 7
        flatten = next(node for node in m.graph.node if node.op_type == "Flatten")
        del flatten.input[:]
    model = tmp_path / _digits_with(tmp_path, broken)
    assert_one_line_error(invoke("show", model, "--json"), "cannot convert opset 7 to 11")


def test_a_dimension_of_minus_one_is_dynamic(tmp_path):
    """paddle2onnx writes -1 for "any" (onnxruntime reads it so): a dynamic batch that the data
    fixes when profiling, and the profile's shape when compiling."""
    model = tmp_path / _digits_with(tmp_path, lambda m: m.graph.input[0].type.tensor_type
                                    .shape.dim[0].__setattr__("dim_value", -1))
    assert invoke("quantize-profile", model, "--data", DIGITS / "calib.npz", "--samples", "8",
                  "-o", tmp_path / "p.json").exit_code == 0
    result = invoke("compile", model, "--profile", tmp_path / "p.json", "-o", tmp_path / "m.ember")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", ["empty.npy", "empty.npz"])
def test_empty_data_file(tmp_path, name):
    """np.load reads an empty file as a pickle stream and raises EOFError."""
    (tmp_path / name).write_bytes(b"")
    result = invoke("run", DIGITS / "model.onnx", "-i", tmp_path / name)
    assert_one_line_error(result, f"{name}: not a readable .npy/.npz file")


def test_empty_labels_file(tmp_path, digits_profile):
    (tmp_path / "labels.npy").write_bytes(b"")
    result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile, "--data",
                    DIGITS / "calib.npz", "--samples", "2", "--labels", tmp_path / "labels.npy")
    assert_one_line_error(result, "labels.npy: not a readable .npy/.npz file")


def test_empty_input_file_for_a_program(tmp_path, host_program):
    (tmp_path / "x.npy").write_bytes(b"")
    result = invoke("simulate", host_program, "-i", tmp_path / "x.npy")
    assert_one_line_error(result, "x.npy: cannot read inputs")


def test_accuracy_of_an_edited_program_is_the_users_error(tmp_path, digits_profile):
    """A program edited (its last requantization's output zero point moved, the checksum
    recomputed) differs from the integer reference: that was exit 1, ember's own bug,
    although ember compiles another program."""
    path = tmp_path / "digits.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "-o", path)
    assert result.exit_code == 0, result.output
    program = Program.load(path)
    insns = list(program.instructions)
    last = max(i for i, insn in enumerate(insns) if insn.op is isa.REQUANT)
    insns[last] = dataclasses.replace(insns[last], args={
        **insns[last].args, "out_offset": insns[last].args["out_offset"] + 7})
    dataclasses.replace(program, instructions=tuple(insns)).save(tmp_path / "edited.ember")
    args = ["--profile", digits_profile, "--data", DIGITS / "calib.npz", "--samples", "2"]
    assert invoke("accuracy", DIGITS / "model.onnx", path, *args).exit_code == 0
    result = invoke("accuracy", DIGITS / "model.onnx", tmp_path / "edited.ember", *args)
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("ember: error: ") and "edited.ember: the simulator differs" in last
    assert "not what ember compiles from" in last


def test_merge_keeps_no_nan_from_a_run_record(tmp_path, digits_profile):
    """A run record is carried into merged profiles as it is: a NaN in it (which Python's json
    reads) made a merged profile that no JSON reader takes, with exit 0."""
    doc = json.loads(digits_profile.read_text())
    doc["runs"][0]["note"] = {"x": [1.0, float("nan")]}
    (tmp_path / "a.profile.json").write_text(json.dumps(doc))
    result = invoke("profile", "merge", tmp_path / "a.profile.json", digits_profile,
                    "--allow-same-data", "-o", tmp_path / "m.profile.json")
    assert_one_line_error(result, "runs[0].note.x.1 = nan: expected a finite number")
    assert not (tmp_path / "m.profile.json").exists()


def test_initializer_with_more_data_than_its_shape(tmp_path):
    """onnx's checker refuses raw data too short for the dims, not too long: numpy's reshape
    then failed in the importer."""
    def change(model):
        bias = next(t for t in model.graph.initializer if t.name == "fc.bias")
        del bias.dims[:]
        bias.dims.append(2)
    model = _digits_with(tmp_path, change)
    result = invoke("show", tmp_path / model)
    assert_one_line_error(result, "initializer 'fc.bias': its data does not fit its shape [2]")


def test_model_onnxruntime_cannot_load(tmp_path):
    """An output typed UNDEFINED: ember's importer types it itself, onnxruntime refuses the
    model, and `ember run` (which checks against onnxruntime) ended in an internal error."""
    model = _digits_with(tmp_path, lambda m: m.graph.output[0].type.tensor_type
                         .__setattr__("elem_type", 0))
    result = invoke("run", tmp_path / model)
    assert_one_line_error(result, "m.onnx: onnxruntime cannot load the model")


def test_compile_for_a_vector_unit_without_an_operation_the_model_needs(tmp_path,
                                                                        digits_profile):
    """A target whose vector unit lacks REQUANT: compile wrote a program (exit 0) that the
    simulator then refused to run."""
    text = re.sub(r'(?m)^ops = \[.*\]$', 'ops = ["LUT"]', (PRESETS / "default.toml").read_text())
    (tmp_path / "a.toml").write_text(text)
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "--target", tmp_path / "a.toml", "-o", tmp_path / "m.ember")
    assert_one_line_error(result, "node 'conv1' needs the vector unit's REQUANT, which target "
                                  "'default' lacks (its vector.ops: LUT)")
    assert not (tmp_path / "m.ember").exists()


def test_accuracy_of_a_program_whose_output_is_not_the_models(tmp_path, digits_profile):
    """An output binding of another size than the model's output (the header edited, the
    checksum recomputed): numpy's reshape failed while comparing the first sample."""
    path = tmp_path / "digits.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "-o", path)
    assert result.exit_code == 0, result.output
    program = Program.load(path)
    output = dataclasses.replace(program.outputs[0], shape=(1, 9))
    dataclasses.replace(program, outputs=(output,)).save(tmp_path / "edited.ember")
    result = invoke("accuracy", DIGITS / "model.onnx", tmp_path / "edited.ember", "--profile",
                    digits_profile, "--data", DIGITS / "calib.npz", "--samples", "2")
    assert_one_line_error(result, "edited.ember: its output 'logits' of shape [1, 9] matches "
                                  "none of the model's outputs")


def test_npz_member_of_an_unknown_compression_method(tmp_path):
    """zipfile raises NotImplementedError for a compression method it does not implement."""
    with np.load(DIGITS / "calib.npz") as data:
        np.savez(tmp_path / "x.npz", input=data["input"][:2])
    raw = bytearray((tmp_path / "x.npz").read_bytes())
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # local, central header
        at = raw.index(signature) + offset
        raw[at:at + 2] = struct.pack("<H", 0xFFFF)
    (tmp_path / "x.npz").write_bytes(bytes(raw))
    result = invoke("quantize-profile", DIGITS / "model.onnx", "--data", tmp_path / "x.npz",
                    "-o", tmp_path / "x.profile.json")
    assert_one_line_error(result, "x.npz: cannot read array file (That compression method is "
                                  "not supported)")


def test_binding_scale_of_a_huge_integer(tmp_path, host_program):
    """numpy's float32 bound overflowed (a RuntimeWarning on stderr) when compared with a
    scale of 10^40 written as an integer."""
    data = forged(host_program.read_bytes(), lambda h: h["outputs"][0].update(scale=10**40))
    (tmp_path / "f.ember").write_bytes(data)
    outcome = sandbox.run(["disasm", "f.ember"], tmp_path)
    assert outcome.exit_code == 2 and outcome.failure is None, outcome.stderr
    assert "scale = 10000000000000000000000000000000000000000: expected" in outcome.stderr
