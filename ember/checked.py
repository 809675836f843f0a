"""Programs whose race check passed, remembered by content: the check is a pure function of the
program's bytes (and of ember's version), so a program that passed it once passes it again,
and `ember simulate --no-checks` may skip it, for speed, only for such a program.

One empty file per program, named by its SHA-256 and ember's version, in
$XDG_CACHE_HOME/ember/checked (~/.cache/ember/checked by default). A cache that cannot be
written is not an error: the check then simply runs every time."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from profiler.format import tool_version


def _directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ember" / "checked"


def key(program_bytes: bytes) -> str:
    return f"{hashlib.sha256(program_bytes).hexdigest()}-{tool_version()}"


def passed(program_bytes: bytes) -> bool:
    """Whether this program passed the race check before, with this ember."""
    return (_directory() / key(program_bytes)).is_file()


def remember(program_bytes: bytes) -> None:
    """Record that this program passed the race check."""
    try:
        directory = _directory()
        directory.mkdir(parents=True, exist_ok=True)
        (directory / key(program_bytes)).touch()
    except OSError:
        pass
