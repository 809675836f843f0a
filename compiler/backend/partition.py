"""Host partitioning: the nodes the accelerator does not run become host segments.

As Glow partitions a graph between devices, lowering (with `allow_host`) walks the quantized
graph in order and gives every node it cannot lower to the host CPU: nodes kept in fp32
(`--keep-fp32`, or not quantizable), the QuantizeLinear/DequantizeLinear that wrap them (those
not at a model boundary, where the program's I/O bindings quantize), and integer nodes whose
operator has no lowering or whose handler finds a case the accelerator lacks. Each maximal run
of such nodes in topological order is one segment, a `HostLayer`: it reads its inputs from
DRAM, runs its subgraph with the reference kernels (`compiler.graph.evaluate.run_node`, so the
program stays bit-exact with `quantizer.reference.run_int8`) and writes its outputs to DRAM.

**DRAM.** Values internal to a segment get no buffer. A value crossing a segment's boundary is a
DRAM tensor: int8 for quantized values, in the layout the accelerator's layers use
(channels-last for 4-D maps, else row-major, so neighbouring layers read it without a copy);
float32 (row-major, 4 bytes per element) for fp32 values, such as a model input that a
kept-fp32 first node reads, or a model output an fp32 node produces (those program bindings are
float32 with scale 1 and zero point 0). A host port accesses a tensor with its own layout's
strides, so the host sees logical arrays.

**Cost.** `flops` is a simple estimate: 2 x MACs for Conv, Gemm and MatMul, and for every other
node the larger of its activation input and output element counts; the target prices it with
`Arch.host_cycles`.
"""

from __future__ import annotations

import numpy as np

from compiler.backend.layers import Binding, HostLayer, HostPort, Layout, Tensor, block_axis
from compiler.errors import CompileError
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, Lower, is_integer_node, node_macs
from compiler.graph.serialize import graph_to_dict
from simulator.errors import listing

# The element types a host port may carry (those a program binding describes).
PORT_DTYPES = ("int8", "uint8", "int16", "float32")  # and int32, a model input's integers
# The lowerings that are a program binding: QuantizeLinear and DequantizeLinear, which wrap every
# stretch of fp32 nodes and are at home on the accelerator only at a model boundary.
BINDINGS = frozenset({Lower.QUANTIZE, Lower.DEQUANTIZE})


def host_only(graph: Graph, node: Node, users: dict[str, list[Node]]) -> str | None:
    """Why `node` can only run on the host whatever its lowering, or None: it runs in fp32, or
    it is a QuantizeLinear/DequantizeLinear that is not at a model boundary."""
    kind = OPS[node.op].lower
    if kind is Lower.QUANTIZE:
        x = node.inputs[0]
        if x not in graph.inputs:
            return f"it quantizes {x!r}, which an fp32 node computes (not a model input)"
        others = [n for n in users.get(x, []) if OPS[n.op].lower is not Lower.QUANTIZE]
        indexing = [n.name for n in others
                    if any(n.inputs[i] == x for i in OPS[n.op].index_inputs
                           if i < len(n.inputs))]
        if indexing:
            return (f"model input {x!r} is read both as integer indices (node(s) "
                    f"{listing(indexing, quote=True)}) and cast to float: a program binds an "
                    f"input one way (int32 indices or int8 codes)")
        fp32 = [n.name for n in others]
        if fp32:
            return (f"model input {x!r} is also read in fp32 by node(s) "
                    f"{listing(fp32, quote=True)}")
        return None
    if kind is Lower.DEQUANTIZE:
        y = node.outputs[0]
        readers = [n.name for n in users.get(y, [])]
        if readers:
            return f"fp32 node(s) {listing(readers, quote=True)} read its output {y!r}"
        if y not in graph.outputs:
            return f"its output {y!r} is not a model output"
        return None
    if not is_integer_node(graph, node):
        return "it runs in fp32 (kept with --keep-fp32, or not quantizable)"
    return None


