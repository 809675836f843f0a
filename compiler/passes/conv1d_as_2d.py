"""A 1-D convolution (audio front ends, text CNNs, silero-vad's encoder) becomes a 2-D one over a
plane one row high: Reshape [N, C, L] → [N, C, 1, L], Conv with kernel [1, k], Reshape back;
likewise a global pool over [N, C, L] (a text CNN's max over positions, Magika's).

The accelerator's convolutions are 2-D over channels-last maps. A [N, C, 1, L] map's
channels-last bytes are those of the [N, C, L] value its Reshape reads only when the producer
wrote channels-last itself, which is what a chain of 1-D convolutions does (each is a 2-D one
now), and what a one-channel input is; elsewhere the lowering copies, as for any layout change.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Type, Value
from compiler.graph.ops import CONV, GLOBAL_AVERAGE_POOL, GLOBAL_MAX_POOL, RESHAPE
from compiler.passes.util import prune_values


def conv1d_as_2d(graph: Graph) -> Graph:
    """After this pass no Conv with a constant weight, and no global pool, is 1-D."""
    nodes, new_values, origin = [], {}, {}
    for node in graph.nodes:
        if node.op in (GLOBAL_MAX_POOL.name, GLOBAL_AVERAGE_POOL.name) and \
                graph.type_of(node.inputs[0]).rank == 3:
            nodes += _global_pool_2d(graph, node, new_values, origin)
            continue
        weight = graph.values[node.inputs[1]] if node.op == CONV.name else None
        if weight is None or not weight.is_const or weight.const.ndim != 3:
            nodes.append(node)
            continue
        x, y = graph.values[node.inputs[0]], graph.values[node.outputs[0]]
        (n, c, length), (_, m, out) = x.type.shape, y.type.shape

        def value(name: str, shape: tuple[int, ...], const=None) -> str:
            dtype = "int64" if const is not None and const.dtype.kind == "i" else \
                x.type.dtype
            new_values[name] = Value(name, Type(dtype, shape), const)
            return name

        def shape_const(name: str, shape: tuple[int, ...]) -> str:
            return value(name, (len(shape),), np.array(shape, np.int64))

        w = weight.const
        w4 = value(f"{node.name}/W_2d", (w.shape[0], w.shape[1], 1, w.shape[2]),
                   w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]))
        x4 = value(f"{node.name}/x_2d", (n, c, 1, length))
        y4 = value(f"{node.name}/y_2d", (n, m, 1, out))
        origin.update({x4: graph.origin.get(x.name, x.name),
                       y4: graph.origin.get(y.name, y.name)})
        a = node.attrs
        pads = list(a.get("pads") or [0, 0])
        attrs = {**a, "kernel_shape": [1, int(w.shape[2])],
                 "strides": [1, *(a.get("strides") or [1])],
                 "dilations": [1, *(a.get("dilations") or [1])],
                 "pads": [0, pads[0], 0, pads[1]]}
        nodes.append(node.with_(op=RESHAPE.name, name=f"{node.name}/to_2d",
                                inputs=(x.name, shape_const(f"{node.name}/x_shape",
                                                            (n, c, 1, length))),
                                outputs=(x4,), attrs={}))
        nodes.append(node.with_(inputs=(x4, w4, *node.inputs[2:]), outputs=(y4,),
                                attrs=attrs))
        nodes.append(node.with_(op=RESHAPE.name, name=f"{node.name}/to_1d",
                                inputs=(y4, shape_const(f"{node.name}/y_shape", (n, m, out))),
                                outputs=(y.name,), attrs={}))
    if not new_values:
        return graph
    return prune_values(graph, nodes, new_values, origin)


def _global_pool_2d(graph: Graph, node, new_values: dict, origin: dict) -> list:
    """A global pool of [N, C, L] (a text CNN's max over positions): over [N, C, 1, L]."""
    x, y = node.inputs[0], node.outputs[0]
    (n, c, length), dtype = graph.type_of(x).shape, graph.type_of(x).dtype
    names = {}
    for key, shape in (("x_2d", (n, c, 1, length)), ("y_2d", (n, c, 1, 1))):
        names[key] = f"{node.name}/{key}"
        new_values[names[key]] = Value(names[key], Type(dtype, shape))
    for key, shape in (("x_shape", (n, c, 1, length)), ("y_shape", (n, c, 1))):
        names[key] = f"{node.name}/{key}"
        new_values[names[key]] = Value(names[key], Type("int64", (len(shape),)),
                                       np.array(shape, np.int64))
    origin.update({names["x_2d"]: graph.origin.get(x, x), names["y_2d"]: graph.origin.get(y, y)})
    return [node.with_(op=RESHAPE.name, name=f"{node.name}/to_2d",
                       inputs=(x, names["x_shape"]), outputs=(names["x_2d"],), attrs={}),
            node.with_(inputs=(names["x_2d"],), outputs=(names["y_2d"],)),
            node.with_(op=RESHAPE.name, name=f"{node.name}/to_1d",
                       inputs=(names["y_2d"], names["y_shape"]), outputs=(y,), attrs={})]
