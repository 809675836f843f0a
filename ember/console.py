"""Where results are printed: a rich console on stdout that fits the terminal, and that never
wraps a table when the output is piped or redirected."""

from __future__ import annotations

import os

from rich.console import Console

# Off a terminal, lines may be this long before rich wraps them: wider than any table ember
# prints, so node names stay whole for `| grep`, `| less -S` and files.
UNWRAPPED_COLUMNS = 100_000


def results() -> Console:
    """stdout: the terminal's width on a terminal (or $COLUMNS when set), else unwrapped.

    rich wraps at 80 columns when it cannot ask a terminal, which splits node names across
    lines in `ember report m.ember | cat`; tables only take the width their rows need.
    """
    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(width=UNWRAPPED_COLUMNS)
