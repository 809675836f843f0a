"""The .ember file: round trip, byte-identical saves, and rejection of damaged files."""

import dataclasses
import struct

import pytest

from simulator import program as program_file
from simulator.errors import SimulatorError
from simulator.program import Program
from tests.simulator.sim_programs import gemm_data, gemm_program


@pytest.fixture
def prog():
    return gemm_program(*gemm_data())


def test_round_trip(tmp_path, prog):
    path = tmp_path / "m.ember"
    prog.save(path)
    back = Program.load(path)
    assert back.instructions == prog.instructions
    assert back.arch == prog.arch and back.dram_image == prog.dram_image
    assert back.inputs == prog.inputs and back.outputs == prog.outputs
    assert back.source == prog.source and back.metadata == prog.metadata
    assert [p.name for p in tmp_path.iterdir()] == ["m.ember"]  # no temporary left behind


def test_model_macs_is_a_header_field_that_round_trips(tmp_path, prog):
    assert Program.from_bytes(prog.to_bytes()).model_macs is None  # hand-written: not recorded
    recorded = dataclasses.replace(prog, model_macs=1234)
    assert Program.from_bytes(recorded.to_bytes()).model_macs == 1234
    assert recorded.roofline_macs(5000) == 1234 and prog.roofline_macs(5000) == 5000
    with pytest.raises(SimulatorError, match="model_macs = -1: expected a non-negative integer"):
        dataclasses.replace(prog, model_macs=-1)


def test_saves_are_byte_identical(tmp_path, prog):
    prog.save(tmp_path / "a.ember")
    gemm_program(*gemm_data()).save(tmp_path / "b.ember")
    assert (tmp_path / "a.ember").read_bytes() == (tmp_path / "b.ember").read_bytes()


def damaged(tmp_path, data):
    path = tmp_path / "bad.ember"
    path.write_bytes(data)
    with pytest.raises(SimulatorError) as info:
        Program.load(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_rejects_damaged_files(tmp_path, prog):
    data = prog.to_bytes()
    assert "checksum" in damaged(tmp_path, data[:500] + bytes([data[500] ^ 1]) + data[501:])
    assert "truncated" in damaged(tmp_path, data[:-10])
    assert "truncated" in damaged(tmp_path, data[:20])
    assert "not an ember program" in damaged(tmp_path, b"hello, world\n")
    assert "not an ember program" in damaged(tmp_path, b"")
    newer = data[:8] + struct.pack("<I", program_file.FORMAT_VERSION + 1) + data[12:]
    assert f"format version {program_file.FORMAT_VERSION + 1}" in damaged(tmp_path, newer)
    older = data[:8] + struct.pack("<I", program_file.FORMAT_VERSION - 1) + data[12:]
    assert "recompile the model" in damaged(tmp_path, older)
    assert "trailing" in damaged(tmp_path, data + b"x")
    with pytest.raises(SimulatorError, match="cannot read"):
        Program.load(tmp_path / "missing.ember")
