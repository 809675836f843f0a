"""The high-level graph IR: strongly typed values, nodes that name them, and a verifier.

A quantized type is part of the type, as in Glow: two int8 tensors with different scales are
different types. Values are referred to by name (the ONNX names are kept, so profiles and
per-layer reports key on them); a Graph is an immutable snapshot, and passes build new ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

import numpy as np

from compiler.errors import CompileError
from simulator.errors import listing

DTYPES = ("float32", "int8", "uint8", "int16", "int32", "int64", "bool", "float64", "float16")


@dataclass(frozen=True)
class QuantParams:
    """real = scale * (q - zero_point); per tensor (axis None) or per channel along `axis`."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None

    def __post_init__(self) -> None:
        if len(self.scale) != len(self.zero_point):
            raise ValueError("scale and zero_point must have the same length")
        if self.axis is None and len(self.scale) != 1:
            raise ValueError("a per-tensor QuantParams has exactly one scale")
        if any(not (s > 0 and np.isfinite(s)) for s in self.scale):
            raise ValueError(f"scales must be positive and finite, got {self.scale}")

    @classmethod
    def per_tensor(cls, scale: float, zero_point: int = 0) -> "QuantParams":
        return cls((float(scale),), (int(zero_point),), None)

    def __str__(self) -> str:
        if self.axis is None:
            return f"scale={self.scale[0]:.6g} zp={self.zero_point[0]}"
        return f"per-channel(axis={self.axis}, n={len(self.scale)})"


@dataclass(frozen=True)
class Type:
    dtype: str
    shape: tuple[int, ...]
    quant: QuantParams | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown element type {self.dtype!r}")
        if any((not isinstance(d, (int, np.integer))) or d < 0 for d in self.shape):
            raise ValueError(f"shapes are static and non-negative, got {self.shape}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape) or "scalar"
        text = f"{self.dtype}[{dims}]"
        return f"{text}{{{self.quant}}}" if self.quant else text


@dataclass(frozen=True, eq=False)
class Value:
    """A named tensor; `const` holds the data of constants (ONNX initializers)."""

    name: str
    type: Type
    const: np.ndarray | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @classmethod
    def constant(cls, name: str, array) -> "Value":
        """A constant of `array`'s own dtype and shape."""
        array = np.asarray(array)
        return cls(name, Type(str(array.dtype), tuple(array.shape)), array)


@dataclass(frozen=True, eq=False)
class Node:
    """One operator application. Inputs are value names; "" marks an omitted optional input."""

    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def with_(self, **changes: Any) -> "Node":
        return replace(self, **changes)


@dataclass(frozen=True, eq=False)
class Graph:
    """Nodes in topological order over a name → Value table.

    `origin` maps a value name to the ONNX name it was derived from, for values that passes
    renamed or created, so per-layer reports can always find the fp32 counterpart.
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    values: Mapping[str, Value]
    opset: int = 17
    origin: Mapping[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Value:
        return self.values[name]

    def type_of(self, name: str) -> Type:
        return self.values[name].type

    def const_of(self, name: str) -> np.ndarray | None:
        """The data of constant `name`; None for an activation, an absent or an omitted ("")
        input."""
        value = self.values.get(name)
        return None if value is None or not value.is_const else np.asarray(value.const)

    @property
    def constants(self) -> dict[str, Value]:
        return {n: v for n, v in self.values.items() if v.is_const}

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs}

    def users(self) -> dict[str, list[Node]]:
        """Def-use chains: for every value name, the nodes that read it (in order)."""
        uses: dict[str, list[Node]] = {name: [] for name in self.values}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    uses.setdefault(name, []).append(node)
        return uses

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def replace(self, **changes: Any) -> "Graph":
        return replace(self, **changes)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts


def toposort(nodes: Iterable[Node], available: Iterable[str]) -> tuple[Node, ...]:
    """Kahn's algorithm, stable: among ready nodes the earliest in `nodes` goes first."""
    pending = list(nodes)
    ready_values = set(available) | {""}
    ordered: list[Node] = []
    while pending:
        remaining = []
        progressed = False
        for node in pending:
            if all(name in ready_values for name in node.inputs):
                ordered.append(node)
                ready_values.update(node.outputs)
                progressed = True
            else:
                remaining.append(node)
        if not progressed:
            stuck = remaining[0]
            missing = [n for n in stuck.inputs if n not in ready_values]
            raise CompileError(f"node {stuck.name!r} ({stuck.op}) reads "
                               f"{listing(missing, quote=True)}, which nothing "
                               "produces (or the graph has a cycle)")
        pending = remaining
    return tuple(ordered)


def verify(graph: Graph) -> None:
    """Check the invariants every pass must keep; raise CompileError naming the first breach.

    - every value a node reads is a graph input, a constant or an earlier node's output;
    - every value is defined exactly once, and every name has a Value with a type;
    - each node's op is in the operator table, and its output types equal the shape rule's;
    - the graph outputs are defined.
    """
    from compiler.graph.ops import OPS, infer_types  # the table depends on the IR, not vice versa

    defined: set[str] = set(graph.inputs) | {n for n, v in graph.values.items() if v.is_const}
    for name in graph.inputs:
        if name not in graph.values:
            raise CompileError(f"graph input {name!r} has no type")
        if graph.values[name].is_const:
            raise CompileError(f"graph input {name!r} is also a constant")
    for node in graph.nodes:
        if node.op not in OPS:
            raise CompileError(f"node {node.name!r}: unknown operator {node.op!r}")
        for name in node.inputs:
            if name and name not in defined:
                raise CompileError(f"node {node.name!r} ({node.op}) reads {name!r} before it is "
                                   "defined")
        for name in node.outputs:
            if name in defined:
                raise CompileError(f"value {name!r} is defined twice (again by {node.name!r})")
            if name not in graph.values:
                raise CompileError(f"node {node.name!r} output {name!r} has no type")
            defined.add(name)
        expected = infer_types(graph, node)
        for name, want in zip(node.outputs, expected):
            got = graph.values[name].type
            if (got.dtype, got.shape) != (want.dtype, want.shape):
                raise CompileError(f"node {node.name!r} ({node.op}) output {name!r} is typed "
                                   f"{got} but its shape rule gives {want}")
    for name in graph.outputs:
        if name not in defined:
            raise CompileError(f"graph output {name!r} is never defined")
    names = [node.name for node in graph.nodes]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise CompileError(f"node name {dup!r} is used twice")
