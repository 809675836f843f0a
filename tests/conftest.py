"""Shared test configuration: deterministic hypothesis runs by default.

The "ci" profile (the default) derandomizes hypothesis, so a failure reproduces on every run and
on every machine; `HYPOTHESIS_PROFILE=dev pytest` explores new random examples instead.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
