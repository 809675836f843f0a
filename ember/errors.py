"""Which exceptions are the user's fault (exit 2, one line) and which are ours (exit 1)."""

from __future__ import annotations

import importlib


class EmberError(Exception):
    """Bad input to the CLI itself: a message for a person, exit code 2."""


# Each package below `ember` defines its own user-error base class, so that the bottom layers
# never import upward; the CLI treats all of them alike. (module, class name) pairs are resolved
# lazily so that a package that is not yet importable does not break the CLI.
_USER_ERRORS = [
    ("ember.errors", "EmberError"),
    ("compiler.errors", "CompileError"),
    ("profiler.errors", "ProfileError"),
    ("quantizer.errors", "QuantizeError"),
    ("simulator.errors", "SimulatorError"),
]


def user_error_types() -> tuple[type[BaseException], ...]:
    found = []
    for module_name, class_name in _USER_ERRORS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.append(getattr(module, class_name))
    return tuple(found)


# Likewise for warnings: each package's own warning class, shown as one "ember: warning:" line.
_USER_WARNINGS = [("quantizer.errors", "QuantizeWarning")]


def user_warning_types() -> tuple[type[Warning], ...]:
    return tuple(getattr(importlib.import_module(module), name)
                 for module, name in _USER_WARNINGS)
