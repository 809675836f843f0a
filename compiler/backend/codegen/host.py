"""The host CPU's part of a program: each host segment's HOST instruction, the segment records
the program carries (`Program.host_segments`), and the runner that executes one.

A segment (`compiler.backend.layers.HostLayer`, made by `compiler.backend.partition`) is one HOST
instruction on the store queue that names every DRAM tensor it reads and writes, so the scheduler
orders it after the instructions that write its inputs and before those that read its outputs, from
the same hazards as any other access. Its record lists the nodes, the input and output bindings (raw
values: int8 codes for quantized values, float32 for fp32 ones, scale 1 and zero point 0), the
serialized subgraph and the flop estimate. `run_segment` is the runner `machine.run` calls at HOST:
it runs the subgraph with `compiler.graph.evaluate.run_node`, the same node step as the integer
reference, so the program stays bit-exact with `quantizer.reference.run_int8`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from compiler.backend.codegen.emit import Context, instruction
from compiler.backend.layers import HostLayer, HostPort, Lowered
from compiler.backend.memory import DramPlan
from compiler.backend.steps import Step
from compiler.errors import CompileError
from compiler.graph.evaluate import run_node
from compiler.graph.serialize import graph_from_dict
from simulator import isa
from simulator.program import IOBinding, Program


@dataclass(frozen=True)
class HostTiles:
    """A host segment uses no local memory: it has no regions to tile."""


def host_steps(layer: HostLayer, ctx: Context) -> list[Step]:
    """One HOST instruction touching every tensor the segment reads and writes."""
    accesses = tuple(ctx.access(t, False) for t in layer.reads) + \
        tuple(ctx.access(t, True) for t in layer.writes)
    op = instruction(layer.node, isa.HOST, accesses or None, segment=layer.index,
                     compute_cycles=ctx.arch.host_cycles(layer.flops),
                     read_bytes=layer.read_bytes, write_bytes=layer.write_bytes)
    return [Step((), (op,))]


def _binding(port: HostPort, plan: DramPlan) -> dict:
    if port.tensor not in plan.addresses:
        raise CompileError(f"internal: host tensor {port.tensor!r} has no DRAM address")
    return IOBinding(port.value, plan.addresses[port.tensor] + port.offset, port.shape, 1.0, 0,
                     port.dtype, port.strides, port.plane).to_dict()


def host_segments(lowered: Lowered, plan: DramPlan) -> tuple[dict, ...]:
    """The program's record of each host segment, in segment order."""
    layers = sorted((layer for layer in lowered.layers if isinstance(layer, HostLayer)),
                    key=lambda layer: layer.index)
    return tuple({"name": layer.node, "nodes": list(layer.nodes),
                  "inputs": [_binding(p, plan) for p in layer.inputs],
                  "outputs": [_binding(p, plan) for p in layer.outputs],
                  "graph": layer.graph, "flops": layer.flops} for layer in layers)


def check_segments(program: Program, name: str) -> None:
    """Every host segment's graph deserializes (known operators, defined values) before a run
    starts: a forged one is a CompileError naming the program file `name`, not an error midway."""
    for k, segment in enumerate(program.host_segments):
        try:
            graph_from_dict(segment["graph"])
        except CompileError as err:
            raise CompileError(f"{name}: host segment {k} ({segment['name']!r}): {err}") from None


def run_segment(segment: dict, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run host segment `segment` (a `Program.host_segments` record) on its input values (by
    binding name, as read from DRAM): its output values, shaped and typed as its bindings."""
    where = f"host segment {segment['name']!r}"
    try:
        graph = graph_from_dict(segment["graph"])
    except CompileError as err:
        raise CompileError(f"{where}: {err}") from None
    env: dict[str, np.ndarray] = {n: v.const for n, v in graph.values.items() if v.is_const}
    for name in graph.inputs:
        if name not in inputs:
            raise CompileError(f"{where}: input {name!r} missing")
        # A port may read a view through its source's tensor: the logical order is the same.
        value, shape = np.asarray(inputs[name]), graph.type_of(name).shape
        if value.size != math.prod(shape):
            raise CompileError(f"{where}: input {name!r} holds {value.size} elements, its "
                               f"graph type {list(shape)}")
        env[name] = value.reshape(shape)
    for node in graph.nodes:
        args = [env[name] if name else None for name in node.inputs]
        try:
            results = run_node(graph, node, args)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError,
                ZeroDivisionError) as err:
            # The graph comes from a program file, which may be forged: attributes the compiler
            # would never write (a string for a kernel size) fail inside the kernel.
            raise CompileError(f"{where}: node {node.name!r} ({node.op}) cannot run on its "
                               f"serialized attributes: {type(err).__name__}: "
                               f"{str(err)[:200]}") from None
        for name, result in zip(node.outputs, results):
            env[name] = result
    outputs = {}
    for b in segment["outputs"]:
        if b["name"] not in env:
            raise CompileError(f"{where}: output {b['name']!r} is not a value of its graph")
        value = np.asarray(env[b["name"]])
        if value.dtype != np.dtype(b["dtype"]):
            raise CompileError(f"{where}: output {b['name']!r} is "
                               f"{value.dtype}, its binding {b['dtype']}")
        if value.size != math.prod(b["shape"]):
            raise CompileError(f"{where}: output {b['name']!r} holds {value.size} elements, "
                               f"its binding's shape {b['shape']}")
        outputs[b["name"]] = value.reshape(b["shape"])
    return outputs