def flops(graph: Graph, node: Node) -> int:
    """The estimate of one node's work: 2 x MACs for ops that multiply-accumulate (Conv, Gemm,
    MatMul), else the larger of its activation input and output element counts."""
    macs = node_macs(graph, node)
    if macs is not None:
        return 2 * macs
    out = sum(graph.type_of(name).size for name in node.outputs if name)
    ins = [graph.type_of(name).size for name in node.inputs
           if name and not graph.values[name].is_const]
    return max([out, *ins])


class HostSegments:
    """The open segment of a lowering walk (`compiler.backend.lower`), and how each one closes into
    a HostLayer over DRAM tensors that the walk's tables (tensors, layouts, buffers, bindings)
    then know."""

    def __init__(self, lowering):
        self.lw = lowering
        self.g: Graph = lowering.g
        self.users = self.g.users()
        self.nodes: list[Node] = []  # the open segment
        self.count = 0

    def add(self, node: Node) -> None:
        self.nodes.append(node)

    def produces(self, name: str) -> bool:
        """Whether the open segment computes value `name` (so it has no DRAM tensor yet)."""
        return any(name in node.outputs for node in self.nodes)

    def state(self):
        return list(self.nodes), self.count

    def restore(self, state) -> None:
        nodes, self.count = state
        self.nodes = list(nodes)

    def close(self) -> None:
        """Turn the open segment (if any) into a HostLayer after the layers so far."""
        if not self.nodes:
            return
        nodes, self.nodes = self.nodes, []
        inside = {node.name for node in nodes}
        produced = [name for node in nodes for name in node.outputs if name]
        reads = [name for node in nodes for name in node.inputs
                 if name and not self.g.values[name].is_const and name not in produced]
        inputs = tuple(self._input(name) for name in dict.fromkeys(reads))
        crossing = [name for name in produced if name in self.g.outputs or any(
            reader.name not in inside for reader in self.users.get(name, []))]
        outputs = tuple(self._output(name) for name in crossing)
        name = _segment_name(self.count, nodes)
        sub = self._subgraph(name, nodes, inputs, outputs)
        work = sum(flops(self.g, node) for node in nodes)
        self.lw.layers.append(HostLayer(name, self.count, tuple(n.name for n in nodes), inputs,
                                        outputs, graph_to_dict(sub), work))
        self.count += 1

    # -- ports --

    def _input(self, name: str) -> HostPort:
        lw = self.lw
        if name not in lw.buffer:
            if name not in self.g.inputs:
                raise CompileError(f"internal: host segment input {name!r} has no DRAM tensor")
            shape = self.g.type_of(name).shape
            if np.dtype(self.g.type_of(name).dtype).kind in "iu":
                # Integers (token ids): bound as int32, as the indexed DMA reads them.
                lw.tensors[name] = Tensor(name, 4 * int(np.prod(shape, dtype=np.int64)))
                lw.layouts[name] = Layout.row_major(shape)
                lw.buffer[name] = name
                lw.inputs.append(Binding(name, name, shape, 1.0, 0,
                                         Layout.row_major(shape).strides(shape, 4),
                                         dtype="int32"))
                return self._port(name)
            # A model input the host reads as it is (fp32): the program takes it unquantized.
            tensor = self._tensor(name)
            lw.inputs.append(Binding(name, tensor, shape, 1.0, 0,
                                     lw.layouts[tensor].strides(shape, 4), dtype="float32"))
        return self._port(name)

    def _output(self, name: str) -> HostPort:
        lw = self.lw
        t = self.g.type_of(name)
        if t.dtype == "int8":
            # Channels-last for maps, or straight into its part of the Concat that reads it
            # (copy elimination): what the accelerator's layers read without a copy.
            lw.output(name, Layout.channels_last(t.shape))
        else:
            self._tensor(name)
        if name in self.g.outputs:
            if t.dtype != "float32":
                raise CompileError(f"model output {name!r} is {t.dtype}: expected float32")
            tensor = lw.buffer[name]
            lw.outputs.append(Binding(name, tensor, t.shape, 1.0, 0,
                                      lw.layouts[tensor].strides(t.shape, 4), dtype="float32"))
        return self._port(name)

    def _port(self, name: str) -> HostPort:
        """How the host accesses value `name` in its DRAM tensor: a part of it (a slice, a
        Split output, a Concat input) through the View's strides and offset; a whole tensor
        in its own layout, which a view's value is a reshape of (views keep the logical
        order)."""
        lw = self.lw
        tensor = lw.buffer[name]
        # A tensor of its own for a view (`Walk.own_copy`) is no graph value: it holds the
        # value's own elements.
        dtype = self.g.type_of(tensor if tensor in self.g.values else name).dtype
        if any(b.tensor == tensor and b.dtype == "int32" for b in lw.inputs):
            dtype = "int32"  # a model input's integers, bound as the indexed DMA reads them
        # An int16 value's two planes of int8 codes: the strides of one, the low plane after.
        plane = lw.planes[tensor] if dtype == "int16" else 0
        if name in lw.strided:  # read by MatMuls of two activations at these strides
            offset, strides = lw.strided[name]
            return HostPort(name, tensor, self.g.type_of(name).shape, dtype, strides, offset,
                            plane)
        view = lw.views.get(name)
        if view is not None:
            shape = self.g.type_of(name).shape
            block = (*view.strides, 1)  # bytes per step of N, H, W, C (int8)
            strides = tuple(block[block_axis(len(shape), a)] for a in range(len(shape)))
            return HostPort(name, tensor, shape, dtype, strides, view.offset, plane)
        dims = tuple(lw.layouts[tensor].dims)
        strides = lw.layouts[tensor].strides(dims, 1 if plane else np.dtype(dtype).itemsize)
        if int(np.prod(dims, dtype=np.int64)) != self.g.type_of(name).size or strides is None:
            raise CompileError(f"value {name!r}, on the host, is a view of {tensor!r} that no "
                               f"strided access describes")
        return HostPort(name, tensor, dims, dtype, strides, plane=plane)

    def _tensor(self, name: str) -> str:
        """A DRAM tensor for value `name`, in the layout the accelerator's layers expect."""
        t = self.g.type_of(name)
        if t.dtype not in PORT_DTYPES:
            raise CompileError(f"value {name!r} is {t.dtype}: a host segment's inputs and "
                               f"outputs must be one of {list(PORT_DTYPES)}")
        if t.dtype == "float32":
            layout = Layout.row_major(t.shape)
        else:
            layout = Layout.channels_last(t.shape)
        lw = self.lw
        if t.dtype == "int16":  # two planes of int8 codes, as the accelerator's layers hold it
            return lw.new_tensor(name, layout)
        lw.tensors[name] = Tensor(name, t.size * np.dtype(t.dtype).itemsize)
        lw.layouts[name] = layout
        lw.buffer[name] = name
        return name

    def _subgraph(self, name: str, nodes: list[Node], inputs, outputs) -> Graph:
        names = [n for node in nodes for n in node.inputs + node.outputs if n]
        values = {n: self.g.values[n] for n in dict.fromkeys(names)}
        origin = {n: self.g.origin[n] for n in values if n in self.g.origin}
        return Graph(name, tuple(dict.fromkeys(p.value for p in inputs)),
                     tuple(p.value for p in outputs), tuple(nodes), values, self.g.opset,
                     origin)


def _segment_name(index: int, nodes: list[Node]) -> str:
    """host<i>:<first node> (or <first>..<last>), naming the nodes that are not only the
    QuantizeLinear/DequantizeLinear wrappers when there are such."""
    core = [n.name for n in nodes if OPS[n.op].lower not in BINDINGS] or [n.name for n in nodes]
    label = core[0] if len(core) == 1 else f"{core[0]}..{core[-1]}"
    return f"host{index}:{label}"
