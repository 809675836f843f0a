"""A Graph as a JSON-able dict and back, exactly: types with their quantization, attributes
with their Python types, constants as base64 with dtype and shape.

A compiled program carries the subgraph of each host segment in this form (the simulator keeps it
opaque, `compiler.backend.codegen.host` runs it), so the round trip must give a graph that runs the
same kernels on the same integers: numpy arrays keep their dtype and shape, tuples stay tuples and
numpy scalars keep their type. Floats survive JSON exactly (Python writes the shortest repr that
reads back to the same double).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from compiler.errors import CompileError
from compiler.graph.ir import Graph, Node, QuantParams, Type, Value, verify
from compiler.graph.ops import OPS
from compiler.graph.printer import type_json

FORMAT = "ember.graph"
VERSION = 1


def _array(a: np.ndarray) -> dict:
    """dtype (its numpy name), shape and little-endian bytes in base64."""
    a = np.asarray(a)
    if a.dtype.kind not in "biufcU":
        raise CompileError(f"cannot serialize an array of dtype {a.dtype}")
    little = np.ascontiguousarray(a, a.dtype.newbyteorder("<"))
    return {"dtype": a.dtype.name if a.dtype.kind != "U" else a.dtype.str,
            "shape": list(a.shape), "data": base64.b64encode(little.tobytes()).decode("ascii")}


def _from_array(d: dict) -> np.ndarray:
    dtype = np.dtype(d["dtype"])
    data = base64.b64decode(d["data"])
    return np.frombuffer(data, dtype.newbyteorder("<")).astype(dtype).reshape(d["shape"])


def _encode(value: Any) -> Any:
    """Tag what JSON cannot tell apart: arrays, tuples, numpy scalars, non-string-keyed dicts."""
    if isinstance(value, np.ndarray):
        return {"ndarray": _array(value)}
    if isinstance(value, np.generic):
        return {"scalar": _array(np.asarray(value))}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CompileError(f"cannot serialize attribute value {value!r} of type "
                       f"{type(value).__name__}")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        (tag, body), = value.items()
        if tag == "ndarray":
            return _from_array(body)
        if tag == "scalar":
            return _from_array(body)[()]
        if tag == "tuple":
            return tuple(_decode(v) for v in body)
        if tag == "dict":
            return {_decode(k): _decode(v) for k, v in body}
        raise CompileError(f"serialized graph: unknown tag {tag!r}")
    return value


def _from_type(d: dict) -> Type:
    q = d.get("quant")
    quant = None if q is None else QuantParams(tuple(float(s) for s in q["scale"]),
                                               tuple(int(z) for z in q["zero_point"]),
                                               q["axis"])
    return Type(d["dtype"], tuple(d["shape"]), quant)


def graph_to_dict(graph: Graph) -> dict:
    """Every fact of `graph` in JSON-able form (`graph_from_dict` inverts it)."""
    return {
        "format": FORMAT, "version": VERSION, "name": graph.name, "opset": graph.opset,
        "inputs": list(graph.inputs), "outputs": list(graph.outputs),
        "values": [{"name": v.name, "type": type_json(v.type),
                    **({"const": _array(v.const)} if v.is_const else {})}
                   for v in graph.values.values()],
        "nodes": [{"op": n.op, "name": n.name, "inputs": list(n.inputs),
                   "outputs": list(n.outputs),
                   "attrs": {k: _encode(v) for k, v in n.attrs.items()}} for n in graph.nodes],
        "origin": dict(graph.origin),
    }


def graph_from_dict(d: dict) -> Graph:
    """The graph `graph_to_dict` wrote. A record from a file may be forged: anything malformed,
    an unknown operator, or a value used before it is defined is a CompileError."""
    if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != VERSION:
        got = (f"{d.get('format')!r} version {d.get('version')!r}" if isinstance(d, dict)
               else f"a {type(d).__name__}")
        raise CompileError(f"serialized graph: expected format {FORMAT!r} version {VERSION}, "
                           f"got {got}")
    try:
        values = {}
        for v in d["values"]:
            const = _from_array(v["const"]) if "const" in v else None
            values[v["name"]] = Value(v["name"], _from_type(v["type"]), const)
        nodes = tuple(Node(n["op"], n["name"], tuple(n["inputs"]), tuple(n["outputs"]),
                           {k: _decode(a) for k, a in n["attrs"].items()}) for n in d["nodes"])
        graph = Graph(d["name"], tuple(d["inputs"]), tuple(d["outputs"]), nodes, values,
                      d["opset"], dict(d["origin"]))
    except CompileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise CompileError(f"serialized graph: malformed ({type(err).__name__}: "
                           f"{str(err)[:200]})") from None
    _check_defined(graph)
    try:
        # Each node's attributes through its shape rule, against the recorded types: a forged
        # attribute (a string for a kernel size) is refused here, before any kernel runs.
        verify(graph)
    except CompileError as err:
        raise CompileError(f"serialized graph: {err}") from None
    except (KeyError, AttributeError, OverflowError, ZeroDivisionError) as err:
        raise CompileError(f"serialized graph: attributes a shape rule cannot read "
                           f"({type(err).__name__}: {str(err)[:200]})") from None
    return graph


def _check_defined(graph: Graph) -> None:
    """Every operator known, every name a value, every value defined before it is used: what
    running the graph node by node relies on."""
    names = [*graph.inputs, *graph.outputs, *graph.values,
             *(name for node in graph.nodes for name in (node.name, *node.inputs, *node.outputs))]
    if not all(isinstance(name, str) for name in names):
        bad = next(name for name in names if not isinstance(name, str))
        raise CompileError(f"serialized graph: name {bad!r:.60}: expected a string")
    defined = {name for name, v in graph.values.items() if v.is_const} | set(graph.inputs)
    for name in graph.inputs:
        if name not in graph.values:
            raise CompileError(f"serialized graph: input {name!r} is not a value")
    for node in graph.nodes:
        where = f"serialized graph: node {node.name!r}"
        if not isinstance(node.op, str) or node.op not in OPS:
            raise CompileError(f"{where}: unknown operator {node.op!r}")
        for name in node.inputs:
            if name and name not in defined:
                raise CompileError(f"{where}: input {name!r} is not a value defined before it")
        for name in node.outputs:
            if name not in graph.values:
                raise CompileError(f"{where}: output {name!r} is not a value")
            defined.add(name)
    for name in graph.outputs:
        if name not in defined:
            raise CompileError(f"serialized graph: output {name!r} is never defined")
