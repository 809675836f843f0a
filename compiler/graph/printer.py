"""The Graph's readable text form and its JSON form (`ember show`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.graph.ir import Graph, Type


def _attr_text(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return np.array2string(value.reshape(-1), separator=",")
        return f"<{value.dtype}{list(value.shape)}>"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_attr_text(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def _operand(graph: Graph, name: str) -> str:
    if not name:
        return "_"
    return f"@{name}" if graph.values[name].is_const else f"%{name}"


def format_graph(graph: Graph) -> str:
    """One line per node: `%out = Op[name](%in, @const) {attrs} : type`."""
    consts = graph.constants
    const_bytes = sum(v.const.nbytes for v in consts.values())
    lines = [f"graph {graph.name} (opset {graph.opset})"]
    for name in graph.inputs:
        lines.append(f"  input  %{name}: {graph.type_of(name)}")
    for name in graph.outputs:
        lines.append(f"  output %{name}: {graph.type_of(name)}")
    lines.append(f"  {len(consts)} constants, {const_bytes / 1024:.1f} KiB")
    for node in graph.nodes:
        outs = ", ".join(f"%{o}" for o in node.outputs)
        args = ", ".join(_operand(graph, n) for n in node.inputs)
        attrs = {k: v for k, v in node.attrs.items() if v is not None}
        attr_text = (" {" + ", ".join(f"{k}={_attr_text(v)}" for k, v in sorted(attrs.items()))
                     + "}") if attrs else ""
        types = ", ".join(str(graph.type_of(o)) for o in node.outputs)
        lines.append(f"  {outs} = {node.op}[{node.name}]({args}){attr_text} : {types}")
    return "\n".join(lines)


def type_json(t: Type) -> dict[str, Any]:
    """A Type as JSON: dtype, shape, and the quantization when it has one."""
    out: dict[str, Any] = {"dtype": t.dtype, "shape": list(t.shape)}
    if t.quant is not None:
        out["quant"] = {"scale": list(t.quant.scale), "zero_point": list(t.quant.zero_point),
                        "axis": t.quant.axis}
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 64 else {"dtype": str(value.dtype),
                                                        "shape": list(value.shape)}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def graph_to_json(graph: Graph) -> dict[str, Any]:
    return {
        "name": graph.name,
        "opset": graph.opset,
        "inputs": [{"name": n, **type_json(graph.type_of(n))} for n in graph.inputs],
        "outputs": [{"name": n, **type_json(graph.type_of(n))} for n in graph.outputs],
        "constants": [{"name": n, **type_json(v.type)} for n, v in graph.constants.items()],
        "nodes": [{"name": node.name, "op": node.op, "inputs": list(node.inputs),
                   "outputs": list(node.outputs),
                   "attrs": {k: _jsonable(v) for k, v in node.attrs.items() if v is not None},
                   "types": [type_json(graph.type_of(o)) for o in node.outputs]}
                  for node in graph.nodes],
    }
