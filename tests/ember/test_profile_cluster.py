"""Profiling in shards (#17): wherever the shards run (this process, local processes, a Dask
cluster's workers, one of which is killed mid-run), the profile file is the same, byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

from ember import cluster as clusters
from ember.cluster import Cluster
from ember.profiling import profile
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources.arrays import ArrayFile
from tests.cli import DIGITS, assert_one_line_error, invoke
from tests.profiler.conftest import conv_model

# A worker preload that makes ember unimportable, as on a machine without it.
WITHOUT_EMBER = Path(__file__).with_name("dask_preload_without_ember.py")


def _profile(tmp_path, *options) -> bytes:
    path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.json"
    result = invoke("quantize-profile", DIGITS / "model.onnx", "--data", DIGITS / "calib.npz",
                    "-o", path, "--channel-means", *options)
    assert result.exit_code == 0, result.output
    return path.read_bytes()


def test_a_profile_is_the_same_byte_for_byte_wherever_its_shards_run(tmp_path,
                                                                      dask_scheduler) -> None:
    here = _profile(tmp_path)
    assert _profile(tmp_path, "--cluster", "local:2") == here
    assert _profile(tmp_path, "--cluster", dask_scheduler) == here
    # a --samples limit, and a batch that does not divide the shards
    limited = _profile(tmp_path, "--samples", 77, "--batch", 5)
    assert _profile(tmp_path, "--samples", 77, "--batch", 5, "--cluster", dask_scheduler) == \
        limited


def test_a_data_hook_is_drawn_in_shards_until_it_runs_out(tmp_path) -> None:
    onnx.save(conv_model(), str(tmp_path / "m.onnx"))
    (tmp_path / "hook.py").write_text(
        "import numpy as np\n"
        "def samples():\n"
        "    rng = np.random.default_rng(5)\n"
        "    for _ in range(150):\n"
        "        yield {'x': rng.standard_normal((1, 2, 4, 4)).astype(np.float32)}\n")
    made = []
    for where in ("local", "local:2"):
        path = tmp_path / f"{where.replace(':', '')}.json"
        result = invoke("quantize-profile", tmp_path / "m.onnx", "--data",
                        f"{tmp_path / 'hook.py'}:samples", "-o", path, "--cluster", where)
        assert result.exit_code == 0, result.output
        made.append(path.read_bytes())
    assert made[1] == made[0] and b'"samples": 150' in made[0]


def test_samples_skipped_as_nonfinite_are_made_up_as_one_process_would(tmp_path) -> None:
    x = np.random.default_rng(0).standard_normal((60, 2, 4, 4)).astype(np.float32)
    x[[3, 17, 18, 40]] = np.nan
    np.savez(tmp_path / "d.npz", x=x)
    model = conv_model()
    specs = input_specs(model, {})
    options = RunOptions(batch=4, samples=50, allow_nonfinite=True)
    made = []
    for where in ("local", "local:2"):
        with Cluster(where) as running:
            made.append(profile(running, model, ArrayFile(tmp_path / "d.npz", specs), specs,
                                options))
    assert made[0].samples == 50 and made[0].runs[0]["skipped_nonfinite"] == 4
    assert _text(made[1]) == _text(made[0])


def test_a_worker_killed_mid_run_loses_nothing(tmp_path, dask_scheduler) -> None:
    x = np.random.default_rng(1).standard_normal((4000, 2, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    model = conv_model()
    specs = input_specs(model, {})
    options = RunOptions(batch=1)
    with Cluster() as here:
        want = profile(here, model, ArrayFile(tmp_path / "d.npz", specs), specs, options)
    with Cluster(dask_scheduler) as running:
        pids = running._client.run(os.getpid)
        killed = []

        def kill_one(samples: int) -> None:
            if killed:
                return
            # after the first shard, a worker with a shard in hand
            busy = [w for w, tasks in running._client.processing().items() if tasks]
            killed.append(pids[busy[0]])
            os.kill(killed[0], signal.SIGKILL)

        got = profile(running, model, ArrayFile(tmp_path / "d.npz", specs), specs, options,
                      kill_one)
    assert killed
    assert _text(got) == _text(want)


def _text(p) -> str:
    return json.dumps(p.to_json(), sort_keys=True)


def test_a_bad_sample_in_a_shard_stops_the_run_naming_it(tmp_path, dask_scheduler) -> None:
    x = np.random.default_rng(0).standard_normal((300, 2, 4, 4)).astype(np.float32)
    x[211, 1, 2, 3] = np.inf
    x[40, 0, 0, 0] = np.nan  # a later shard's bad sample may fail first: the earlier is named
    np.savez(tmp_path / "d.npz", x=x)
    onnx.save(conv_model(), str(tmp_path / "m.onnx"))
    out = tmp_path / "p.json"
    for where in ("local:2", dask_scheduler):
        assert_one_line_error(invoke("quantize-profile", tmp_path / "m.onnx", "--data",
                                     tmp_path / "d.npz", "-o", out, "--cluster", where),
                              "d.npz", "NaN or Inf in sample 40")
        assert not out.exists()


def test_a_worker_without_ember_is_named(tmp_path) -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as scheduler:
        worker = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", scheduler.scheduler_address,
             "--nthreads", "1", "--no-dashboard", "--preload", str(WITHOUT_EMBER)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert_one_line_error(
                invoke("quantize-profile", DIGITS / "model.onnx", "--random", 2, "-o",
                       tmp_path / "p.json", "--cluster", scheduler.scheduler_address),
                "cannot run ember", "No module named 'ember'", "install this ember there")
        finally:
            worker.terminate()
            worker.wait()


def test_cluster_errors_are_one_line(tmp_path, monkeypatch, dask_scheduler) -> None:
    model = DIGITS / "model.onnx"
    data = DIGITS / "calib.npz"
    out = tmp_path / "p.json"
    assert_one_line_error(invoke("quantize-profile", model, "--data", data, "-o", out,
                                 "--cluster", "nowhere"), "--cluster nowhere", "local:N")
    monkeypatch.setattr(clusters, "CONNECT_SECONDS", 0.5)
    assert_one_line_error(invoke("quantize-profile", model, "--data", data, "-o", out,
                                 "--cluster", "tcp://127.0.0.1:9"),
                          "tcp://127.0.0.1:9", "cannot reach a Dask scheduler", "0.5 s")
    monkeypatch.setattr(clusters, "code_digest", lambda: "0123456789abcdef")
    assert_one_line_error(invoke("quantize-profile", model, "--data", data, "-o", out,
                                 "--cluster", dask_scheduler), "runs another ember",
                          "0123456789abcdef")
    assert not out.exists()
