"""A hostile program file ends in one line and exit 2, never in a signal or a huge allocation:
every strided DRAM view is bounded at both ends, and every instruction's ranges are checked
before the simulator allocates anything sized by its fields.

A program with a valid checksum is easy to forge, so each case rewrites a valid program and
saves it (the checksum recomputed). Where the unfixed simulator crashed or allocated, the CLI
runs in a subprocess, with its address space capped."""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from simulator import isa
from simulator.errors import SimulatorError
from simulator.machine import State
from simulator.program import IOBinding, Program
from tests.simulator.sim_programs import gemm_data, gemm_program

ROOT = Path(__file__).resolve().parents[2]
_ADDRESS_SPACE = 3 << 30  # far below what the unfixed COMPUTE asked for (32 GiB)


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))


def simulate(tmp: Path, program: Program) -> subprocess.CompletedProcess:
    """`ember simulate` on `program` in a fresh interpreter, so a crash is a return code."""
    data = gemm_data()
    program.save(tmp / "p.ember")
    np.savez(tmp / "raw.npz", x=data[0])
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-c", "from ember.cli import main; main()", "simulate",
         str(tmp / "p.ember"), "-i", str(tmp / "raw.npz"), "-o", str(tmp / "out.npz")],
        env=env, cwd=tmp, capture_output=True, text=True, timeout=120, preexec_fn=_cap_memory)


def assert_one_line_error(result: subprocess.CompletedProcess, *parts: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ember: error: "), result.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def forge(program: Program, **changes) -> Program:
    """`program` with `changes` its own checks would refuse: what a forged file holds."""
    forged = dataclasses.replace(program)
    for name, value in changes.items():
        object.__setattr__(forged, name, value)
    return forged


@pytest.fixture(scope="module")
def gemm():
    return gemm_program(*gemm_data())


def test_negative_input_strides_below_dram_zero(tmp_path, gemm):
    """Was a segmentation fault: the input was written below the DRAM array."""
    x = dataclasses.replace(gemm.inputs[0], strides=(-(1 << 26), 1))
    result = simulate(tmp_path, forge(gemm, inputs=(x,)))
    assert_one_line_error(result, "I/O 'x' at DRAM 0 does not fit", f"[{-31 << 26}, 16)")
    assert not (tmp_path / "out.npz").exists()


def test_negative_output_strides_below_dram_zero(tmp_path, gemm):
    y = dataclasses.replace(gemm.outputs[0], strides=(-(1 << 26), 1))
    result = simulate(tmp_path, forge(gemm, outputs=(y,)))
    assert_one_line_error(result, "I/O 'y' at DRAM 16384 does not fit")


def test_overlapping_output_elements_are_counted_before_reading(tmp_path, gemm):
    """2^40 elements in one byte (zero strides): the unfixed simulator copied them out."""
    y = dataclasses.replace(gemm.outputs[0], shape=(1 << 20, 1 << 20), strides=(0, 0))
    result = simulate(tmp_path, forge(gemm, outputs=(y,)))
    assert_one_line_error(result, "I/O 'y' of shape [1048576, 1048576] holds 1099511627776 bytes")


def test_compute_rows_are_checked_before_allocating(tmp_path, gemm):
    """65535 x 65535 strided rows: the unfixed simulator built 2^32 row offsets (32 GiB)
    before it found the last one outside the scratchpad."""
    insns = list(gemm.instructions)
    k = next(i for i, insn in enumerate(insns) if insn.op is isa.COMPUTE)
    insns[k] = dataclasses.replace(insns[k], args={**insns[k].args, "m_outer": 65535,
                                                    "m_inner": 65535, "inner_stride": 2})
    result = simulate(tmp_path, dataclasses.replace(gemm, instructions=tuple(insns)))
    assert_one_line_error(result, f"instruction {k}", "COMPUTE", "scratchpad row")


def test_avgpool_never_copies_its_windows(gemm):
    """A 32 x 32 window over 64 x 64 pixels: the unfixed sum copied the 33 x 33 overlapping
    windows out in int64 (142 MB here; 2.2 GB for a 64 x 64 window over 128 x 128)."""
    state = State(gemm.arch)
    insn = isa.AVGPOOL(src=0, dst=64 * 64, in_h=64, in_w=64, kh=32, kw=32, param=0)
    tracemalloc.start()
    try:
        insn.op.run(state, insn)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def _binding(**changes) -> IOBinding:
    return dataclasses.replace(IOBinding("t", 64, (2, 4), 0.5, 0), **changes)


@pytest.mark.parametrize("binding,message", [
    # the lowest byte below DRAM address 0 (the first element is inside)
    (_binding(strides=(-128, 1)), r"does not fit in 1073741824 bytes: it reaches bytes \[-64, "),
    # the last float32 element's last byte past the end (its first byte is inside)
    (_binding(dram=(1 << 30) - 2, shape=(1,), dtype="float32"),
     r"it reaches bytes \[1073741822, 1073741826\)"),
    (_binding(shape=(1 << 30, 2), strides=(0, 0)), r"holds 2147483648 bytes, more than the"),
    (_binding(strides=(4,)), r"shape \[2, 4\] with strides \[4\]: expected .* one stride per"),
    (_binding(shape=(-1, 4), strides=(4, 1)), r"shape \[-1, 4\] .* non-negative sizes"),
])
@pytest.mark.parametrize("where", ["input", "output", "host segment"])
def test_bindings_are_bounded_at_both_ends(gemm, binding, message, where):
    if where == "host segment":
        segment = {"name": "h", "nodes": [], "graph": {}, "flops": 0, "outputs": [],
                   "inputs": [binding.to_dict()]}
        change = {"host_segments": (segment,)}
    else:
        change = {f"{where}s": (binding,)}
    with pytest.raises(SimulatorError, match=message):
        dataclasses.replace(gemm, **change)


def test_the_machine_bounds_a_binding_it_was_handed(gemm):
    """The machine's own view checks too (a binding that never passed through a Program)."""
    state = State(gemm.arch)
    with pytest.raises(SimulatorError, match=r"binding 't': DRAM bytes \[-4, 1\) out of range"):
        state.read(IOBinding("t", 0, (2,), 0.5, 0, strides=(-4,)))
