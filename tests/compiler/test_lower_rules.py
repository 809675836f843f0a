"""The operator table's `lower` column and the backend's rules agree."""

from __future__ import annotations

from compiler.backend.lower import RULES
from compiler.graph.ops import OPS, Lower


def test_every_lowering_kind_has_one_rule() -> None:
    assert set(RULES) == set(Lower)


def test_every_kind_names_an_operator() -> None:
    assert {op.lower for op in OPS.values()} - {None} == set(Lower)
