"""The lowering walk over a quantized graph (`Walk`), and what its rules share.

The walk visits the nodes in order and keeps the tables the rules read and extend: the layers so
far, each value's buffer, layout and View, and the program's bindings; with `allow_host`, the
nodes that cannot lower join host segments (`compiler.backend.partition`), and a rule that
fails midway leaves every table as it was.

**Layout** (`compiler.backend.layers`): feature maps are channels-last, the rest row-major; a view
keeps its source's bytes, and a consumer that needs another order either absorbs it (Gemm permutes
its weight rows to match a flattened channels-last map) or fails with a CompileError.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from compiler.backend.layers import (Binding, Layer, Layout, Lowered, LutLayer, Tensor, View,
                                     block_axis, block_shape, common_axes, reshaped_strides)
from compiler.backend.partition import BINDINGS, HostSegments, host_only
from compiler.errors import CompileError
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, Lower, int8_attrs
from simulator import numerics
from simulator.errors import listing
from simulator.numerics import RANGES, wide_clamp


# Every int8 code in table order: the domain a lookup table is computed over, and as a table
# the identity (a copy).
INT8_CODES = np.arange(-128, 128, dtype=np.int8)


class Unsupported(CompileError):
    """A node the accelerator cannot run: with `allow_host` it runs on the host instead."""


def unsupported(node: Node, why: str) -> CompileError:
    how = "" if OPS[node.op].lower in BINDINGS else \
        f" (in int8, or in fp32 with --keep-fp32 {node.name})"
    return Unsupported(f"node {node.name!r} ({node.op}): {why}; the accelerator cannot run it. "
                       f"Compile with --allow-host to run it on the host{how}, or change the "
                       f"model")


class Walk:
    """The walk over the graph and its tables: the layers so far, each value's buffer, layout
    and View, and the program's bindings. The rules below read and extend them."""

    def __init__(self, graph: Graph, allow_host: bool, rules: dict):
        self.g = graph
        self.rules = rules  # the operator table's `lower` kind → its rule
        self.allow_host = allow_host
        self.layers: list[Layer] = []
        self.tensors: dict[str, Tensor] = {}
        self.layouts: dict[str, Layout] = {}
        self.buffer: dict[str, str] = {}  # int value → the tensor holding its bytes
        self.inputs: list[Binding] = []
        self.outputs: list[Binding] = []
        self.views: dict[str, View] = {}  # value → its part of its buffer (when not all of it)
        self.constants: dict[str, bytes] = {}  # constant operand tensor → its bytes (the image's)
        # An int16 tensor → the bytes from its high plane to its low one (`numerics.split_wide`):
        # a View of it places the high plane's elements, the low plane's are that far on.
        self.planes: dict[str, int] = {}
        # A value only MatMuls of two activations read, in no View's order (a Transpose of the
        # last two axes: Kᵀ): its offset and a stride per logical axis in its buffer.
        self.strided: dict[str, tuple[int, tuple[int, ...]]] = {}
        self.into = plan_concats(graph)  # Concat inputs their producers write in place

    # -- values --

    def shape(self, name: str) -> tuple[int, ...]:
        return self.g.type_of(name).shape

    def quant(self, name: str):
        params = self.g.type_of(name).quant
        if params is None or params.axis is not None:
            raise CompileError(f"value {name!r}: expected a per-tensor quantized int8 tensor")
        return params

    def new_tensor(self, name: str, layout: Layout) -> str:
        """A tensor of its own for value `name`: int8 codes, or an int16 value's two planes of
        them, the high one first (`numerics.split_wide`)."""
        dtype = self.g.type_of(name).dtype
        if dtype not in ("int8", "int16"):
            raise CompileError(f"value {name!r} is {dtype}: the accelerator's local memories "
                               f"hold 8-bit activations only (quantize with int8 or uint8 activations)")
        return self.scratch(name, int(np.prod(self.shape(name), dtype=np.int64)), layout,
                            dtype == "int16", owner=name)

    def scratch(self, tensor: str, elements: int, layout: Layout, wide: bool,
                owner: str | None = None) -> str:
        """A tensor of `elements` codes in `layout`: one byte each, or with `wide` two planes
        of them, the high one first (`planes`); `owner`, the value it holds."""
        self.tensors[tensor] = Tensor(tensor, (2 if wide else 1) * elements)
        self.layouts[tensor] = layout
        if wide:
            self.planes[tensor] = elements
        if owner is not None:
            self.buffer[owner] = tensor
        return tensor

    def source(self, node: Node, name: str) -> str:
        if name not in self.buffer:
            value = self.g.values[name]
            what = "a constant" if value.is_const else "computed on the host (fp32)"
            raise unsupported(node, f"its input {name!r} is {what}, not an int8 activation")
        if self.g.type_of(name).dtype == "int16" and "table_of" not in node.attrs and \
                OPS[node.op].lower not in WIDE_READERS:
            raise unsupported(node, f"its input {name!r} is int16; only an Add, a Sub, a Mul, a "
                                    f"LayerNormalization, a Softmax, a Hypot, a Conv, "
                                    f"ConvTranspose, Gemm or MatMul by a constant weight, a "
                                    f"table op, a pool, a view, Concat, Transpose, Resize or "
                                    f"Pad, and a model output read int16 values")
        return self.buffer[name]

    def wide_input(self, node: Node, name: str) -> int:
        """The bytes from an int16 input's high plane to its low one (0: int8), in the buffer
        that holds it (a View of it, or the whole of it under another shape): the array
        streams both planes (COMPUTE shift, `numerics.split_wide`)."""
        if self.g.type_of(name).dtype != "int16":
            return 0
        return self.planes[self.source(node, name)]

    def need_channels_last(self, node: Node, name: str) -> None:
        shape = self.shape(name)
        if len(shape) != 4:
            raise unsupported(node, f"input {name!r} has rank {len(shape)}; expected "
                                    f"N x C x H x W")
        if name not in self.views:
            self.in_order(node, name)

    def in_order(self, node: Node, name: str) -> None:
        """Make value `name` (a whole buffer) sit in its own order, channels-last for a map:
        when its bytes are another order of its elements (a channels-last map read through a
        Reshape as [N, C, L], a row-major [N, C, L] read as [N, C, 1, L]), a copy element by
        element becomes the buffer this and later readers use."""
        shape = self.shape(name)
        layout = self.layouts[self.source(node, name)]
        target = Layout.channels_last(shape)
        if layout.same_bytes(target):
            return
        # Walk the finest axes both the buffer's and the value's split into (the value is a
        # reshape of the buffer's, in the same logical order): each must step its source and
        # target positions evenly for one strided copy to do it.
        dims = common_axes(tuple(layout.dims), shape)
        source = None if dims is None else \
            reshaped_strides(layout.dims, layout.strides(layout.dims), dims)
        steps = None
        if source is not None and len(dims) <= 4:
            size = int(np.prod(dims, dtype=np.int64))
            position = np.empty(size, np.int64)
            position[target.order()] = np.arange(size)
            position = position.reshape(dims)
            steps = []
            for axis, extent in enumerate(dims):
                step = np.diff(position, axis=axis)
                if extent > 1 and not np.all(step == step.flat[0]):
                    steps = None
                    break
                steps.append(int(step.flat[0]) if extent > 1 else 0)
        if steps is None or len(shape) > 4:
            raise unsupported(node, f"input {name!r} is a view whose bytes are not in "
                                    f"channels-last order (a layout copy is not implemented)")
        copy = f"{node.name}/{name}/in_order"
        self.scratch(copy, int(np.prod(shape, dtype=np.int64)), target,
                     self.buffer[name] in self.planes)
        self.copy_elements(node, self.buffer[name], 0, source, dims, copy, tuple(steps))
        self.buffer[name] = copy

    def constant(self, node: Node, name: str, out_shape: tuple[int, ...],
                 over_channels: bool) -> tuple[str, View]:
        """A tensor holding the int8 codes of constant `name`, an operand of `node` broadcast
        (numpy's rules) to `out_shape`, and the View that reads it as a block of that shape:
        stride 0 along the pixel axes where the constant has one value, image 0 for every image
        (`View.at` of a block with one image); over the channels too when `over_channels` (a
        lane reads one channel, so the codes are repeated there), else one channel (a MUL's
        b_splat). Its bytes go to the DRAM image: an int16 constant's (an int16 Add's bias,
        `quantizer.wide`) as two planes, the high one first (`planes`)."""
        value = self.g.values[name]
        dtype = value.type.dtype
        if dtype not in ("int8", "int16") or len(value.type.shape) > len(out_shape):
            raise unsupported(node, f"its constant input {name!r} ({dtype}, shape "
                                    f"{list(value.type.shape)}) is no int8 operand of its "
                                    f"output's shape {list(out_shape)}")
        codes = np.asarray(value.const, dtype).reshape(
            (1,) * (len(out_shape) - value.const.ndim) + value.const.shape)
        block = codes.transpose(0, 2, 3, 1) if codes.ndim == 4 else \
            codes.reshape(block_shape(codes.shape))
        out = block_shape(out_shape)
        if over_channels:
            block = np.broadcast_to(block, block.shape[:3] + out[3:])
        stored = block.shape
        tensor = f"{node.name}/{name}"
        planes = numerics.split_wide(block) if dtype == "int16" else (block,)
        self.scratch(tensor, block.size, Layout.row_major(stored), dtype == "int16")
        self.constants[tensor] = b"".join(np.ascontiguousarray(p).tobytes() for p in planes)
        dense = View.dense(stored).strides
        view = View((stored[0], *out[1:3], stored[3]), 0,
                    (dense[0], *(s if k > 1 else 0 for s, k in zip(dense[1:], stored[1:3]))))
        return tensor, view

    # -- views: slices of a buffer, and the parts of a Concat's buffer --

    def view_of(self, name: str) -> View | None:
        """Where value `name` sits in its buffer, or None when its bytes are in an order no
        View describes (a flattened channels-last map, a rank above 4)."""
        if name in self.views:
            return self.views[name]
        shape = self.shape(name)
        if len(shape) > 4 or not self.layouts[self.buffer[name]].same_bytes(
                Layout.channels_last(shape)):
            return None
        return View.dense(block_shape(shape))

    def need_view(self, node: Node, name: str) -> View:
        self.source(node, name)
        view = self.view_of(name)
        if view is None and name not in self.views:
            self.in_order(node, name)
            view = self.view_of(name)
        if view is None:
            raise unsupported(node, f"input {name!r} is a view whose bytes are in no strided "
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

    def output(self, name: str, layout: Layout, in_place: bool = True,
               planes_in_place: bool = False) -> tuple[str, View | None]:
        """Where a layer writes value `name`: a new tensor of `layout`, or (copy elimination)
        its part of the Concat that reads it, when its order is the one Views describe. An
        int16 value goes in place only for a layer that writes each plane through its View
        (`planes_in_place`: the low plane `planes[buffer]` bytes on, the Concat's)."""
        if self.g.type_of(name).dtype == "int16" and not planes_in_place:
            in_place = False
        if in_place and name in self.into and \
                layout.same_bytes(Layout.channels_last(self.shape(name))):
            buffer, view = self.place(name)
            self.alias(name, buffer, view)
            return buffer, self.views.get(name)
        return self.new_tensor(name, layout), None

    def copy(self, node: Node, x: str, buffer: str, view: View) -> None:
        """An identity LUT layer of `node`: value x (any view) → `view` of `buffer`."""
        src = self.need_view(node, x)
        self.copy_view(node, self.source(node, x), src, buffer, view)

    def copy_view(self, node: Node, tensor: str, src: View, buffer: str, dst: View) -> None:
        """An identity LUT layer of `node`: View `src` of `tensor` → View `dst` of `buffer`
        (the one copy that Concat, Transpose, Resize and Pad layers are made of). An int16
        value is copied plane by plane: a second layer for the low planes (`planes`), so it
        costs what two int8 copies cost; a byte is a byte to the identity table."""
        if (tensor in self.planes) != (buffer in self.planes):
            raise unsupported(node, f"it copies {'int16' if tensor in self.planes else 'int8'} "
                                    f"codes of {tensor!r} into "
                                    f"{'int16' if buffer in self.planes else 'int8'} "
                                    f"{buffer!r}")
        self.layers.append(LutLayer(node.name, tensor, buffer, src.size, INT8_CODES, (src, dst)))
        if tensor in self.planes:
            self.layers.append(LutLayer(
                node.name, tensor, buffer, src.size, INT8_CODES,
                (dataclasses.replace(src, offset=src.offset + self.planes[tensor]),
                 dataclasses.replace(dst, offset=dst.offset + self.planes[buffer]))))

    def copy_elements(self, node: Node, tensor: str, offset: int, strides: tuple[int, ...],
                      shape: tuple[int, ...], buffer: str,
                      dst_strides: tuple[int, ...]) -> None:
        """Identity copies of `node`, element by element, of the value of `shape` whose element
        (i, j, ...) sits at offset + i * strides[0] + ... of `tensor` to dst_strides of `buffer`:
        the axes of more than one element (at most three) as the block's N, H and W, each element
        a channel block of one (the DMA gathers bytes at any stride); a fourth such axis, one
        copy per index along it."""
        axes = [a for a in range(len(shape)) if shape[a] > 1]
        outer = axes[:-3]
        axes = axes[-3:]
        sub = tuple([1] * (3 - len(axes)) + [shape[a] for a in axes] + [1])
        for i in range(shape[outer[0]] if outer else 1):
            src_at = offset + (i * strides[outer[0]] if outer else 0)
            dst_at = i * dst_strides[outer[0]] if outer else 0
            pad = [0] * (3 - len(axes))
            self.copy_view(node, tensor, View(sub, src_at, tuple(pad + [strides[a] for a in axes])),
                           buffer, View(sub, dst_at, tuple(pad + [dst_strides[a] for a in axes])))

    def own_copy(self, node: Node, x: str) -> str:
        """A tensor of its own holding view x densely (for a consumer that cannot read it in
        place), made by an identity LUT of `node`."""
        tensor = f"{node.name}/{x}"
        self.scratch(tensor, self.views[x].size, Layout.channels_last(self.shape(x)),
                     self.buffer[x] in self.planes)
        self.copy(node, x, tensor, View.dense(block_shape(self.shape(x))))
        return tensor

    # -- the walk --

    def run(self) -> Lowered:
        host = HostSegments(self)
        if not self.allow_host:
            self._refuse_host_only(host.users)
        for node in self.g.nodes:
            kind = OPS[node.op].lower
            rule = self.rules.get(kind)
            why = host_only(self.g, node, host.users)
            if why is not None or (rule is None and self.allow_host) or (
                    kind is Lower.VIEW and host.produces(node.inputs[0])):
                host.add(node)  # a view of a value the open segment computes stays with it
                continue
            if rule is None:
                raise unsupported(node, "no lowering for this operator")
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
            raise CompileError(f"graph output(s) {listing(missing, quote=True)} are neither "
                               f"DequantizeLinear of an "
                               f"int8 tensor nor computed on the host (--allow-host): the "
                               f"program cannot return them")
        views = {v: b for v, b in self.buffer.items() if v != b}
        return Lowered(self.g.name, tuple(self.layers), self.tensors, tuple(self.inputs),
                       tuple(self.outputs), views, self.constants)

    def _refuse_host_only(self, users: dict[str, list[Node]]) -> None:
        """Without allow_host, fail on the first node only the host can run, naming a node the
        user kept in fp32 before the QuantizeLinear/DequantizeLinear the quantizer wrapped it
        in (which come first in the graph, but which the user never wrote)."""
        found = [(node, why) for node in self.g.nodes
                 if (why := host_only(self.g, node, users)) is not None]
        if not found:
            return
        node, why = min(found, key=lambda pair: OPS[pair[0].op].lower in BINDINGS)
        instead = "" if OPS[node.op].lower in BINDINGS else f", or without --keep-fp32 {node.name}"
        raise CompileError(f"node {node.name!r} ({node.op}) cannot run on the accelerator: "
                           f"{why}; compile with --allow-host to run it on the host{instead}")

    def _state(self, host: HostSegments):
        """A snapshot of every table of the walk (shallow copies: their entries are frozen)."""
        tables = {k: copy.copy(v) for k, v in vars(self).items()
                  if isinstance(v, (dict, list, set))}
        return tables, host.state()

    def _restore(self, host: HostSegments, state) -> None:
        tables, open_segment = state
        vars(self).update(tables)
        host.restore(open_segment)


def requant_params(node: Node, channels: int, wide: bool = False):
    """(multipliers, shifts, zero point, clamp) of a requantizing node's int8 output; with
    `wide`, of an int16 one (REQUANT wide=1, whose 8-bit clamp fields bound the high byte,
    `numerics.wide_clamp`: the node's int16 clamp must be of that form)."""
    a = int8_attrs(node)
    if wide and a.get("out_dtype") == "int16":
        lo, hi = (int(q) for q in (a.get("qclamp") or RANGES["int16"]))
        fields = (lo >> 8, hi >> 8)
        if wide_clamp(*fields) != (lo, hi):
            raise unsupported(node, f"its int16 clamp [{lo}, {hi}] is not [qmin * 256, "
                                    f"qmax * 256 + 255] (a wide REQUANT clamps the high byte)")
        a = {**a, "qclamp": fields}
    elif a.get("out_dtype", "int8") != "int8":
        raise unsupported(node, f"output type {a['out_dtype']} (the scratchpad holds int8)")
    multiplier = np.broadcast_to(np.asarray(a["multiplier"], np.int64), (channels,)).copy() \
        if len(a["multiplier"]) == 1 else np.asarray(a["multiplier"], np.int64)
    shift = np.broadcast_to(np.asarray(a["shift"], np.int64), (channels,)).copy() \
        if len(a["shift"]) == 1 else np.asarray(a["shift"], np.int64)
    qclamp = tuple(int(q) for q in (a.get("qclamp") or (-128, 127)))
    return multiplier, shift, int(a.get("out_zero_point", 0)), qclamp


# The lowerings that read int16 values (`quantizer.wide`): the array's by constant weights
# (both planes streamed), the vector unit's ADD (an Add or Sub: a residual stream, an LSTM
# step's gates, a map by a scalar constant), MUL of two activations (a_wide, b_wide),
# LAYERNORM, table LUTs and pools (MAXPOOL wide, AVGPOOL in_wide), copies plane by plane
# (Concat, Transpose, a nearest Resize, an edge, reflect or wrap Pad), views, and the output
# bindings.
WIDE_READERS = frozenset({
    Lower.LAYER_NORM, Lower.ADD, Lower.SUB, Lower.MUL, Lower.VIEW, Lower.HYPOT, Lower.CONV,
    Lower.CONV_TRANSPOSE, Lower.GEMM, Lower.MATMUL, Lower.DEQUANTIZE, Lower.LUT,
    Lower.CHANNEL_LUT, Lower.SLICE, Lower.SPLIT, Lower.CONCAT, Lower.TRANSPOSE, Lower.RESIZE,
    Lower.MAX_POOL, Lower.GLOBAL_MAX_POOL, Lower.AVERAGE_POOL, Lower.GLOBAL_AVERAGE_POOL,
    Lower.SOFTMAX, Lower.PAD})

# Rules whose output is not a fresh tensor a layer writes: views of their input, and the model's
# inputs (written by the host, at their bindings).
NOT_IN_PLACE = frozenset({Lower.VIEW, Lower.SLICE, Lower.SPLIT, *BINDINGS})


def plan_concats(graph: Graph) -> dict[str, tuple[str, int, int]]:
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
        # Only a Concat that will lower: quantized, of activations (else the host may run it,
        # and its producers must write tensors of their own).
        if not 1 <= rank <= 4 or graph.type_of(y).quant is None or \
                any(graph.values[x].is_const for x in node.inputs):
            continue
        axis = int(node.attrs["axis"]) % rank
        start = 0
        for x in node.inputs:
            producer = producers.get(x)
            if (producer is not None and OPS[producer.op].lower not in NOT_IN_PLACE
                    and len(producer.outputs) == 1 and len(users.get(x, ())) == 1
                    and x not in graph.outputs):
                into[x] = (y, axis, start)
            start += graph.type_of(x).shape[axis]
    return into
