"""The command line as tests drive it: in process, through click's runner, on the bundled digits
CNN."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from ember.cli import cli

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


def invoke(*args, catch_exceptions: bool = True) -> Result:
    """`ember ARGS...` (paths and numbers as strings); with catch_exceptions off, an internal
    error raises in the test instead of becoming exit 1."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=catch_exceptions)
