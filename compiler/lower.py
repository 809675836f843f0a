"""Lowering: the quantized Graph → accelerator layers over DRAM tensors.

Each integer node becomes one layer that the array or the vector unit runs, reading and writing
whole tensors in DRAM; views (Flatten, Reshape, Squeeze, Unsqueeze, Identity) become no layer at
all, only another name for the same bytes. Every number a layer needs (int8 weights, int32 bias,
per-channel multipliers and shifts, tables) is taken from the quantized node's own attributes,
the ones the quantizer computed and the integer reference (`quantizer.reference.run_int8`) runs,
so the program and the oracle read the same integers.

**Layout** (`compiler.layers`): feature maps are channels-last, the rest row-major; a view keeps
its source's bytes, and a consumer that needs another order either absorbs it (Gemm permutes its
weight rows to match a flattened channels-last map) or fails with a CompileError.

**Rules.** Conv, Gemm and MatMul with a constant weight run on the array as convolutions
(Gemm is a 1x1 convolution over M pixels of K channels). Grouped and depthwise convolutions
expand to block-diagonal weight tiles whose all-zero blocks are skipped. MaxPool, AveragePool
with one window size, GlobalAveragePool, Add and Sub run on the vector unit; every single-input
elementwise integer map (Relu, Clip, Rescale, Sigmoid, Tanh, ..., and Add/Sub/Mul with a scalar
constant operand) is a 256-entry LUT built by running the node's own int8 kernel on all 256
codes, so it is bit-exact by construction.
QuantizeLinear at a model input and DequantizeLinear at a model output stay on the host: the
program's I/O bindings carry their scale and zero point.
"""

from __future__ import annotations

import numpy as np

from compiler.errors import CompileError
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, int8_attrs, is_integer_node
from compiler.graph.reference import resolve_pads
from compiler.layers import (AddLayer, Binding, ConvLayer, Layer, Layout, Lowered, LutLayer,
                             PoolLayer, Tensor)

VIEWS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")
# Single-input elementwise maps of int8 codes: each runs as a LUT of its own kernel.
ELEMENTWISE = ("Relu", "Clip", "Rescale", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish",
               "LeakyRelu")
_INT8_MIN = -128


def _unsupported(node: Node, why: str) -> CompileError:
    return CompileError(f"node {node.name!r} ({node.op}): {why}; the accelerator cannot run it. "
                        f"Keep it in fp32 with --keep-fp32 {node.name} (needs host segments), or "
                        f"change the model")


