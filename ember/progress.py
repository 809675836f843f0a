"""One progress bar for every long step (profiling, compiling, evaluating), on stderr and only
when stderr is a terminal: piped or redirected, nothing is drawn (rich's Progress, transient)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)

from compiler.backend.progress import Progress as Report
from compiler.backend.progress import quiet


@contextmanager
def progress_bar() -> Iterator[Report]:
    """Yields `report(what, done, total)`: the bar names `what` and shows done of total (a
    pulse when the total is unknown); a new `what` starts the bar, its rate and ETA afresh."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield quiet
        return
    columns = [TextColumn("{task.description}"), BarColumn(), _Count(),
               TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=True) as progress:
        tasks = {}

        def report(what: str, done: int, total: int | None) -> None:
            if what not in tasks:  # a new step: its own task, so its rate and ETA start afresh
                for task in tasks.values():
                    progress.remove_task(task)
                tasks.clear()
                tasks[what] = progress.add_task(what, total=total)
            progress.update(tasks[what], completed=done)

        yield report


@contextmanager
def counting(what: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)` for a count of `what` ("profiling samples") towards `total`."""
    with progress_bar() as report:
        done = 0

        def advance(n: int) -> None:
            nonlocal done
            done += n
            report(what, done, total)

        report(what, 0, total)
        yield advance


class _Count(ProgressColumn):
    """done/total and the rate; the count alone while the total is unknown."""

    def render(self, task: Task) -> str:
        done = int(task.completed)
        count = f"{done}/{int(task.total)}" if task.total is not None else \
            (f"{done}" if done else "")
        return f"{count} {task.speed:.1f}/s" if task.speed else count
