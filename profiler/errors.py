"""The profiler's user error: bad data, a bad profile file or a profile of another model."""

from __future__ import annotations


class ProfileError(Exception):
    """A one-line message that names the file, input or tensor and says what was expected."""
