"""Calibration data from the user's Python: `path/to/file.py:function` or `module:function`.

The function is called with no arguments and returns any iterable of {input name: array}
dicts, or an object with get_next() returning such dicts and then None (an onnxruntime
CalibrationDataReader plugs in unchanged). A class works too: calling it makes the reader.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import itertools
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Iterator

from profiler.batching import Chunk, skip
from profiler.errors import ProfileError
from profiler.model_inputs import InputSpec


def is_hook(text: str) -> bool:
    """A hook reference has a ':' after the file or module part (`a.py:f`, `pkg.mod:f`)."""
    target, sep, function = text.rpartition(":")
    return bool(sep and target and function.isidentifier() and not Path(text).exists())


def resolve(ref: str, what: str, error: type[Exception]) -> Callable:
    """The function `ref` names (`path/to/file.py:function`, its directory importable while
    the file runs as for a script, or `module:function`), imported: an `error` beginning with
    `what` for a missing file, a failed import or a missing function, in one line."""
    target, _, function = ref.rpartition(":")
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target)
            # One module name per file: two hooks named alike in two folders are two modules.
            unique = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(f"_ember_hook_{path.stem}_{unique}",
                                                          path)
            if spec is None or not path.is_file():
                raise error(f"{what}: no file {path}")
            module = importlib.util.module_from_spec(spec)
            # Registered as imports register modules: a dataclass in the file looks its
            # module up there.
            sys.modules[spec.name] = module
            folder = str(path.resolve().parent)
            sys.path.insert(0, folder)
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[spec.name]
                raise
            finally:
                sys.path.remove(folder)
        else:
            module = importlib.import_module(target)
    except error:
        raise
    except Exception as err:
        raise error(f"{what}: importing {target} failed: {type(err).__name__}: {err}") from None
    if not callable(getattr(module, function, None)):
        raise error(f"{what}: {target} has no function '{function}'")
    return getattr(module, function)


class Hook:
    """A user's function that produces calibration samples, called in this process."""

    def __init__(self, ref: str, specs: list[InputSpec]):
        self.ref, self.specs = ref, specs
        self.target, _, self.function = ref.rpartition(":")

    def describe(self) -> dict:
        return {"kind": "hook", "hook": self.ref}

    def count(self) -> int | None:
        return None

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """A hook's items come one after another: a later start still makes the earlier ones."""
        yield from skip(self._items(), start, self.specs)

    def _items(self) -> Iterator[Chunk]:
        produced = self._guard(self._resolve())
        if hasattr(produced, "get_next"):
            # Like onnxruntime's calibrators, stop at None or an empty dict.
            items = iter(lambda: produced.get_next() or None, None)
        else:
            items = self._guard(iter, produced)
        for index in itertools.count():
            item = self._guard(next, items, None)
            if item is None:
                return
            if not isinstance(item, Mapping):
                raise ProfileError(f"data hook {self.ref} yielded {type(item).__name__} as item "
                                   f"{index}; expected a dict of {{input name: array}}")
            yield f"data hook {self.ref} (item {index})", dict(item)

    def _resolve(self):
        return resolve(self.ref, f"data hook {self.ref}", ProfileError)

    def _guard(self, function, *args):
        """Run the user's code; its exceptions become one-line errors naming the hook."""
        try:
            return function(*args)
        except ProfileError:
            raise
        except TypeError as err:
            if function is iter:
                raise ProfileError(f"data hook {self.ref} returned "
                                   f"{type(args[0]).__name__}; expected an iterable of dicts "
                                   f"or an object with get_next()") from None
            raise ProfileError(f"data hook {self.ref} raised TypeError: {err}") from None
        except Exception as err:
            raise ProfileError(f"data hook {self.ref} raised {type(err).__name__}: "
                               f"{err}") from None
