"""Fuzzing in the suite: every kind of file ember reads, mutated, through the commands that read
it (`ember.fuzzing`). Each command must end in exit 0 with outputs that read back, or in exit 2
with one line: never a traceback, another exit code, a signal, a hang or a memory blow-up (the
sandbox caps the child's address space and time).

Hypothesis drives the mutators' random choices (`st.randoms`), derandomized in CI
(tests/conftest.py), so a failure reproduces and shrinks; `HYPOTHESIS_PROFILE=dev` explores new
cases, and `benchmarks/fuzz.py --minutes N` runs the same mutators for longer.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.fuzzing import sandbox, targets

# A few cases per seed file keep the whole module near fifteen seconds on a busy machine.
CASES_PER_TARGET = 5


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return targets.make_seeds(tmp_path_factory.mktemp("seeds"))


@pytest.mark.parametrize("target", targets.TARGETS, ids=lambda t: f"{t.kind}:{t.seed}")
@settings(max_examples=CASES_PER_TARGET)
@given(rng=st.randoms(use_true_random=False))
def test_mutated_file_ends_cleanly(seeds, tmp_path_factory, target, rng):
    case = targets.run_case(target, rng, seeds, tmp_path_factory.mktemp("case"), timeout_s=30)
    failure = case.failure
    assert failure is None, (f"ember {' '.join(failure.args)}: {failure.failure}\n"
                             f"{failure.stderr[-3000:]}")


def test_sandbox_runs_ember_in_a_child(tmp_path):
    outcome = sandbox.run(["show", str(tmp_path / "missing.onnx")], tmp_path)
    assert outcome.exit_code == 2 and outcome.failure is None, outcome
    assert outcome.stderr.startswith("ember: error: ") and "missing.onnx" in outcome.stderr


def test_memory_cap_holds_in_the_child_only(tmp_path):
    """A command that cannot allocate under the cap is a failure (a MemoryError, exit 1): a
    program whose input sits at the top of its 1 GiB of DRAM needs a simulated DRAM of that
    extent, which 1 GiB of address space cannot hold beside the interpreter. The test runner
    itself is never capped, and the same command runs under the default cap."""
    import dataclasses

    import numpy as np

    from tests.simulator.sim_programs import gemm_data, gemm_program
    data = gemm_data()
    program = gemm_program(*data)
    top = dataclasses.replace(program.inputs[0], dram=(1 << 30) - program.inputs[0].size_bytes)
    dataclasses.replace(program, inputs=(top,)).save(tmp_path / "top.ember")
    np.save(tmp_path / "x.npy", data[0])
    args = ["simulate", str(tmp_path / "top.ember"), "-i", str(tmp_path / "x.npy")]
    capped = sandbox.run(args, tmp_path, memory_bytes=1 << 30)
    assert capped.failure and "MemoryError" in capped.failure, capped
    assert sandbox.run(args, tmp_path).failure is None


@pytest.mark.parametrize("code,stderr,failure", [
    (0, "", None),
    (2, "ember: warning: synthetic data\nember: error: bad input\n", None),
    (2, "noise\nember: error: bad input\n", "exit 2 with 2 lines"),
    (1, "ember: internal error: KeyError: 0\n", "exit 1: ember: internal error"),
    (2, "Traceback (most recent call last):\nember: error: x\n", "a traceback"),
    (-11, "", "killed by signal SIGSEGV"),
    (None, "", "hang"),
])
def test_judge(tmp_path, code, stderr, failure):
    outcome = sandbox.Outcome(("show", "m.onnx"), code, "", stderr, 0.1)
    verdict = sandbox.judge(outcome, tmp_path, ())
    assert (verdict is None) if failure is None else failure in verdict, verdict


def test_judge_checks_outputs(tmp_path):
    (tmp_path / "r.json").write_text('{"cycles": NaN}')
    (tmp_path / ".out.npz.123.tmp").write_bytes(b"")
    outcome = sandbox.Outcome(("report",), 0, "", "", 0.1)
    assert "temporary file" in sandbox.judge(outcome, tmp_path, ("r.json",))
    (tmp_path / ".out.npz.123.tmp").unlink()
    assert "NaN is not JSON" in sandbox.judge(outcome, tmp_path, ("r.json",))
    refused = sandbox.Outcome(("report",), 2, "", "ember: error: x\n", 0.1)
    assert "exit 2, but wrote r.json" in sandbox.judge(refused, tmp_path, ("r.json",))
