"""Writing outputs safely: a temporary name in the same directory, renamed at the end."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ember.errors import EmberError
from profiler.format import output_mode


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds.

    A failure or interrupt leaves neither a partial file nor a clobbered previous one.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise EmberError(f"{path}: directory {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, output_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
