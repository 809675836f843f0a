"""Run one `ember` command the way a user's shell would, but cheaply and under limits, and judge
how it ended.

Each command runs in a child forked from a server process that has imported ember once, so a
case costs the command, not the interpreter's start. The child caps its own address space
(RLIMIT_AS: the caller is never limited) and is killed, with everything it started, after a
time limit. What counts as a clean end is ember's contract
(CONVENTIONS.md): exit 0 with outputs that read back, or exit 2 with one line on stderr and no
output written; never a traceback, another exit code, a signal, a hang, a memory error or a
temporary file left behind.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

MEMORY_LIMIT_BYTES = 8 << 30  # address space: the 4 GiB of DRAM a program may declare, and room
TIMEOUT_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one command ended: its exit code (negative: the signal that ended it; None: it was
    killed after the time limit), what it printed, and what went wrong (None: a clean end)."""

    args: tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    failure: str | None = None


def run(args: list[str], cwd: Path, outputs: tuple[str, ...] = (),
        timeout_s: float = TIMEOUT_SECONDS,
        memory_bytes: int = MEMORY_LIMIT_BYTES) -> Outcome:
    """`ember ARGS` in `cwd`, judged: `outputs` are the files (relative to `cwd`) it writes
    when it succeeds."""
    cwd = Path(cwd).resolve()
    out, err = cwd / ".fuzz.stdout", cwd / ".fuzz.stderr"
    start = time.perf_counter()
    code = _Server.get().run({"args": list(args), "cwd": str(cwd), "memory_bytes": memory_bytes,
                              "timeout_s": timeout_s, "stdout": str(out), "stderr": str(err)})
    seconds = time.perf_counter() - start
    outcome = Outcome(tuple(args), code, _read(out), _read(err), seconds)
    return dataclasses.replace(outcome, failure=judge(outcome, cwd, outputs))


def _read(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    path.unlink()
    return text


class _Server:
    """The process that has imported ember and forks one child per command: a request (a JSON
    line) in, the child's exit code (a JSON line; null after a kill for the time limit) out."""

    _running: _Server | None = None

    def __init__(self):
        # The server imports ember from the tree this file is in, as its caller did.
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from ember.fuzzing.sandbox import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (str(Path(__file__).resolve().parents[2]),
                            os.environ.get("PYTHONPATH")) if p)})

    @classmethod
    def get(cls) -> _Server:
        if cls._running is None or cls._running.process.poll() is not None:
            cls._running = cls()
            atexit.register(cls._running.process.kill)
        return cls._running

    def run(self, request: dict) -> int | None:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline()
        if not reply:
            raise RuntimeError("the fuzzing sandbox's server died")
        return json.loads(reply)


def serve() -> None:
    """The server's loop (`_Server`): import ember once, then fork per request."""
    import ember.cli  # noqa: F401 - imported once here, inherited by every child

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        deadline = time.monotonic() + request["timeout_s"]
        code = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.005)
        else:
            _kill_group(pid)
            os.waitpid(pid, 0)
        _kill_group(pid)  # whatever the child started and left running
        print(json.dumps(code), flush=True)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _child(request: dict) -> None:
    """The forked side: its own process group (so a kill reaches ember's own workers), the
    memory cap, stdout and stderr to files, then ember's own entry point, as the `ember`
    script calls it."""
    code = 1
    try:
        os.setpgid(0, 0)
        limit = request["memory_bytes"]
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.chdir(request["cwd"])
        for fd, path in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC if fd else os.O_RDONLY,
                             0o644)
            os.dup2(target, fd)
            os.close(target)
        from ember.cli import main
        sys.argv = ["ember", *request["args"]]
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        except BaseException:  # noqa: BLE001 - what Python itself does: a traceback, exit 1
            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code)


def judge(outcome: Outcome, cwd: Path, outputs: tuple[str, ...]) -> str | None:
    """What is wrong with how the command ended, or None."""
    code, stderr = outcome.exit_code, outcome.stderr
    leftovers = sorted(p.name for p in cwd.iterdir() if p.name.endswith(".tmp"))
    if code is None:
        return "hang: killed after the time limit"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    if "Traceback (most recent call last)" in stderr + outcome.stdout:
        return "a traceback"
    if leftovers:
        return f"a temporary file left behind: {leftovers[0]}"
    if code == 1:
        return "exit 1: " + (stderr.strip().splitlines() or ["(nothing on stderr)"])[-1][:300]
    if code == 2:
        lines = [line for line in stderr.splitlines() if line.strip()
                 and not line.startswith("ember: warning:")]
        if len(lines) != 1 or not lines[0].startswith("ember: error: "):
            return f"exit 2 with {len(lines)} lines on stderr: {stderr.strip()[:300]!r}"
        written = [name for name in outputs if (cwd / name).exists()]
        if written:
            return f"exit 2, but wrote {written[0]}"
        return None
    if code != 0:
        return f"exit {code}"
    if "--json" in outcome.args:
        try:
            json.loads(outcome.stdout, parse_constant=_refuse_constant)
        except ValueError as err:
            return f"exit 0, but --json printed no JSON ({str(err)[:200]})"
    for name in outputs:
        problem = check_output(cwd / name)
        if problem:
            return f"exit 0, but {name}: {problem}"
    return None


def check_output(path: Path) -> str | None:
    """Why an output ember wrote does not read back, or None: JSON strictly (no NaN or
    Infinity), arrays without pickles, programs and profiles through their own readers."""
    if not path.exists():
        return "not written"
    try:
        if path.suffix == ".json":
            json.loads(path.read_text(), parse_constant=_refuse_constant)
            if path.name.endswith(".profile.json"):
                from profiler.format import load as load_profile
                load_profile(path)
        elif path.suffix == ".npz":
            import numpy as np
            with np.load(path, allow_pickle=False) as data:
                for key in data.files:
                    data[key]
        elif path.suffix == ".ember":
            from simulator.program import Program
            Program.load(path)
        elif path.suffix == ".onnx":
            import onnx
            onnx.checker.check_model(str(path))
    except Exception as err:  # noqa: BLE001 - any failure to read it back is the finding
        return f"does not read back ({type(err).__name__}: {str(err)[:200]})"
    return None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")
