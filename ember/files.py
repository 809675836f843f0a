"""Files a command reads and writes: outputs written atomically (a temporary name in the same
directory, renamed at the end) and never over one of the command's own inputs."""

from __future__ import annotations

import functools
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import click

from ember.errors import EmberError
from profiler.format import output_mode


class InputPath(click.Path):
    """A file a command reads: `refuse_overwrites` keeps every output off it."""


class OutputPath(click.Path):
    """A file a command writes: `refuse_overwrites` keeps it off the inputs and other outputs.

    `beside=(parameter, suffix)` makes the default that parameter's path (its first, when it
    takes several) with this suffix, so that the default is checked like a path the user gave.
    """

    def __init__(self, *args: Any, beside: tuple[str, str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.beside = beside


def guard(command: click.Command) -> click.Command:
    """Make `command` (and, in a group, every subcommand) call `refuse_overwrites` with its
    InputPath and OutputPath parameters, and `check_writable` on each output, before it does
    anything else: a bad output path fails in a second, not after the work."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            guard(sub)
        return command
    callback: Callable[..., Any] = command.callback  # type: ignore[assignment]

    @functools.wraps(callback)
    def checked(*args: Any, **kwargs: Any) -> Any:
        inputs, outputs = [], []
        for param in command.params:
            if isinstance(param.type, OutputPath) and param.type.beside and \
                    kwargs.get(param.name) is None:
                source, suffix = param.type.beside
                first = kwargs[source][0] if isinstance(kwargs[source], tuple) else kwargs[source]
                kwargs[param.name] = str(Path(first).with_suffix(suffix))
            if isinstance(param.type, (InputPath, OutputPath)):
                what = param.human_readable_name if isinstance(param, click.Argument) \
                    else max(param.opts, key=len)
                values = kwargs.get(param.name)
                values = values if isinstance(values, (tuple, list)) else (values,)
                found = inputs if isinstance(param.type, InputPath) else outputs
                found += [(what, str(v)) for v in values if v is not None]
        refuse_overwrites(inputs, outputs)
        for _, path in outputs:
            check_writable(path)
        return callback(*args, **kwargs)

    command.callback = checked
    return command


def refuse_overwrites(inputs: Iterable[tuple[str, str]],
                      outputs: Iterable[tuple[str, str]]) -> None:
    """Refuse an output that is an input, or another output, of the same command.

    Each item is (what, path), `what` naming the option for the message. Two paths are the
    same file when they resolve to the same name or, existing, share device and inode (a hard
    or symbolic link). Checked before any work, so a refused command changes nothing.
    """
    seen = [(what, path, _identity(path)) for what, path in inputs]
    for what, path in outputs:
        identity = _identity(path)
        for other_what, other, other_identity in seen:
            if identity & other_identity:
                raise EmberError(f"{path}: {what} would overwrite {other_what} {other}; "
                                 f"write it elsewhere")
        seen.append((what, path, identity))


def _identity(path: str | os.PathLike) -> set:
    """Names by which `path` is known: its resolved path and, if it exists, (device, inode)."""
    names: set = {str(Path(path).resolve())}
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return names
    return names | {(st.st_dev, st.st_ino)}


def check_writable(path: str | os.PathLike) -> None:
    """Refuse, in one line naming `path`, an output whose folder is missing or cannot be
    written: by making (and removing) a file there, the one test that also holds for root and
    for read-only mounts."""
    os.unlink(_temporary_beside(Path(path)))


def _temporary_beside(path: Path) -> str:
    """A new empty file in `path`'s folder, or a one-line error naming `path` (never the
    temporary name)."""
    if not path.parent.is_dir():
        raise EmberError(f"{path}: directory {path.parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise EmberError(f"{path}: cannot write: {err.strerror or err}") from None
    os.close(fd)
    return tmp


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds.

    A failure or interrupt leaves neither a partial file nor a clobbered previous one; a
    folder that cannot be written is the user's error, named in one line.
    """
    path = Path(path)
    tmp = _temporary_beside(path)
    try:
        yield Path(tmp)
        os.chmod(tmp, output_mode())
        os.replace(tmp, path)
    except OSError as err:  # the block only writes `tmp`: a full disk, a lost permission
        Path(tmp).unlink(missing_ok=True)
        raise EmberError(f"{path}: cannot write: {err.strerror or err}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
