"""Calibration data from the user's Python: `path/to/file.py:function` or `module:function`.

The function is called with no arguments and returns any iterable of {input name: array}
dicts, or an object with get_next() returning such dicts and then None (an onnxruntime
CalibrationDataReader plugs in unchanged). A class works too: calling it makes the reader.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Iterator

from profiler.batching import Chunk, skip
from profiler.errors import ProfileError
from profiler.model_inputs import InputSpec


def is_hook(text: str) -> bool:
    """A hook reference has a ':' after the file or module part (`a.py:f`, `pkg.mod:f`)."""
    target, sep, function = text.rpartition(":")
    return bool(sep and target and function.isidentifier() and not Path(text).exists())


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
        try:
            if self.target.endswith(".py") or "/" in self.target:
                path = Path(self.target)
                spec = importlib.util.spec_from_file_location(f"_ember_hook_{path.stem}", path)
                if spec is None or not path.is_file():
                    raise ProfileError(f"data hook {self.ref}: no file {path}")
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            else:
                module = importlib.import_module(self.target)
        except ProfileError:
            raise
        except Exception as err:
            raise ProfileError(f"data hook {self.ref}: importing {self.target} failed: "
                               f"{type(err).__name__}: {err}") from None
        if not callable(getattr(module, self.function, None)):
            raise ProfileError(f"data hook {self.ref}: {self.target} has no function "
                               f"'{self.function}'")
        return getattr(module, self.function)

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
