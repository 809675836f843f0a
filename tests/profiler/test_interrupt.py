"""Ctrl-C during a parallel profiling run ends it at once: exit 130, no traceback, no file.

A terminal sends SIGINT to the whole process group, workers included. Workers that took it as
their own interrupt died with tracebacks, and the main process then hung at exit on the task
queue's feeder thread, which blocked on a pipe no worker read any more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
_EXIT_SECONDS = 5.0


def _image_model() -> onnx.ModelProto:
    """x[1,3,128,128] -> Conv -> Relu: one sample (192 KiB) is more than a pipe holds."""
    weights = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"]),
             helper.make_node("Relu", ["conv"], ["y"])]
    graph = helper.make_graph(
        nodes, "image",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 128, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 126, 126])], [weights])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def _cpu_seconds(pid: int) -> float:
    """User plus system time of a process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _as_a_shell_starts_it() -> None:
    """SIGINT unblocked and at its default action in the child, as a shell starts a command,
    whatever the test process inherited or set (a Python started with SIGINT ignored or
    blocked never raises KeyboardInterrupt)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_busy_workers(process: subprocess.Popen, workers: int) -> None:
    """Until `workers` worker processes have each run for a while (imports included)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        children = _children(process.pid)
        # The spawn start method also runs a resource tracker: count the ones that work.
        if sum(_cpu_seconds(child) > 1.5 for child in children) >= workers:
            return
        time.sleep(0.1)
    pytest.fail("the workers never got busy")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_ctrl_c_ends_a_parallel_run_at_once(tmp_path) -> None:
    model = tmp_path / "image.onnx"
    onnx.save(_image_model(), str(model))
    output = tmp_path / "profile.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(
        [sys.executable, "-c", "from ember.cli import main; main()", "quantize-profile",
         str(model), "--random", "1000000", "--workers", "2", "-o", str(output)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=_as_a_shell_starts_it)
    try:
        _wait_for_busy_workers(process, 2)
        os.killpg(process.pid, signal.SIGINT)  # as a terminal does: to the whole group
        try:
            _, stderr = process.communicate(timeout=_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            status = Path("/proc/self/status").read_text()
            masks = [line for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn"))]
            pytest.fail(f"still running {_EXIT_SECONDS} s after Ctrl-C (the test process's "
                        f"{', '.join(masks)})")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    # multiprocessing's resource tracker may still warn about the terminated workers' queue
    # semaphores after ember has said it was interrupted (a known gap, issue 13).
    assert "ember: interrupted" in stderr.strip().splitlines(), stderr
    assert not output.exists() and list(tmp_path.iterdir()) == [model]


def test_ctrl_c_cancels_a_dask_clusters_shards(tmp_path, dask_scheduler) -> None:
    """On a cluster, Ctrl-C cancels the shards queued and running there: exit 130, no file,
    and the scheduler has nothing left to process."""
    from distributed import Client

    model = tmp_path / "image.onnx"
    onnx.save(_image_model(), str(model))
    output = tmp_path / "profile.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    with Client(dask_scheduler, set_as_default=False) as client:
        process = subprocess.Popen(
            [sys.executable, "-c", "from ember.cli import main; main()", "quantize-profile",
             str(model), "--random", "20000", "--batch", "1", "-o", str(output), "--cluster",
             dask_scheduler],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=_as_a_shell_starts_it)
        try:
            deadline = time.monotonic() + 60
            while not any(client.processing().values()):  # shards running on the workers
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "no shard ever ran"
                time.sleep(0.1)
            os.killpg(process.pid, signal.SIGINT)
            _, stderr = process.communicate(timeout=_EXIT_SECONDS)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        assert process.returncode == 130, stderr
        assert "ember: interrupted" in stderr and "Traceback" not in stderr, stderr
        assert not output.exists()
        deadline = time.monotonic() + 10
        while any(client.processing().values()):  # cancelled, not left to run
            assert time.monotonic() < deadline, client.processing()
            time.sleep(0.1)
