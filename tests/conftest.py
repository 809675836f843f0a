"""Shared test configuration: deterministic hypothesis runs by default.

The "ci" profile (the default) derandomizes hypothesis, so a failure reproduces on every run and
on every machine; `HYPOTHESIS_PROFILE=dev pytest` explores new random examples instead.
"""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.cli import DIGITS

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def digits_profile(tmp_path_factory) -> Path:
    """The bundled digits CNN's profile over its calibration set, made once per test run
    through the command a user types."""
    from click.testing import CliRunner

    from ember.cli import cli
    path = tmp_path_factory.mktemp("digits") / "digits.profile.json"
    result = CliRunner().invoke(cli, ["quantize-profile", str(DIGITS / "model.onnx"), "--data",
                                      str(DIGITS / "calib.npz"), "-o", str(path)])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture(scope="session")
def dask_scheduler():
    """A real Dask cluster for the tests that shard over one: a scheduler and two worker
    processes of one thread each, on this machine; yields the scheduler's address."""
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=":0")
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """The user cache (`ember.checked`'s record of race-checked programs) in a directory of the
    test run's own, never the home directory's."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved
