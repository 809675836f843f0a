"""Lowering: the quantized Graph → accelerator layers over DRAM tensors.

Each integer node becomes one layer that the array or the vector unit runs, reading and writing
whole tensors in DRAM; views (Flatten, Reshape, Squeeze, Unsqueeze, Identity) become no layer at
all, only another name for the same bytes. Every number a layer needs (int8 weights, int32 bias,
per-channel multipliers and shifts, tables) is taken from the quantized node's own attributes,
the ones the quantizer computed and the integer reference (`quantizer.reference.run_int8`) runs,
so the program and the oracle read the same integers.

**Layout** (`compiler.backend.layers`): feature maps are channels-last, the rest row-major; a view
keeps its source's bytes, and a consumer that needs another order either absorbs it (Gemm permutes
its weight rows to match a flattened channels-last map) or fails with a CompileError.

**Slices and Concat without copies** (`compiler.backend.layers.View`). Slice (constant starts, ends,
axes; forward steps, 1 on channels) and Split outputs are views: an offset and strides over
their producer's buffer, which convolutions, pools, Add/LUT (pixel by pixel) and output
bindings read in place. Concat's inputs are planned before the walk (`_plan_concats`): one
computed by a layer and read by the Concat alone is written by its producer straight into its
part of the Concat's one buffer (copy elimination, as in Glow; nested Concats share the
outermost's buffer); any other input (a model input, a view, a value read twice) is copied there
by an identity LUT. A Reshape-like view of a slice is copied to a tensor of its own first.

**Rules.** The operator table's `lower` column names each operator's rule, a function here
(`RULES`); an operator without one has no lowering. Conv, Gemm and MatMul with a constant weight run
on the array as convolutions (Gemm is a 1x1 convolution over M pixels of K channels). Grouped and
depthwise convolutions expand to block-diagonal weight tiles whose all-zero blocks are skipped.
MaxPool, AveragePool with one window size, GlobalAveragePool, Add and Sub run on the vector unit;
every single-input elementwise integer map (Relu, Clip, Rescale, Sigmoid, Tanh, ..., and Add/Sub/Mul
with a scalar constant operand) is a 256-entry LUT built by running the node's own int8 kernel on
all 256 codes, so it is bit-exact by construction. QuantizeLinear at a model input and
DequantizeLinear at a model output stay on the host: the program's I/O bindings carry their scale
and zero point. Every other node the accelerator cannot run is a CompileError naming it, or with
`allow_host` joins a host segment (`compiler.backend.partition`).
"""

from __future__ import annotations

import copy

import numpy as np

from compiler.backend.layers import (AddLayer, Binding, ConvLayer, Layer, Layout, Lowered, LutLayer,
                                     PoolLayer, Tensor, View, block_axis, block_shape)
from compiler.backend.partition import BINDINGS, HostSegments, host_only
from compiler.errors import CompileError
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, Lower, int8_attrs, node_macs
from compiler.graph.reference import resolve_pads, slice_

_INT8_MIN = -128


class Unsupported(CompileError):
    """A node the accelerator cannot run: with `allow_host` it runs on the host instead."""


def _unsupported(node: Node, why: str) -> CompileError:
    how = "" if OPS[node.op].lower in BINDINGS else \
        f" (in int8, or in fp32 with --keep-fp32 {node.name})"
    return Unsupported(f"node {node.name!r} ({node.op}): {why}; the accelerator cannot run it. "
                       f"Compile with --allow-host to run it on the host{how}, or change the "
                       f"model")


