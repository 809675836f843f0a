"""How far compiling has come, for whoever draws a progress bar: a long step calls
`progress(what, done, total)` as it advances, e.g. ("scheduling instructions", 5000, 120000).
The compiler draws nothing itself (the CLI does, on a terminal only)."""

from __future__ import annotations

from typing import Callable

Progress = Callable[[str, int, "int | None"], None]


def quiet(what: str, done: int, total: int | None) -> None:
    """Report nothing: the default for every caller that draws no bar."""