class _Lowering:
    def __init__(self, graph: Graph):
        self.g = graph
        self.layers: list[Layer] = []
        self.tensors: dict[str, Tensor] = {}
        self.layouts: dict[str, Layout] = {}
        self.buffer: dict[str, str] = {}  # int value → the tensor holding its bytes
        self.inputs: list[Binding] = []
        self.outputs: list[Binding] = []

    # -- values --

    def shape(self, name: str) -> tuple[int, ...]:
        return self.g.type_of(name).shape

    def quant(self, name: str):
        params = self.g.type_of(name).quant
        if params is None or params.axis is not None:
            raise CompileError(f"value {name!r}: expected a per-tensor quantized int8 tensor")
        return params

    def new_tensor(self, name: str, layout: Layout) -> str:
        dtype = self.g.type_of(name).dtype
        if dtype != "int8":
            raise CompileError(f"value {name!r} is {dtype}: the accelerator's local memories "
                               f"hold int8 activations only (quantize with int8 activations)")
        self.tensors[name] = Tensor(name, int(np.prod(self.shape(name), dtype=np.int64)))
        self.layouts[name] = layout
        self.buffer[name] = name
        return name

    def source(self, node: Node, name: str) -> str:
        if name not in self.buffer:
            value = self.g.values[name]
            what = "a constant" if value.is_const else "computed on the host (fp32)"
            raise _unsupported(node, f"its input {name!r} is {what}, not an int8 activation")
        return self.buffer[name]

    def need_channels_last(self, node: Node, name: str) -> None:
        shape = self.shape(name)
        if len(shape) != 4:
            raise _unsupported(node, f"input {name!r} has rank {len(shape)}; expected "
                                     f"N x C x H x W")
        if not self.layouts[self.buffer[name]].same_bytes(Layout.channels_last(shape)):
            raise _unsupported(node, f"input {name!r} is a view whose bytes are not in "
                                     f"channels-last order (a layout copy is not implemented)")

    # -- the walk --

    def run(self) -> Lowered:
        for node in self.g.nodes:
            handler = getattr(self, f"lower_{node.op}", None)
            if node.op in ELEMENTWISE:
                handler = self.lower_elementwise
            elif node.op in VIEWS:
                handler = self.lower_view
            if not self._is_integer(node):
                raise CompileError(f"node {node.name!r} ({node.op}) runs in fp32: host segments "
                                   f"are not implemented, so every node between the model's "
                                   f"QuantizeLinear and DequantizeLinear must be int8")
            if handler is None:
                raise _unsupported(node, "no lowering for this operator")
            handler(node)
        bound = {b.name for b in self.outputs}
        missing = [name for name in self.g.outputs if name not in bound]
        if missing:
            raise CompileError(f"graph output(s) {missing} are not DequantizeLinear of an int8 "
                               f"tensor: the program can only return quantized outputs")
        views = {v: b for v, b in self.buffer.items() if v != b}
        return Lowered(self.g.name, tuple(self.layers), self.tensors, tuple(self.inputs),
                       tuple(self.outputs), views)

    def _is_integer(self, node: Node) -> bool:
        return is_integer_node(self.g, node)

    def lower_QuantizeLinear(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        if x not in self.g.inputs:
            raise CompileError(f"node {node.name!r} (QuantizeLinear) quantizes {x!r}, which is "
                               f"not a model input: host segments are not implemented")
        params = self.quant(y)
        shape = self.shape(y)
        layout = Layout.channels_last(shape)
        self.new_tensor(y, layout)
        self.inputs.append(Binding(x, y, shape, float(params.scale[0]),
                                   int(params.zero_point[0]), layout.strides(shape)))

    def lower_DequantizeLinear(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        if y not in self.g.outputs:
            readers = [n.name for n in self.g.users().get(y, [])]
            raise CompileError(f"fp32 node(s) {readers} (kept with --keep-fp32, or not "
                               f"quantizable) read {x!r} through {node.name!r}: host segments "
                               f"are not implemented, so the program cannot run them; compile "
                               f"without --keep-fp32 for these nodes")
        params = self.quant(x)
        tensor = self.source(node, x)
        shape = self.shape(x)
        strides = self.layouts[tensor].strides(shape)
        if strides is None:
            raise CompileError(f"output {y!r} is a view of {tensor!r} whose byte order no "
                               f"strided binding describes (a layout copy is not implemented)")
        self.outputs.append(Binding(y, tensor, shape, float(params.scale[0]),
                                    int(params.zero_point[0]), strides))

    def lower_view(self, node: Node) -> None:
        # Same bytes, another logical shape: the layout (dims, perm) describes the flat logical
        # order, which a view keeps, so it carries over unchanged.
        self.buffer[node.outputs[0]] = self.source(node, node.inputs[0])

    def lower_Conv(self, node: Node) -> None:
        a = int8_attrs(node)
        x, y = node.inputs[0], node.outputs[0]
        w = self.g.values[node.inputs[1]].const
        if w is None or w.ndim != 4:
            raise _unsupported(node, "only 2-D convolutions with constant weights lower")
        self.need_channels_last(node, x)
        n, cin, h, wd = self.shape(x)
        _, cout, oh, ow = self.shape(y)
        pads, out, strides, dilations = resolve_pads((h, wd), tuple(w.shape[2:]), a["strides"],
                                                     a["dilations"], a["pads"], a["auto_pad"])
        assert tuple(out) == (oh, ow)
        group = int(a["group"])
        dense = _expand_groups(np.asarray(w, np.int8), group, cin)
        bias = self._bias(node, 2, cout)
        y_tensor = self.new_tensor(y, Layout.channels_last((n, cout, oh, ow)))
        self.layers.append(ConvLayer(
            node.name, self.source(node, x), y_tensor,
            n, (h, wd), (oh, ow), cin, cout, tuple(w.shape[2:]), tuple(strides), tuple(dilations),
            (pads[0], pads[1], pads[2], pads[3]), int(a.get("x_zero_point", 0)), dense, bias,
            *self._requant(node, cout), group=group))

    def lower_Gemm(self, node: Node) -> None:
        a = int8_attrs(node)
        if a["transA"]:
            raise _unsupported(node, "transA=1 is not supported")
        b = self.g.values[node.inputs[1]].const
        if b is None:
            raise _unsupported(node, "both operands are activations (only constant weights lower)")
        weights = np.asarray(b if a["transB"] else b.T, np.int8)  # (N, K)
        self._matmul(node, weights, bias_index=2)

    def lower_MatMul(self, node: Node) -> None:
        b = self.g.values[node.inputs[1]].const
        if b is None or b.ndim != 2:
            raise _unsupported(node, "only MatMul by a constant 2-D weight lowers")
        if a_zero := int(node.attrs.get("a_zero_point", 0)):
            raise _unsupported(node, f"activation zero point {a_zero} is not folded")
        self._matmul(node, np.asarray(b.T, np.int8), bias_index=2)

    def _matmul(self, node: Node, weights: np.ndarray, bias_index: int) -> None:
        """A (M, K) @ W^T as a 1x1 convolution over M pixels of K channels (rows of A)."""
        x, y = node.inputs[0], node.outputs[0]
        shape = self.shape(x)
        k = shape[-1]
        m = int(np.prod(shape[:-1], dtype=np.int64))
        n_out = weights.shape[0]
        tensor = self.source(node, x)
        order = self.layouts[tensor].order().reshape(m, k)
        rows = order // k
        if not np.array_equal(rows, np.broadcast_to(np.arange(m)[:, None], (m, k))) or \
                not np.all(order % k == (order[0] % k)[None, :]):
            raise _unsupported(node, f"input {x!r} is a view whose rows are not contiguous "
                                     f"(a layout copy is not implemented)")
        # Physical feature j of every row is logical feature perm[j] (a flattened channels-last
        # map): permute the weight's K axis to match instead of copying the activation.
        perm = order[0] % k
        dense = weights[:, perm].reshape(n_out, k, 1, 1)
        bias = self._bias(node, bias_index, n_out)
        out_shape = self.shape(y)
        self.layers.append(ConvLayer(
            node.name, tensor, self.new_tensor(y, Layout.row_major(out_shape)), 1, (1, m),
            (1, m), k, n_out, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 0, dense, bias,
            *self._requant(node, n_out)))

    def _bias(self, node: Node, index: int, channels: int) -> np.ndarray | None:
        if len(node.inputs) <= index or not node.inputs[index]:
            return None
        bias = self.g.values[node.inputs[index]].const
        if bias is None:
            raise _unsupported(node, "its bias is not constant")
        bias = np.asarray(bias, np.int64)
        if bias.size == 1:
            return np.full(channels, int(bias.ravel()[0]), np.int32)
        flat = bias.reshape(-1, bias.shape[-1]) if bias.ndim > 1 else bias.reshape(1, -1)
        if flat.shape[1] != channels or np.any(flat != flat[0]):
            raise _unsupported(node, f"its bias of shape {bias.shape} is not per output channel")
        return flat[0].astype(np.int32)

    def _requant(self, node: Node, channels: int):
        a = int8_attrs(node)
        if a.get("out_dtype", "int8") != "int8":
            raise _unsupported(node, f"output type {a['out_dtype']} (the scratchpad holds int8)")
        multiplier = np.broadcast_to(np.asarray(a["multiplier"], np.int64), (channels,)).copy() \
            if len(a["multiplier"]) == 1 else np.asarray(a["multiplier"], np.int64)
        shift = np.broadcast_to(np.asarray(a["shift"], np.int64), (channels,)).copy() \
            if len(a["shift"]) == 1 else np.asarray(a["shift"], np.int64)
        qclamp = tuple(int(q) for q in (a.get("qclamp") or (-128, 127)))
        return multiplier, shift, int(a.get("out_zero_point", 0)), qclamp

    def _pool(self, node: Node, average: bool, kernel, strides, pads, pad_value, **params):
        x, y = node.inputs[0], node.outputs[0]
        self.need_channels_last(node, x)
        n, c, h, w = self.shape(x)
        _, _, oh, ow = self.shape(y)
        y_tensor = self.new_tensor(y, Layout.channels_last((n, c, oh, ow)))
        self.layers.append(PoolLayer(
            node.name, self.source(node, x), y_tensor,
            n, (h, w), (oh, ow), c, tuple(kernel), tuple(strides), tuple(pads), pad_value,
            average, **params))

    def _window(self, node: Node, a: dict, ceil_mode: int):
        x = node.inputs[0]
        h, w = self.shape(x)[2:]
        if a.get("dilations") and any(d != 1 for d in a["dilations"]):
            raise _unsupported(node, "dilated pooling windows are not supported")
        kernel = tuple(a["kernel_shape"])
        if len(kernel) != 2:
            raise _unsupported(node, "only 2-D pooling lowers")
        pads, out, strides, _ = resolve_pads((h, w), kernel, a["strides"], None, a["pads"],
                                             a["auto_pad"], ceil_mode)
        # The vector unit's window count is (in - k) // s + 1: pad the far side so that every
        # output (ceil_mode's partial windows included) has its full window in the block.
        far = [max(p2, (o - 1) * s + k - size - p1) for p1, p2, o, s, k, size in
               zip(pads[:2], pads[2:], out, strides, kernel, (h, w))]
        return kernel, tuple(strides), (pads[0], pads[1], far[0], far[1])

    def lower_MaxPool(self, node: Node) -> None:
        a = int8_attrs(node)
        kernel, strides, pads = self._window(node, a, a["ceil_mode"])
        self._pool(node, False, kernel, strides, pads, _INT8_MIN)

    def lower_AveragePool(self, node: Node) -> None:
        a = int8_attrs(node)
        if len(a["counts"]) != 1:
            raise _unsupported(node, f"its windows have {len(a['counts'])} different sizes "
                                     f"{list(a['counts'])} (one multiplier per layer lowers)")
        kernel, strides, pads = self._window(node, a, a["ceil_mode"])
        mult, shift, out_zp, qclamp = self._requant(node, 1)
        self._pool(node, True, kernel, strides, pads, int(a.get("x_zero_point", 0)),
                   multiplier=int(mult[0]), shift=int(shift[0]), out_zero_point=out_zp,
                   qclamp=qclamp)

    def lower_GlobalAveragePool(self, node: Node) -> None:
        a = int8_attrs(node)
        h, w = self.shape(node.inputs[0])[2:]
        mult, shift, out_zp, qclamp = self._requant(node, 1)
        self._pool(node, True, (h, w), (1, 1), (0, 0, 0, 0), int(a.get("x_zero_point", 0)),
                   multiplier=int(mult[0]), shift=int(shift[0]), out_zero_point=out_zp,
                   qclamp=qclamp)

    def lower_GlobalMaxPool(self, node: Node) -> None:
        h, w = self.shape(node.inputs[0])[2:]
        self._pool(node, False, (h, w), (1, 1), (0, 0, 0, 0), _INT8_MIN)

    def lower_Add(self, node: Node) -> None:
        if self._scalar_operand(node):
            return self.lower_elementwise(node)
        self._add(node, negate_b=False)

    def lower_Sub(self, node: Node) -> None:
        if self._scalar_operand(node):
            return self.lower_elementwise(node)
        self._add(node, negate_b=True)

    def _add(self, node: Node, negate_b: bool) -> None:
        a = int8_attrs(node)
        x, z, y = node.inputs[0], node.inputs[1], node.outputs[0]
        if self.shape(x) != self.shape(y) or self.shape(z) != self.shape(y):
            raise _unsupported(node, f"broadcasting {self.shape(x)} with {self.shape(z)}")
        ta, tb = self.source(node, x), self.source(node, z)
        if not self.layouts[ta].same_bytes(self.layouts[tb]):
            raise _unsupported(node, "its inputs are stored in different orders")
        mult = list(a["multiplier"])
        if negate_b:  # sub_int8: an ADD whose b rescale is negated
            mult[1] = -mult[1]
        qclamp = tuple(int(q) for q in (a.get("qclamp") or (-128, 127)))
        self.layers.append(AddLayer(
            node.name, ta, tb, self.new_tensor(y, self.layouts[ta]), self.tensors[ta].size_bytes,
            int(a["a_zero_point"]), int(a["b_zero_point"]), tuple(int(m) for m in mult),
            tuple(int(s) for s in a["shift"]), int(a["out_zero_point"]), qclamp))

    def lower_elementwise(self, node: Node) -> None:
        """A LUT of the node's own int8 kernel run on all 256 codes of its one activation
        input (other inputs are constants: Clip's bounds, a scalar Add/Mul operand)."""
        activations = [i for i, n in enumerate(node.inputs)
                       if n and not self.g.values[n].is_const]
        if len(activations) != 1:
            raise _unsupported(node, "it has no single activation input")
        index = activations[0]
        x, y = node.inputs[index], node.outputs[0]
        if self.g.type_of(x).dtype != "int8":
            raise _unsupported(node, "its input is not int8")
        codes = np.arange(-128, 128, dtype=np.int8)
        args = [codes if i == index else (self.g.values[n].const if n else None)
                for i, n in enumerate(node.inputs)]
        while args and args[-1] is None:
            args.pop()
        table = np.asarray(OPS[node.op].int8(*args, **int8_attrs(node)))
        if table.dtype != np.int8 or table.size != 256:
            raise _unsupported(node, "its int8 kernel is not an elementwise int8 map")
        tensor = self.source(node, x)
        self.layers.append(LutLayer(node.name, tensor, self.new_tensor(y, self.layouts[tensor]),
                                    self.tensors[tensor].size_bytes, table.reshape(256)))

    def _scalar_operand(self, node: Node) -> bool:
        """Whether one operand is a one-element constant: then the op is a map of the other."""
        return any(n and self.g.values[n].is_const and self.g.values[n].const.size == 1
                   for n in node.inputs)

    def lower_Mul(self, node: Node) -> None:
        if not self._scalar_operand(node):
            raise _unsupported(node, "only multiplication by a scalar constant lowers (as a LUT)")
        self.lower_elementwise(node)


def _expand_groups(w: np.ndarray, group: int, cin: int) -> np.ndarray:
    """Grouped weights (M, C/g, kh, kw) → dense (M, C, kh, kw), zero outside each group."""
    if group == 1:
        return w
    m, cg = w.shape[:2]
    mg = m // group
    dense = np.zeros((m, cin) + w.shape[2:], np.int8)
    for g in range(group):
        dense[g * mg:(g + 1) * mg, g * cg:(g + 1) * cg] = w[g * mg:(g + 1) * mg]
    return dense


def lower(graph: Graph) -> Lowered:
    """The accelerator layers of a quantized graph; CompileError names any node that cannot run."""
    return _Lowering(graph).run()