class _Lowering:
    """The walk over the graph and its tables: the layers so far, each value's buffer, layout
    and View, and the program's bindings. The rules below read and extend them."""

    def __init__(self, graph: Graph, allow_host: bool = False):
        self.g = graph
        self.allow_host = allow_host
        self.layers: list[Layer] = []
        self.tensors: dict[str, Tensor] = {}
        self.layouts: dict[str, Layout] = {}
        self.buffer: dict[str, str] = {}  # int value → the tensor holding its bytes
        self.inputs: list[Binding] = []
        self.outputs: list[Binding] = []
        self.views: dict[str, View] = {}  # value → its part of its buffer (when not all of it)
        self.into = _plan_concats(graph)  # Concat inputs their producers write in place

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
                               f"hold 8-bit activations only (quantize with int8 or uint8 activations)")
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
        if name not in self.views and \
                not self.layouts[self.buffer[name]].same_bytes(Layout.channels_last(shape)):
            raise _unsupported(node, f"input {name!r} is a view whose bytes are not in "
                                     f"channels-last order (a layout copy is not implemented)")

    # -- views: slices of a buffer, and the parts of a Concat's buffer --

    def view_of(self, name: str) -> View | None:
        """Where value `name` sits in its buffer, or None when its bytes are in an order no
        View describes (a flattened channels-last map, a rank above 4)."""
        if name in self.views:
            return self.views[name]
        shape = self.shape(name)
        if not 1 <= len(shape) <= 4 or not self.layouts[self.buffer[name]].same_bytes(
                Layout.channels_last(shape)):
            return None
        return View.dense(block_shape(shape))

    def need_view(self, node: Node, name: str) -> View:
        self.source(node, name)
        view = self.view_of(name)
        if view is None:
            raise _unsupported(node, f"input {name!r} is a view whose bytes are in no strided "
                                     f"order (a layout copy is not implemented)")
        return view

    def alias(self, name: str, buffer: str, view: View) -> None:
        """Value `name` is `view` of `buffer`; a view that is the whole buffer in the value's
        own order is the buffer itself."""
        self.buffer[name] = buffer
        if view == View.dense(block_shape(self.shape(name))) and \
                view.size == self.tensors[buffer].size_bytes:
            self.views.pop(name, None)
        else:
            self.views[name] = view

    def place(self, name: str) -> tuple[str, View]:
        """The buffer and View of a Concat's output, or of an input planned into its Concat's
        buffer; the outermost Concat's buffer is created on first use."""
        if name in self.into:
            concat, axis, start = self.into[name]
            buffer, view = self.place(concat)
            shape = self.shape(name)
            return buffer, view.sub(block_axis(len(shape), axis), start, shape[axis])
        if name not in self.tensors:
            self.new_tensor(name, Layout.channels_last(self.shape(name)))
        return name, View.dense(block_shape(self.shape(name)))

    def output(self, name: str, layout: Layout, in_place: bool = True) -> tuple[str, View | None]:
        """Where a layer writes value `name`: a new tensor of `layout`, or (copy elimination)
        its part of the Concat that reads it, when its order is the one Views describe."""
        if in_place and name in self.into and \
                layout.same_bytes(Layout.channels_last(self.shape(name))):
            buffer, view = self.place(name)
            self.alias(name, buffer, view)
            return buffer, self.views.get(name)
        return self.new_tensor(name, layout), None

    def copy(self, node: Node, x: str, buffer: str, view: View) -> None:
        """An identity LUT layer of `node`: value x (any view) → `view` of `buffer`."""
        src = self.need_view(node, x)
        codes = np.arange(-128, 128, dtype=np.int8)
        self.layers.append(LutLayer(node.name, self.source(node, x), buffer, src.size, codes,
                                    (src, view)))

    def own_copy(self, node: Node, x: str) -> str:
        """A tensor of its own holding view x densely (for a consumer that cannot read it in
        place), made by an identity LUT of `node`."""
        tensor = f"{node.name}/{x}"
        self.tensors[tensor] = Tensor(tensor, self.views[x].size)
        self.layouts[tensor] = Layout.channels_last(self.shape(x))
        self.copy(node, x, tensor, View.dense(block_shape(self.shape(x))))
        return tensor

    # -- the walk --

    def run(self) -> Lowered:
        host = HostSegments(self)
        for node in self.g.nodes:
            kind = OPS[node.op].lower
            rule = RULES.get(kind)
            why = host_only(self.g, node, host.users)
            if why is not None and not self.allow_host:
                instead = "" if kind in BINDINGS else \
                    f", or without --keep-fp32 {node.name}"
                raise CompileError(f"node {node.name!r} ({node.op}) cannot run on the "
                                   f"accelerator: {why}; compile with --allow-host to run it "
                                   f"on the host{instead}")
            if why is not None or (rule is None and self.allow_host) or (
                    kind is Lower.VIEW and host.produces(node.inputs[0])):
                host.add(node)  # a view of a value the open segment computes stays with it
                continue
            if rule is None:
                raise _unsupported(node, "no lowering for this operator")
            if not self.allow_host:
                rule(self, node)
                continue
            # The open segment ends before this node, unless the node cannot lower either:
            # then every table is rolled back to before the segment closed.
            saved = self._state(host)
            host.close()
            try:
                rule(self, node)
            except Unsupported:
                self._restore(host, saved)
                host.add(node)
        host.close()
        bound = {b.name for b in self.outputs}
        missing = [name for name in self.g.outputs if name not in bound]
        if missing:
            raise CompileError(f"graph output(s) {missing} are neither DequantizeLinear of an "
                               f"int8 tensor nor computed on the host (--allow-host): the "
                               f"program cannot return them")
        views = {v: b for v, b in self.buffer.items() if v != b}
        return Lowered(self.g.name, tuple(self.layers), self.tensors, tuple(self.inputs),
                       tuple(self.outputs), views)

    def _state(self, host: HostSegments):
        """A snapshot of every table of the walk (shallow copies: their entries are frozen)."""
        tables = {k: copy.copy(v) for k, v in vars(self).items()
                  if isinstance(v, (dict, list, set))}
        return tables, host.state()

    def _restore(self, host: HostSegments, state) -> None:
        tables, open_segment = state
        vars(self).update(tables)
        host.restore(open_segment)


# -- the rules: one per kind of the operator table's `lower` column --


def lower_slice(lw: _Lowering, node: Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    params = [lw.g.values[n].const if n else None for n in node.inputs[1:]]
    if any(n and p is None for n, p in zip(node.inputs[1:], params)):
        raise _unsupported(node, "its starts, ends, axes and steps must be constants")
    while params and params[-1] is None:
        params.pop()
    view, shape = lw.need_view(node, x), lw.shape(x)
    for axis in range(len(shape)):
        # The reference's own index arithmetic, run on this axis's coordinates.
        grid = np.broadcast_to(np.arange(shape[axis]).reshape(
            [-1 if a == axis else 1 for a in range(len(shape))]), shape)
        picked = slice_(grid, *params)
        if picked.size == 0:
            raise _unsupported(node, f"it selects nothing from {x!r}")
        coords = picked[tuple(slice(None) if a == axis else 0 for a in range(len(shape)))]
        start, count = int(coords[0]), len(coords)
        step = int(coords[1] - coords[0]) if count > 1 else 1
        if step < 1 or not np.array_equal(coords, start + step * np.arange(count)):
            raise _unsupported(node, f"its step {step} on axis {axis} is not forward")
        if (start, count, step) == (0, shape[axis], 1):
            continue
        try:
            view = view.sub(block_axis(len(shape), axis), start, count, step)
        except ValueError:
            raise _unsupported(node, f"a channel step of {step} (channels are contiguous "
                                     f"in memory; a view cannot skip them)") from None
    lw.alias(y, lw.source(node, x), view)


def lower_split(lw: _Lowering, node: Node) -> None:
    x = node.inputs[0]
    view, shape = lw.need_view(node, x), lw.shape(x)
    axis = int(int8_attrs(node)["axis"]) % len(shape)
    start = 0
    for y in node.outputs:
        count = lw.shape(y)[axis]
        lw.alias(y, lw.source(node, x),
                   view.sub(block_axis(len(shape), axis), start, count))
        start += count


def lower_concat(lw: _Lowering, node: Node) -> None:
    """Inputs planned in place were written into their parts by their producers; the
    others (model inputs, views, values read twice or by other nodes) are copied."""
    y = node.outputs[0]
    shape = lw.shape(y)
    if not 1 <= len(shape) <= 4:
        raise _unsupported(node, f"its output has rank {len(shape)} (ranks 1 to 4 lower)")
    axis = int(node.attrs["axis"]) % len(shape)
    buffer, view = lw.place(y)
    lw.alias(y, buffer, view)
    start = 0
    for x in node.inputs:
        count = lw.shape(x)[axis]
        part = view.sub(block_axis(len(shape), axis), start, count)
        start += count
        if lw.buffer.get(x) == buffer and lw.view_of(x) == part:
            continue
        lw.copy(node, x, buffer, part)


def lower_quantize(lw: _Lowering, node: Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    params = lw.quant(y)
    shape = lw.shape(y)
    layout = Layout.channels_last(shape)
    lw.new_tensor(y, layout)
    lw.inputs.append(Binding(x, y, shape, float(params.scale[0]),
                               int(params.zero_point[0]), layout.strides(shape)))


def lower_dequantize(lw: _Lowering, node: Node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    params = lw.quant(x)
    tensor = lw.source(node, x)
    shape = lw.shape(x)
    strides, offset = lw.layouts[tensor].strides(shape), 0
    if x in lw.views:  # a part of a buffer: its View's strides, in logical axis order
        view = lw.views[x]
        block = (*view.strides, 1)
        strides = tuple(block[block_axis(len(shape), i)] for i in range(len(shape)))
        offset = view.offset
    if strides is None:  # with allow_host, the host dequantizes it (and reorders it)
        raise _unsupported(node, f"output {y!r} is a view of {tensor!r} whose byte order "
                                 f"no strided binding describes (a layout copy is not "
                                 f"implemented)")
    lw.outputs.append(Binding(y, tensor, shape, float(params.scale[0]),
                                int(params.zero_point[0]), strides, offset=offset))


def lower_view(lw: _Lowering, node: Node) -> None:
    # Same bytes, another logical shape: the layout (dims, perm) describes the flat logical
    # order, which a view keeps, so it carries over unchanged. A part of a buffer (a slice)
    # is first copied to a tensor of its own.
    x = node.inputs[0]
    lw.buffer[node.outputs[0]] = lw.own_copy(node, x) if x in lw.views else \
        lw.source(node, x)


def lower_conv(lw: _Lowering, node: Node) -> None:
    a = int8_attrs(node)
    x, y = node.inputs[0], node.outputs[0]
    w = lw.g.values[node.inputs[1]].const
    if w is None or w.ndim != 4:
        raise _unsupported(node, "only 2-D convolutions with constant weights lower")
    lw.need_channels_last(node, x)
    n, cin, h, wd = lw.shape(x)
    _, cout, oh, ow = lw.shape(y)
    pads, out, strides, dilations = resolve_pads((h, wd), tuple(w.shape[2:]), a["strides"],
                                                 a["dilations"], a["pads"], a["auto_pad"])
    assert tuple(out) == (oh, ow)
    group = int(a["group"])
    dense = _expand_groups(np.asarray(w, np.int8), group, cin)
    bias = _bias(lw, node, 2, cout)
    y_tensor, y_view = lw.output(y, Layout.channels_last((n, cout, oh, ow)))
    lw.layers.append(ConvLayer(
        node.name, lw.source(node, x), y_tensor,
        n, (h, wd), (oh, ow), cin, cout, tuple(w.shape[2:]), tuple(strides), tuple(dilations),
        (pads[0], pads[1], pads[2], pads[3]), int(a.get("x_zero_point", 0)), dense, bias,
        *_requant(node, cout), macs=node_macs(lw.g, node), group=group, x_view=lw.views.get(x),
        y_view=y_view))


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


def lower_gemm(lw: _Lowering, node: Node) -> None:
    a = int8_attrs(node)
    if a["transA"]:
        raise _unsupported(node, "transA=1 is not supported")
    b = lw.g.values[node.inputs[1]].const
    if b is None:
        raise _unsupported(node, "both operands are activations (only constant weights lower)")
    weights = np.asarray(b if a["transB"] else b.T, np.int8)  # (N, K)
    _matmul(lw, node, weights, bias_index=2)


def lower_matmul(lw: _Lowering, node: Node) -> None:
    b = lw.g.values[node.inputs[1]].const
    if b is None or b.ndim != 2:
        raise _unsupported(node, "only MatMul by a constant 2-D weight lowers")
    if a_zero := int(node.attrs.get("a_zero_point", 0)):
        raise _unsupported(node, f"activation zero point {a_zero} is not folded")
    _matmul(lw, node, np.asarray(b.T, np.int8), bias_index=2)


def _matmul(lw: _Lowering, node: Node, weights: np.ndarray, bias_index: int) -> None:
    """A (M, K) @ W^T as a 1x1 convolution over M pixels of K channels (rows of A)."""
    x = node.inputs[0]
    shape = lw.shape(x)
    k = shape[-1]
    m = int(np.prod(shape[:-1], dtype=np.int64))
    n_out = weights.shape[0]
    tensor = lw.source(node, x)
    if x in lw.views:
        return _matmul_view(lw, node, weights, bias_index)
    order = lw.layouts[tensor].order().reshape(m, k)
    rows = order // k
    if not np.array_equal(rows, np.broadcast_to(np.arange(m)[:, None], (m, k))) or \
            not np.all(order % k == (order[0] % k)[None, :]):
        raise _unsupported(node, f"input {x!r} is a view whose rows are not contiguous "
                                 f"(a layout copy is not implemented)")
    # Physical feature j of every row is logical feature perm[j] (a flattened channels-last
    # map): permute the weight's K axis to match instead of copying the activation.
    perm = order[0] % k
    dense = weights[:, perm].reshape(n_out, k, 1, 1)
    _gemm_layer(lw, node, tensor, None, m, k, dense, bias_index)


def _matmul_view(lw: _Lowering, node: Node, weights: np.ndarray, bias_index: int) -> None:
    """The rows of A are a slice or a Concat part: M pixels at the view's pixel stride."""
    x = node.inputs[0]
    view, k = lw.views[x], lw.shape(x)[-1]
    n, h, w, _ = view.shape
    m = n * h * w
    dense = weights.reshape(weights.shape[0], k, 1, 1)
    if (w > 1 and h > 1 and view.row != w * view.pixel) or \
            (n > 1 and h * w > 1 and view.strides[0] != h * view.row):
        # Rows not evenly spaced (a crop of a rank-3 value): copy them together first.
        return _gemm_layer(lw, node, lw.own_copy(node, x), None, m, k, dense, bias_index)
    pixel = view.pixel if w > 1 else view.row if h > 1 else view.strides[0]
    rows = View((1, 1, m, k), view.offset, (m * pixel, m * pixel, pixel))
    _gemm_layer(lw, node, lw.source(node, x), rows, m, k, dense, bias_index)


def _gemm_layer(lw: _Lowering, node: Node, tensor: str, x_view: View | None, m: int, k: int,
                dense: np.ndarray, bias_index: int) -> None:
    y = node.outputs[0]
    n_out = dense.shape[0]
    bias = _bias(lw, node, bias_index, n_out)
    # A matrix product writes M rows of N: a part of a Concat only as a rank-2 value.
    y_tensor, y_view = lw.output(y, Layout.row_major(lw.shape(y)),
                                   len(lw.shape(y)) <= 2)
    lw.layers.append(ConvLayer(
        node.name, tensor, y_tensor, 1, (1, m), (1, m), k, n_out, (1, 1), (1, 1), (1, 1),
        (0, 0, 0, 0), 0, dense, bias, *_requant(node, n_out), macs=node_macs(lw.g, node),
        x_view=x_view, y_view=y_view))


def _bias(lw: _Lowering, node: Node, index: int, channels: int) -> np.ndarray | None:
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    bias = lw.g.values[node.inputs[index]].const
    if bias is None:
        raise _unsupported(node, "its bias is not constant")
    bias = np.asarray(bias, np.int64)
    if bias.size == 1:
        return np.full(channels, int(bias.ravel()[0]), np.int32)
    flat = bias.reshape(-1, bias.shape[-1]) if bias.ndim > 1 else bias.reshape(1, -1)
    if flat.shape[1] != channels or np.any(flat != flat[0]):
        raise _unsupported(node, f"its bias of shape {bias.shape} is not per output channel")
    return flat[0].astype(np.int32)


def _requant(node: Node, channels: int):
    a = int8_attrs(node)
    if a.get("out_dtype", "int8") != "int8":
        raise _unsupported(node, f"output type {a['out_dtype']} (the scratchpad holds int8)")
    multiplier = np.broadcast_to(np.asarray(a["multiplier"], np.int64), (channels,)).copy() \
        if len(a["multiplier"]) == 1 else np.asarray(a["multiplier"], np.int64)
    shift = np.broadcast_to(np.asarray(a["shift"], np.int64), (channels,)).copy() \
        if len(a["shift"]) == 1 else np.asarray(a["shift"], np.int64)
    qclamp = tuple(int(q) for q in (a.get("qclamp") or (-128, 127)))
    return multiplier, shift, int(a.get("out_zero_point", 0)), qclamp


def _pool(lw: _Lowering, node: Node, average: bool, kernel, strides, pads, pad_value, **params):
    x, y = node.inputs[0], node.outputs[0]
    lw.need_channels_last(node, x)
    n, c, h, w = lw.shape(x)
    _, _, oh, ow = lw.shape(y)
    y_tensor, y_view = lw.output(y, Layout.channels_last((n, c, oh, ow)))
    lw.layers.append(PoolLayer(
        node.name, lw.source(node, x), y_tensor,
        n, (h, w), (oh, ow), c, tuple(kernel), tuple(strides), tuple(pads), pad_value,
        average, **params, x_view=lw.views.get(x), y_view=y_view))


def _window(lw: _Lowering, node: Node, a: dict, ceil_mode: int):
    x = node.inputs[0]
    h, w = lw.shape(x)[2:]
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


def lower_max_pool(lw: _Lowering, node: Node) -> None:
    a = int8_attrs(node)
    kernel, strides, pads = _window(lw, node, a, a["ceil_mode"])
    _pool(lw, node, False, kernel, strides, pads, _INT8_MIN)


def lower_average_pool(lw: _Lowering, node: Node) -> None:
    a = int8_attrs(node)
    if len(a["counts"]) != 1:
        raise _unsupported(node, f"its windows have {len(a['counts'])} different sizes "
                                 f"{list(a['counts'])} (one multiplier per layer lowers)")
    kernel, strides, pads = _window(lw, node, a, a["ceil_mode"])
    mult, shift, out_zp, qclamp = _requant(node, 1)
    _pool(lw, node, True, kernel, strides, pads, int(a.get("x_zero_point", 0)),
               multiplier=int(mult[0]), shift=int(shift[0]), out_zero_point=out_zp,
               qclamp=qclamp)


def lower_global_average_pool(lw: _Lowering, node: Node) -> None:
    a = int8_attrs(node)
    h, w = lw.shape(node.inputs[0])[2:]
    mult, shift, out_zp, qclamp = _requant(node, 1)
    _pool(lw, node, True, (h, w), (1, 1), (0, 0, 0, 0), int(a.get("x_zero_point", 0)),
               multiplier=int(mult[0]), shift=int(shift[0]), out_zero_point=out_zp,
               qclamp=qclamp)


def lower_global_max_pool(lw: _Lowering, node: Node) -> None:
    h, w = lw.shape(node.inputs[0])[2:]
    _pool(lw, node, False, (h, w), (1, 1), (0, 0, 0, 0), _INT8_MIN)


def lower_add(lw: _Lowering, node: Node) -> None:
    if _scalar_operand(lw, node):
        return lower_lut(lw, node)
    _add(lw, node, negate_b=False)


def lower_sub(lw: _Lowering, node: Node) -> None:
    if _scalar_operand(lw, node):
        return lower_lut(lw, node)
    _add(lw, node, negate_b=True)


def _add(lw: _Lowering, node: Node, negate_b: bool) -> None:
    a = int8_attrs(node)
    x, z, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if lw.shape(x) != lw.shape(y) or lw.shape(z) != lw.shape(y):
        raise _unsupported(node, f"broadcasting {lw.shape(x)} with {lw.shape(z)}")
    ta, tb = lw.source(node, x), lw.source(node, z)
    parts = x in lw.views or z in lw.views
    if not parts and not lw.layouts[ta].same_bytes(lw.layouts[tb]):
        raise _unsupported(node, "its inputs are stored in different orders")
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)) if parts
                             else lw.layouts[ta])
    views = None
    if parts or y_view is not None:  # some operand is a part of a buffer: run over Views
        views = (lw.need_view(node, x), lw.need_view(node, z),
                 y_view or View.dense(block_shape(lw.shape(y))))
    mult = list(a["multiplier"])
    if negate_b:  # sub_int8: an ADD whose b rescale is negated
        mult[1] = -mult[1]
    qclamp = tuple(int(q) for q in (a.get("qclamp") or (-128, 127)))
    lw.layers.append(AddLayer(
        node.name, ta, tb, ty, lw.tensors[ty].size_bytes if views is None else
        views[2].size, int(a["a_zero_point"]), int(a["b_zero_point"]),
        tuple(int(m) for m in mult), tuple(int(s) for s in a["shift"]),
        int(a["out_zero_point"]), qclamp, views))


