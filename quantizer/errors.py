"""The quantizer's user error: an unquantizable graph, a profile that lacks tensors, bad weights."""

from __future__ import annotations


class QuantizeError(Exception):
    """A one-line message that names the node, tensor or option and says what was expected."""


class QuantizeWarning(UserWarning):
    """A change the quantizer made so that a real model stays quantizable (a floored weight
    scale, a clamped ratio), said once, naming the node and what it did."""
