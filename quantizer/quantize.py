"""The quantizer: an fp32 Graph and its profile → an int8 Graph whose types carry the scales.

As in Glow, the quantized type is part of the type: every integer activation has a `Type` with
`QuantParams`, weights are int8 (per output channel by default), biases int32 at scale
s_x * s_w with zero point 0. Quantized activations keep their ONNX names, so per-layer reports
find their fp32 counterparts by name; values the quantizer creates are named after the value
they derive from (`x/q`, `x/fp32`, `x/to_<node>`) and `Graph.origin` maps every activation to
its ONNX name. The model's inputs and outputs keep their names and stay float:
QuantizeLinear/DequantizeLinear sit at the boundary (so the integer copies of graph inputs and
outputs are `name/q`), and around the nodes kept in fp32.

Each operator's rule kind (the operator table's `quant` column) says how it is quantized; the
integer parameters each kernel needs are computed here once and stored on the node.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.int8 import (SOFTMAX_OUT_SCALE, Quant, lookup_table, pool_counts,
                                 reduce_axes, softmax_table)
from compiler.graph.ir import Graph, Node, QuantParams, Type, Value
from compiler.graph.ops import OPS
from profiler.format import Profile
from quantizer import calibrate
from quantizer.checks import check_quantizable
from quantizer.cleanup import cleanup
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from quantizer.requant import ratio, ratios
from quantizer.verify import verify_int8
from simulator import numerics
from simulator.numerics import ADD_LEFT_SHIFT, RANGES

WEIGHT_QMAX = 127  # weights are symmetric int8 in [-127, 127], so negation never overflows
_LINEAR = ("Conv", "Gemm", "MatMul")
_FUSABLE = frozenset(name for name, op in OPS.items()
                     if op.quant is Quant.REQUANT_OUTPUT and name != "Rescale")


def quantize(graph: Graph, profile: Profile, options: QuantOptions = QuantOptions()) -> Graph:
    """The int8 graph of `graph` (run `compiler.pipeline.optimize` first: BN must be folded)."""
    check_quantizable(graph, options)
    rewriter = _Rewriter(graph, profile, options)
    rewriter.check_profile()
    qgraph = cleanup(rewriter.run())
    verify_int8(qgraph)
    return qgraph


# --- the rewrite ----------------------------------------------------------------------------


class _Rewriter:
    """Walks the fp32 graph once in order, emitting the int8 graph's nodes and values."""

    def __init__(self, graph: Graph, profile: Profile, options: QuantOptions):
        self.g, self.profile, self.opts = graph, profile, options
        self.dtype = options.activation_dtype
        self.keep = set(options.keep_fp32)
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.origin: dict[str, str] = {}
        self.quantized: dict[str, str] = {}  # fp32 activation → the name of its integer value
        self.floating: dict[str, str] = {}   # fp32 activation → the name of its float value
        self.ranges: dict[str, QuantParams] = {}
        self.weights: dict[tuple[str, int | None], str] = {}
        producers = graph.producers()
        self.float_primary = set(graph.inputs) | set(graph.outputs) | {
            out for node in graph.nodes if node.name in self.keep for out in node.outputs}
        self.fp32_consts = {name for node in graph.nodes if node.name in self.keep
                            for name in node.inputs if name and graph.values[name].is_const}
        self.fused = self._plan_fusion(producers)
        self.absorbed = {clamp.name for clamp in self.fused.values()}

    # -- planning --

    def _plan_fusion(self, producers: dict[str, Node]) -> dict[str, Node]:
        """Producer node name → the Relu/Clip folded into its requantization (its only reader)."""
        users = self.g.users()
        fused = {}
        for node in self.g.nodes:
            if node.op not in ("Relu", "Clip") or node.name in self.keep:
                continue
            source = node.inputs[0]
            producer = producers.get(source)
            if (producer is None or producer.name in self.keep or producer.op not in _FUSABLE
                    or producer.name in fused or source in self.g.outputs
                    or len(users.get(source, [])) != 1):
                continue
            fused[producer.name] = node
        return fused

    def _profiled(self) -> list[str]:
        """The activations whose ranges come from the profile, in graph order."""
        needed: list[str] = []
        for node in self.g.nodes:
            if node.name in self.keep or node.name in self.absorbed:
                continue
            for name in node.inputs:
                if name and not self.g.values[name].is_const and name in self.float_primary:
                    needed.append(name)
            kind = OPS[node.op].quant
            if kind in (Quant.REQUANT_OUTPUT, Quant.LOOKUP, Quant.RESCALE_INPUTS):
                needed.append(self._final_output(node))
        return list(dict.fromkeys(needed))

    def check_profile(self) -> None:
        missing = [n for n in self._profiled() if self._onnx(n) not in self.profile.tensors]
        if missing:
            where = f" ({self.profile.path})" if self.profile.path else ""
            raise QuantizeError(f"the profile{where} lacks tensor(s) {missing} that quantizing "
                                f"graph {self.g.name!r} needs; profile this model again")

    # -- naming and values --

    def _onnx(self, name: str) -> str:
        return self.g.origin.get(name, name)

    def _int_name(self, name: str) -> str:
        return f"{name}/q" if name in self.float_primary else name

    def _float_name(self, name: str) -> str:
        return name if name in self.float_primary else f"{name}/fp32"

    def _final_output(self, node: Node) -> str:
        clamp = self.fused.get(node.name)
        return clamp.outputs[0] if clamp is not None else node.outputs[0]

    def _add_value(self, name: str, type_: Type, const: np.ndarray | None = None,
                   origin: str | None = None) -> str:
        if name in self.values:
            raise QuantizeError(f"internal: value {name!r} defined twice while quantizing")
        self.values[name] = Value(name, type_, const)
        if origin is not None:
            self.origin[name] = origin
        return name

    def _const(self, name: str, array: np.ndarray, quant: QuantParams | None = None,
               origin: str | None = None) -> str:
        array = np.asarray(array)
        if name in self.values:
            return name
        return self._add_value(name, Type(str(array.dtype), array.shape, quant), array, origin)

    def _copy_const(self, name: str) -> str:
        if name and name not in self.values:
            self.values[name] = self.g.values[name]
        return name

    def _emit(self, op: str, name: str, inputs, outputs, attrs) -> None:
        self.nodes.append(Node(op, name, tuple(inputs), tuple(outputs), dict(attrs)))

    def _activation(self, name: str, params: QuantParams) -> str:
        """Declare the integer value of fp32 activation `name` with `params`."""
        shape = self.g.type_of(name).shape
        qname = self._add_value(self._int_name(name), Type(self.dtype, shape, params),
                                origin=self._onnx(name))
        self.quantized[name] = qname
        return qname

    def params(self, name: str) -> QuantParams:
        """The calibrated per-tensor parameters of fp32 activation `name`."""
        if name not in self.ranges:
            onnx_name = self._onnx(name)
            lo, hi = calibrate.tensor_range(self.profile.tensors[onnx_name],
                                            self.opts.calibration, self.opts.percentile,
                                            onnx_name)
            self.ranges[name] = calibrate.activation_params(
                lo, hi, self.dtype, self.opts.symmetric_activations,
                self.opts.schema == "power2")
        return self.ranges[name]

    def quant_input(self, name: str) -> str:
        """The integer value of activation `name`, quantizing its float value on first use."""
        if name in self.quantized:
            return self.quantized[name]
        params = self.params(name)
        source = self.floating[name]
        scale = self._const(f"{name}/q/scale", np.float32(params.scale[0]))
        zero = self._const(f"{name}/q/zero_point", np.asarray(params.zero_point[0], self.dtype))
        qname = self._activation(name, params)
        self._emit("QuantizeLinear", f"{name}/QuantizeLinear", (source, scale, zero), (qname,),
                   {})
        return qname

    def float_input(self, name: str) -> str:
        """The float value of activation `name`, dequantizing its integer value on first use."""
        if name in self.floating:
            return self.floating[name]
        qname = self.quantized[name]
        params = self.values[qname].type.quant
        scale = self._const(f"{qname}/scale", np.float32(params.scale[0]))
        zero = self._const(f"{qname}/zero_point", np.asarray(params.zero_point[0], self.dtype))
        fname = self._add_value(self._float_name(name),
                                Type("float32", self.g.type_of(name).shape),
                                origin=self._onnx(name))
        self._emit("DequantizeLinear", f"{name}/DequantizeLinear", (qname, scale, zero),
                   (fname,), {})
        self.floating[name] = fname
        return fname

    def quant_const(self, name: str, params: QuantParams | None = None) -> str:
        """A float constant used as an activation operand, quantized per tensor (by default
        over its own min and max)."""
        array = self.g.values[name].const
        if params is None:
            params = calibrate.activation_params(float(array.min(initial=0.0)),
                                                 float(array.max(initial=0.0)), self.dtype,
                                                 self.opts.symmetric_activations,
                                                 self.opts.schema == "power2")
        qname, k = f"{name}/q", 1
        while qname in self.values and self.values[qname].type.quant != params:
            qname, k = f"{name}/q{k}", k + 1
        return self._const(qname, _quantize_array(array, params, self.dtype), params, name)

    def operand(self, name: str) -> str:
        return self.quant_const(name) if self.g.values[name].is_const else self.quant_input(name)

    def quant_weight(self, name: str, axis: int | None) -> str:
        """A constant weight as symmetric int8, per slice along `axis` (None: per tensor)."""
        key = (name, axis)
        if key in self.weights:
            return self.weights[key]
        w = self.g.values[name].const.astype(np.float64)
        scales = calibrate.weight_scales(w, axis, self.opts.schema == "power2")
        params = QuantParams(scales, (0,) * len(scales), axis)
        q = numerics.quantize(w, scales, 0, -WEIGHT_QMAX, WEIGHT_QMAX, axis=axis,
                              arithmetic=np.float64)
        # The int8 weight keeps the initializer's name unless an fp32 node still reads the float
        # weight, or the same weight is quantized along another axis for another node.
        shared = name in self.fp32_consts or any(k[0] == name for k in self.weights)
        qname = f"{name}/q{'' if axis is None else axis}" if shared else name
        self.weights[key] = self._const(qname, q, params, name)
        return qname

    def int32_bias(self, name: str, q: np.ndarray, scales: np.ndarray, where: str) -> str:
        """Integer bias codes as int32 (scale s_x * s_w per channel along the last axis, zero
        point 0); fails, naming it, when a code does not fit."""
        q = np.asarray(q, np.float64)
        lo, hi = RANGES["int32"]
        if np.any(q < lo) or np.any(q > hi):
            raise QuantizeError(f"{where}: bias {name!r} does not fit int32 at scale s_x * s_w; "
                                "the input or weight range is degenerate")
        flat = tuple(float(s) for s in np.asarray(scales).reshape(-1))
        params = (QuantParams(flat, (0,) * len(flat), max(q.ndim - 1, 0)) if len(flat) > 1
                  else QuantParams.per_tensor(flat[0]))
        return self._const(name, q.astype(np.int32), params)

    # -- outputs of requantizing nodes --

    def requant_output(self, node: Node) -> tuple[str, QuantParams, tuple[int, int]]:
        """Declare the node's (possibly clamp-fused) output: name, params and qclamp."""
        final = self._final_output(node)
        params = self.params(final)
        clamp = self.fused.get(node.name)
        qclamp = self._qclamp(clamp, params) if clamp is not None else RANGES[self.dtype]
        name = self._activation(final, params)
        return name, params, qclamp

    def _qclamp(self, clamp: Node, params: QuantParams) -> tuple[int, int]:
        """A Relu's or Clip's real bounds as integer codes in `params`."""
        qmin, qmax = RANGES[self.dtype]
        if clamp.op == "Relu":
            lo, hi = 0.0, None
        else:
            bounds = [self.g.values[n].const if n else None for n in clamp.inputs[1:3]]
            bounds += [None] * (2 - len(bounds))
            lo, hi = (None if b is None else float(b) for b in bounds)
        # The nearest code to each bound: a clamp then errs by at most half a step.
        q_lo = qmin if lo is None else int(_quantize_array(lo, params, self.dtype))
        q_hi = qmax if hi is None else int(_quantize_array(hi, params, self.dtype))
        return q_lo, max(q_lo, q_hi)

    def _requant_attrs(self, out: QuantParams, qclamp, multipliers, shifts) -> dict:
        return {"multiplier": tuple(int(m) for m in multipliers),
                "shift": tuple(int(s) for s in shifts), "out_zero_point": out.zero_point[0],
                "qclamp": tuple(int(q) for q in qclamp), "out_dtype": self.dtype}

    # -- the walk --

    def run(self) -> Graph:
        for name in self.g.inputs:
            self.values[name] = self.g.values[name]
            self.floating[name] = name
        for node in self.g.nodes:
            if node.name in self.absorbed:
                continue
            if node.name in self.keep:
                self.keep_float(node)
                continue
            kind = OPS[node.op].quant
            if kind is Quant.KEEP_PARAMS:
                self.keep_params(node)
            elif kind is Quant.CLAMP:
                self.clamp(node)
            elif kind is Quant.RESCALE_INPUTS:
                self.concat(node)
            elif kind is Quant.LOOKUP:
                self.lookup(node)
            elif kind is Quant.FIXED_OUTPUT:
                self.softmax(node)
            elif node.op in _LINEAR:
                self.linear(node)
            elif node.op in ("Add", "Sub"):
                self.add(node)
            elif node.op == "Mul":
                self.mul(node)
            else:
                self.average(node)
        for name in self.g.outputs:
            self.float_input(name)
        return Graph(self.g.name, self.g.inputs, self.g.outputs, tuple(self.nodes),
                     dict(self.values), self.g.opset, dict(self.origin))

    def keep_float(self, node: Node) -> None:
        inputs = [self._copy_const(n) if (not n or self.g.values[n].is_const)
                  else self.float_input(n) for n in node.inputs]
        for out in node.outputs:
            self._add_value(out, self.g.type_of(out), origin=self._onnx(out))
            self.floating[out] = out
        self._emit(node.op, node.name, inputs, node.outputs, node.attrs)

    def keep_params(self, node: Node) -> None:
        x = self.quant_input(node.inputs[0])
        params = self.values[x].type.quant
        inputs = [x] + [self._copy_const(n) for n in node.inputs[1:]]
        if node.op == "Pad" and node.attrs.get("mode", "constant") == "constant":
            value = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
            real = 0.0 if value is None else float(np.asarray(self.g.values[value].const).item())
            code = _quantize_array(np.float32(real), params, self.dtype)
            inputs += [""] * (3 - len(inputs))
            inputs[2] = self._const(f"{node.name}/constant_value", code)
        outputs = [self._activation(out, params) for out in node.outputs]
        self._emit(node.op, node.name, inputs, outputs, node.attrs)

    def clamp(self, node: Node) -> None:
        x = self.quant_input(node.inputs[0])
        params = self.values[x].type.quant
        qclamp = self._qclamp(node, params)
        out = self._activation(node.outputs[0], params)
        self._emit(node.op, node.name, (x,), (out,), {"qclamp": qclamp})

    def concat(self, node: Node) -> None:
        out_params = self.params(node.outputs[0])
        inputs = []
        for name in node.inputs:
            if self.g.values[name].is_const:
                inputs.append(self.quant_const(name, out_params))
                continue
            x = self.quant_input(name)
            inputs.append(x if self.values[x].type.quant == out_params
                          else self.rescale(name, x, out_params, node.name))
        out = self._activation(node.outputs[0], out_params)
        self._emit(node.op, node.name, inputs, (out,), node.attrs)

    def rescale(self, name: str, x: str, params: QuantParams, reader: str) -> str:
        """A Rescale of integer value x (of activation `name`) to `params`, for node `reader`."""
        source = self.values[x].type.quant
        where = f"node {reader!r}: rescale of {name!r}"
        m, s = ratio(source.scale[0] / params.scale[0], where)
        out = self._add_value(f"{name}/to_{reader}",
                              Type(self.dtype, self.values[x].type.shape, params),
                              origin=self._onnx(name))
        self._emit("Rescale", f"{reader}/rescale_{name}", (x,), (out,),
                   {"x_zero_point": source.zero_point[0],
                    **self._requant_attrs(params, RANGES[self.dtype], (m,), (s,))})
        return out

    def lookup(self, node: Node) -> None:
        x = self.quant_input(node.inputs[0])
        source = self.values[x].type.quant
        out_params = self.params(node.outputs[0])
        op = OPS[node.op]
        table = lookup_table(op.fp32, op.bind(node.name, node.attrs), source.scale[0],
                             source.zero_point[0], out_params.scale[0],
                             out_params.zero_point[0], self.dtype)
        table_name = self._const(f"{node.name}/table", table)
        out = self._activation(node.outputs[0], out_params)
        self._emit(node.op, node.name, (x, table_name), (out,), node.attrs)

    def softmax(self, node: Node) -> None:
        x = self.quant_input(node.inputs[0])
        source = self.values[x].type.quant
        zero = RANGES[self.dtype][0]  # probability 0 is the lowest code
        out_params = QuantParams.per_tensor(SOFTMAX_OUT_SCALE, zero)
        table_name = self._const(f"{node.name}/table", softmax_table(source.scale[0]))
        out = self._activation(node.outputs[0], out_params)
        self._emit(node.op, node.name, (x, table_name), (out,),
                   {**node.attrs, "out_zero_point": zero})

    def linear(self, node: Node) -> None:
        """Conv, Gemm, MatMul: int8 operands, int32 bias at s_x * s_w, per-channel requant.

        The constant operand is the weight, symmetric int8, per output channel (Conv: axis 0
        of W; Gemm: the N axis of B; MatMul: the last axis of B) unless per_channel is off.
        An activation operand's zero point is folded into the bias (bias - z * sum(w)) when
        the other operand is constant; two activation operands keep both zero points.
        """
        where = f"node {node.name!r} ({node.op})"
        attrs = OPS[node.op].bind(node.name, node.attrs)
        a_name, b_name = node.inputs[0], node.inputs[1]
        a_const = self.g.values[a_name].is_const
        b_const = self.g.values[b_name].is_const
        w_axis = None
        if b_const and self.opts.per_channel:
            if node.op == "Conv":
                w_axis = 0
            elif node.op == "Gemm":
                w_axis = 0 if attrs["transB"] else 1
            elif self.g.type_of(b_name).rank >= 2:
                w_axis = self.g.type_of(b_name).rank - 1
        a = self.quant_weight(a_name, None) if a_const else self.quant_input(a_name)
        b = self.quant_weight(b_name, w_axis) if b_const else self.quant_input(b_name)
        pa, pb = self.values[a].type.quant, self.values[b].type.quant
        out, out_params, qclamp = self.requant_output(node)
        acc_scales = float(attrs.get("alpha", 1.0)) * pa.scale[0] * np.asarray(pb.scale)
        multipliers, shifts = ratios(acc_scales / out_params.scale[0], where)
        new_attrs = {**node.attrs, **self._requant_attrs(out_params, qclamp, multipliers, shifts)}
        if node.op == "Conv":
            new_attrs["x_zero_point"] = pa.zero_point[0]
        elif not (a_const or b_const):
            new_attrs["a_zero_point"] = pa.zero_point[0]
            new_attrs["b_zero_point"] = pb.zero_point[0]
        inputs = [a, b]
        bias = self._zero_point_fold(node, attrs, a, b, a_const, b_const)
        has_bias = node.op in ("Conv", "Gemm") and len(node.inputs) > 2 and bool(node.inputs[2])
        if has_bias:
            real = self.g.values[node.inputs[2]].const.astype(np.float64)
            q = np.rint(real * float(attrs.get("beta", 1.0)) / acc_scales)
            bias = q if bias is None else q + bias
        if bias is not None:
            name = self.int32_bias(f"{node.name}/bias", bias, acc_scales, where)
            self.origin[name] = node.inputs[2] if has_bias else node.name
            inputs.append(name)
        self._emit(node.op, node.name, inputs, (out,), new_attrs)

    def _zero_point_fold(self, node: Node, attrs, a: str, b: str, a_const: bool,
                         b_const: bool) -> np.ndarray | None:
        """-z * (sum of the weight over the reduced axis), per output element, or None."""
        qa, qb = self.values[a], self.values[b]
        if b_const:
            zero = qa.type.quant.zero_point[0]
            if zero == 0:
                return None
            w = qb.const.astype(np.int64)
            if node.op == "Conv":
                return -zero * w.reshape(w.shape[0], -1).sum(axis=1)
            if node.op == "Gemm":
                return -zero * w.sum(axis=1 if attrs["transB"] else 0)
            return -zero * np.expand_dims(w.sum(axis=-2), -2) if w.ndim > 1 else -zero * w.sum()
        if a_const:
            zero = qb.type.quant.zero_point[0]
            if zero == 0:
                return None
            w = qa.const.astype(np.int64)
            if node.op == "Gemm":
                return -zero * w.sum(axis=0 if attrs["transA"] else 1).reshape(-1, 1)
            return -zero * np.expand_dims(w.sum(axis=-1), -1)
        return None

    def add(self, node: Node) -> None:
        """Add/Sub: both inputs rescaled to 2^-20 of the larger input scale (TFLite's ADD)."""
        where = f"node {node.name!r} ({node.op})"
        a, b = (self.operand(n) for n in node.inputs[:2])
        pa, pb = self.values[a].type.quant, self.values[b].type.quant
        out, out_params, qclamp = self.requant_output(node)
        larger = max(pa.scale[0], pb.scale[0])
        reals = (pa.scale[0] / larger, pb.scale[0] / larger,
                 larger / (2**ADD_LEFT_SHIFT * out_params.scale[0]))
        multipliers, shifts = ratios(reals, where)
        attrs = {**node.attrs, "a_zero_point": pa.zero_point[0], "b_zero_point": pb.zero_point[0],
                 **self._requant_attrs(out_params, qclamp, multipliers, shifts)}
        self._emit(node.op, node.name, (a, b), (out,), attrs)

    def mul(self, node: Node) -> None:
        where = f"node {node.name!r} (Mul)"
        a, b = (self.operand(n) for n in node.inputs[:2])
        pa, pb = self.values[a].type.quant, self.values[b].type.quant
        out, out_params, qclamp = self.requant_output(node)
        m, s = ratio(pa.scale[0] * pb.scale[0] / out_params.scale[0], where)
        attrs = {**node.attrs, "a_zero_point": pa.zero_point[0], "b_zero_point": pb.zero_point[0],
                 **self._requant_attrs(out_params, qclamp, (m,), (s,))}
        self._emit(node.op, node.name, (a, b), (out,), attrs)

    def average(self, node: Node) -> None:
        """AveragePool, GlobalAveragePool, ReduceMean: int32 window sums, one requant per size."""
        where = f"node {node.name!r} ({node.op})"
        x = self.quant_input(node.inputs[0])
        px = self.values[x].type.quant
        shape = self.g.type_of(node.inputs[0]).shape
        attrs = OPS[node.op].bind(node.name, node.attrs)
        if node.op == "AveragePool":
            window = {k: attrs[k] for k in ("kernel_shape", "strides", "pads", "auto_pad",
                                            "ceil_mode", "dilations", "count_include_pad")}
            counts = sorted({int(c) for c in np.unique(pool_counts(shape[2:], **window))})
        elif node.op == "GlobalAveragePool":
            counts = [int(np.prod(shape[2:]))]
        else:
            axes_value = self.g.values[node.inputs[1]].const if len(node.inputs) > 1 and \
                node.inputs[1] else None
            axes = reduce_axes(len(shape), axes_value, attrs["noop_with_empty_axes"])
            counts = [int(np.prod([shape[a] for a in axes]))]
        out, out_params, qclamp = self.requant_output(node)
        multipliers, shifts = ratios([px.scale[0] / (c * out_params.scale[0]) for c in counts],
                                     where)
        new_attrs = {**node.attrs, "x_zero_point": px.zero_point[0], "counts": tuple(counts),
                     **self._requant_attrs(out_params, qclamp, multipliers, shifts)}
        inputs = [x] + [self._copy_const(n) for n in node.inputs[1:]]
        self._emit(node.op, node.name, inputs, (out,), new_attrs)


# --- helpers ---------------------------------------------------------------------------------


def _quantize_array(array, params: QuantParams, dtype: str) -> np.ndarray:
    """A constant or a clamp's bound in per-tensor `params`, computed in float64."""
    return numerics.quantize(array, params.scale[0], params.zero_point[0], dtype=dtype,
                             arithmetic=np.float64)