def lower_lut(lw: _Lowering, node: Node) -> None:
    """A LUT of the node's own int8 kernel run on all 256 codes of its one activation
    input (other inputs are constants: Clip's bounds, a scalar Add/Mul operand)."""
    activations = [i for i, n in enumerate(node.inputs)
                   if n and not lw.g.values[n].is_const]
    if len(activations) != 1:
        raise _unsupported(node, "it has no single activation input")
    index = activations[0]
    x, y = node.inputs[index], node.outputs[0]
    if lw.g.type_of(x).dtype != "int8":
        raise _unsupported(node, "its input is not int8")
    codes = np.arange(-128, 128, dtype=np.int8)
    args = [codes if i == index else (lw.g.values[n].const if n else None)
            for i, n in enumerate(node.inputs)]
    while args and args[-1] is None:
        args.pop()
    table = np.asarray(OPS[node.op].int8(*args, **int8_attrs(node)))
    if table.dtype != np.int8 or table.size != 256:
        raise _unsupported(node, "its int8 kernel is not an elementwise int8 map")
    tensor = lw.source(node, x)
    part = x in lw.views
    ty, y_view = lw.output(y, Layout.channels_last(lw.shape(y)) if part
                             else lw.layouts[tensor])
    views = None
    if part or y_view is not None:  # a part of a buffer in or out: run over Views
        views = (lw.need_view(node, x), y_view or View.dense(block_shape(lw.shape(y))))
    lw.layers.append(LutLayer(node.name, tensor, ty, lw.tensors[tensor].size_bytes
                                if views is None else views[0].size, table.reshape(256),
                                views))


