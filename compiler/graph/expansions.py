"""Operators expanded on import into nodes of other rows (the table's `expand` column), as the
recurrent layers are (`compiler.graph.recurrent`): nothing after the importer sees them.

- Max and Min of other than two inputs: a chain of two-input ones (one input: an Identity).
- Einsum of the matrix-product forms exporters write (`bhqd,bhkd->bhqk`, `bij,jk->bik`,
  `...ij,...jk->...ik`): the operands transposed to [batch..., M, K] and [batch..., K, N] (or a
  2-D [K, N] that the product broadcasts), one MatMul, its result transposed to the output's
  order. One letter summed over, at most one letter of each operand's own (or any number of the
  first's, leading, against a 2-D second); anything else is refused naming the equation.
"""

from __future__ import annotations

import string
from typing import Sequence

from compiler.errors import CompileError
from compiler.graph.ir import Node, Value
from compiler.graph.recurrent import MakeConst


def expand_variadic(node: Node, inputs: Sequence[Value | None], make_const: MakeConst
                    ) -> list[Node]:
    """Max or Min of n inputs: n - 1 two-input nodes, the last one writing the output."""
    from compiler.graph import ops as table
    names = [name for name in node.inputs if name]
    if len(names) == 2:
        return [node]
    if len(names) == 1:
        return [Node(table.IDENTITY.name, node.name, (names[0],), node.outputs)]
    nodes, value = [], names[0]
    for k, other in enumerate(names[1:], 1):
        last = k == len(names) - 1
        out = node.outputs[0] if last else f"{node.name}/{k}"
        nodes.append(Node(node.op, node.name if last else f"{node.name}/{k}", (value, other),
                          (out,)))
        value = out
    return nodes


def _letters(term: str, rank: int, equation: str) -> str:
    """An operand's subscripts with its ellipsis spelled out as upper-case letters (the
    ellipsis's last axes align across operands, as numpy broadcasts)."""
    if "..." not in term:
        if len(term) != rank:
            raise CompileError(f"Einsum {equation!r}: {term!r} names {len(term)} axes of a "
                               f"rank-{rank} operand")
        return term
    spread = rank - (len(term) - 3)
    return term.replace("...", string.ascii_uppercase[26 - spread:])


def expand_einsum(node: Node, inputs: Sequence[Value | None], make_const: MakeConst
                  ) -> list[Node]:
    """One MatMul between Transposes for a two-operand matrix-product equation."""
    from compiler.graph import ops as table
    equation = str(node.attrs.get("equation", "")).replace(" ", "")
    if len(inputs) != 2 or "->" not in equation or any(v is None for v in inputs):
        raise CompileError(f"node {node.name!r} (Einsum): {equation!r}: only two operands "
                           "with an explicit output ('ij,jk->ik') expand to a MatMul")
    left, out = equation.split("->")
    terms = left.split(",")
    if len(terms) != 2:
        raise CompileError(f"node {node.name!r} (Einsum): {equation!r} has {len(terms)} "
                           "operands; the matrix-product forms have two")
    a, b = (_letters(t, v.type.rank, equation) for t, v in zip(terms, inputs))
    # The output's ellipsis spans the widest of the operands'.
    spread = max(len(x) - len(t) + 3 if "..." in t else 0 for x, t in zip((a, b), terms))
    out = out.replace("...", string.ascii_uppercase[26 - spread:] if spread else "")
    summed = [c for c in a if c in b and c not in out]
    batch = [c for c in out if c in a and c in b]
    own_a = [c for c in out if c in a and c not in b]
    own_b = [c for c in out if c in b and c not in a]
    refuse = (len(summed) != 1 or len(own_b) != 1 or set(a) | set(b) != set(out) | set(summed)
              or len(set(a)) != len(a) or len(set(b)) != len(b)
              or (batch and len(own_a) != 1) or (not batch and not own_a))
    if refuse:
        raise CompileError(f"node {node.name!r} (Einsum): {equation!r} is not a matrix "
                           f"product ember expands (one summed letter, one letter of the "
                           f"second operand's own, batch letters in both)")
    k = summed[0]
    nodes: list[Node] = []

    def transposed(name: str, have: str, want: list[str], label: str) -> str:
        perm = [have.index(c) for c in want]
        if perm == list(range(len(perm))):
            return name
        moved = f"{node.name}/{label}"
        nodes.append(Node(table.TRANSPOSE.name, moved, (name,), (moved,), {"perm": perm}))
        return moved

    x = transposed(node.inputs[0], a, batch + own_a + [k], "a")
    y = transposed(node.inputs[1], b, batch + [k] + own_b, "b")
    product = batch + own_a + own_b
    last = [c for c in out] == product
    result = node.outputs[0] if last else f"{node.name}/product"
    nodes.append(Node(table.MATMUL.name, node.name if last else result, (x, y), (result,)))
    if not last:
        nodes.append(Node(table.TRANSPOSE.name, node.name, (result,), node.outputs,
                          {"perm": [product.index(c) for c in out]}))
    return nodes
