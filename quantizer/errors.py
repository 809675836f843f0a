"""The quantizer's user error: an unquantizable graph, a profile that lacks tensors, bad weights."""

from __future__ import annotations


class QuantizeError(Exception):
    """A one-line message that names the node, tensor or option and says what was expected."""