def _scalar_operand(lw: _Lowering, node: Node) -> bool:
    """Whether one operand is a one-element constant: then the op is a map of the other."""
    return any(n and lw.g.values[n].is_const and lw.g.values[n].const.size == 1
               for n in node.inputs)


def lower_scalar_lut(lw: _Lowering, node: Node) -> None:
    if not _scalar_operand(lw, node):
        raise _unsupported(node, "only multiplication by a scalar constant lowers (as a LUT)")
    lower_lut(lw, node)


# The operator table's `lower` column → the function that lowers a node of that kind.
RULES = {
    Lower.CONV: lower_conv,
    Lower.GEMM: lower_gemm,
    Lower.MATMUL: lower_matmul,
    Lower.MAX_POOL: lower_max_pool,
    Lower.AVERAGE_POOL: lower_average_pool,
    Lower.GLOBAL_MAX_POOL: lower_global_max_pool,
    Lower.GLOBAL_AVERAGE_POOL: lower_global_average_pool,
    Lower.ADD: lower_add,
    Lower.SUB: lower_sub,
    Lower.SCALAR_LUT: lower_scalar_lut,
    Lower.LUT: lower_lut,
    Lower.VIEW: lower_view,
    Lower.SLICE: lower_slice,
    Lower.SPLIT: lower_split,
    Lower.CONCAT: lower_concat,
    Lower.QUANTIZE: lower_quantize,
    Lower.DEQUANTIZE: lower_dequantize,
}


def lower(graph: Graph, allow_host: bool = False) -> Lowered:
    """The accelerator layers of a quantized graph; CompileError names any node that cannot run
    on the accelerator, unless `allow_host` gives such nodes to host segments
    (`compiler.backend.partition`)."""
    return _Lowering(graph, allow_host).run()


# Rules whose output is not a fresh tensor a layer writes: views of their input, and the model's
# inputs (written by the host, at their bindings).
_NOT_IN_PLACE = frozenset({Lower.VIEW, Lower.SLICE, Lower.SPLIT, *BINDINGS})


def _plan_concats(graph: Graph) -> dict[str, tuple[str, int, int]]:
    """Concat inputs whose producers write straight into the Concat's buffer (copy elimination,
    as in Glow): value → (Concat output, axis, first index along it). Only a value the Concat
    alone reads, once, that no output binds and that a layer computes qualifies."""
    users, producers = graph.users(), graph.producers()
    into = {}
    for node in graph.nodes:
        if OPS[node.op].lower is not Lower.CONCAT:
            continue
        y = node.outputs[0]
        rank = len(graph.type_of(y).shape)
        # Only a Concat that will lower: int8, of activations (else the host may run it, and
        # its producers must write tensors of their own).
        if not 1 <= rank <= 4 or graph.type_of(y).quant is None or \
                any(graph.values[x].is_const for x in node.inputs):
            continue
        axis = int(node.attrs["axis"]) % rank
        start = 0
        for x in node.inputs:
            producer = producers.get(x)
            if (producer is not None and OPS[producer.op].lower not in _NOT_IN_PLACE
                    and len(producer.outputs) == 1 and len(users.get(x, ())) == 1
                    and x not in graph.outputs):
                into[x] = (y, axis, start)
            start += graph.type_of(x).shape[axis]
    return into
