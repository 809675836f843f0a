"""QDQ export: the int8 Graph as standard ONNX that onnxruntime runs and Netron shows.

Every integer node of the quantized graph becomes its fp32 ONNX operator between
DequantizeLinear nodes (on its integer inputs and int8/int32 constants) and a QuantizeLinear
(on each integer output): the "QDQ" form of onnxruntime's own `quantize_static`, which
onnxruntime fuses into integer kernels at its extended optimization level and Netron draws
as plain ONNX. The graph's integer values keep their names (they are now the QuantizeLinear
outputs, typed int8/uint8); the float values the export adds are named after them
(`v/float`: the fp32 result before quantizing, `v/dq`: its dequantized copy, `v/clamped`).

How each integer semantics is expressed so that onnxruntime reproduces it:
- the requantization (multiplier, shift, output zero point, saturation) is QuantizeLinear
  with the output's scale and zero point: both round the real ratio to the nearest code and
  saturate, so they differ only at ties (integer: half away from zero; QuantizeLinear: half
  to even) and by the multiplier's 2^-31, float32's rounding and (Add, Sub) the 2^-20 steps
  of TFLite's input rescaling: each node is within one code of the integer reference;
- a fused clamp (`qclamp`) that the output type's range already implies is nothing more (a
  ReLU fused into a producer whose output zero point is the lowest code); any other is a Relu
  (lower bound at real 0, no upper bound) or a Clip at the clamp codes' exact real values,
  between the operator and its QuantizeLinear. Clamping the real value at code q's real value
  and then rounding gives exactly clamp(round(.), q), since rounding is monotone;
- weights are int8 initializers with a DequantizeLinear (per channel along the type's axis),
  or int16 ones (`QuantOptions.int16_weights`: opset 21's DequantizeLinear reads int16, and
  onnxruntime runs it; such a node's metadata says `weight_precision` int16);
  biases are int32 initializers at scale s_x * s_w with a DequantizeLinear. The quantizer
  folds an activation's zero point into the bias (bias - z_x * sum(w)); DequantizeLinear
  subtracts it from x already, so the export unfolds it (`zero_point_fold` again). Gemm's
  beta is in the bias;
  alpha is kept;
- lookup-table operators (Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu), Softmax and
  LogSoftmax are their fp32 operators between DequantizeLinear and QuantizeLinear: the table is
  the fp32 reference at every input code, so they agree unless onnxruntime's float function and
  the reference round to different sides of a half step (Softmax and LogSoftmax: also the
  tables' fixed-point steps);
- Rescale (ember-internal) is a DequantizeLinear → QuantizeLinear pair;
- data movement and MaxPool keep the scale: DequantizeLinear → op → QuantizeLinear in the
  same parameters is exact; Pad's quantized constant becomes its real value again.
  A linear Resize keeps the scale too, but its int8 kernel rounds after each axis: within
  one code.

onnxruntime's fused kernels (extended level: QLinearConv, QGemm) agree as well, but on x86 CPUs
without VNNI its u8s8 kernels saturate int16 pair sums unless the session sets
"session.x64quantprecision" to "1": ember's weights use all of [-127, 127], not the 7-bit range
of onnxruntime's reduce_range.

Each node's `metadata_props` (shown by Netron) hold `precision` ("int8" or "uint8" for
integer nodes, "fp32" for nodes kept in float, "int32" for bias dequantizes), the
`scale` and `zero_point` of its quantized output, `sqnr_db` when given, the fused clamp
and the ember node it comes from.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from compiler.graph.int8 import INT8_ATTRS, Quant, zero_point_fold
from compiler.graph.ir import Graph, Node, QuantParams, Type
from compiler.graph.ops import (ADD, CAST, CHANNEL_MAP, CLIP, DEQUANTIZE_LINEAR, MUL, OPS,
                                QUANTIZE_LINEAR,
                                RECIPROCAL, RELU, SIGMOID, SQRT, SWISH, int8_attrs,
                                is_integer_node)
from profiler.format import output_mode
from quantizer.errors import QuantizeError
from simulator import numerics
from simulator.numerics import RANGES

# Opset 21: the newest forms the importer normalizes to (ReduceMean/Pad axes as inputs, Split's
# num_outputs, AveragePool's dilations) and per-channel QuantizeLinear/DequantizeLinear.
QDQ_OPSET = 21
# IR version 10 holds node metadata_props (and is the one opset 21 needs).
QDQ_IR_VERSION = 10

_ELEM = {"float32": TensorProto.FLOAT, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8,
         "int16": TensorProto.INT16, "int32": TensorProto.INT32, "int64": TensorProto.INT64,
         "bool": TensorProto.BOOL, "float64": TensorProto.DOUBLE,
         "float16": TensorProto.FLOAT16}


def export_qdq(qgraph: Graph, path: str | os.PathLike | None = None,
               sqnr_by_value: Mapping[str, float] | None = None, producer_name: str = "ember",
               node_metadata: Mapping[str, Mapping[str, Any]] | None = None
               ) -> onnx.ModelProto:
    """The QDQ ONNX model of quantized graph `qgraph`, written atomically to `path` if given.

    `sqnr_by_value` maps a value's name (the quantized graph's or its ONNX origin) to its
    measured SQNR in dB; `node_metadata` adds entries (cycles, say) to the metadata of the
    nodes that come from the named node of `qgraph`. The model passes
    `onnx.checker.check_model(full_check=True)`.
    """
    model = _Exporter(qgraph, sqnr_by_value or {}, node_metadata or {}).run(producer_name)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise QuantizeError(f"internal: the QDQ export of graph {qgraph.name!r} is not valid "
                            f"ONNX: {str(err).strip().splitlines()[0]}") from None
    if path is not None:
        _write_atomically(Path(path), model.SerializeToString())
    return model


def _write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written model. A
    folder that cannot be written (or made) is the user's error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise QuantizeError(f"{path}: cannot write: {err.strerror or err}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, output_mode())
        os.replace(tmp, path)
    except OSError as err:  # a full disk, a lost permission: name the output, not `tmp`
        Path(tmp).unlink(missing_ok=True)
        raise QuantizeError(f"{path}: cannot write: {err.strerror or err}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- the walk -------------------------------------------------------------------------------


class _Exporter:
    """Walks the quantized graph once, emitting ONNX nodes, initializers and value types."""

    def __init__(self, qgraph: Graph, sqnr: Mapping[str, float],
                 extra: Mapping[str, Mapping[str, Any]]):
        self.g, self.sqnr, self.extra = qgraph, sqnr, extra
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, TensorProto] = {}
        self.types: dict[str, Type] = {}          # every value the model holds, for value_info
        self.taken = set(qgraph.values) | {node.name for node in qgraph.nodes}
        self.dq: dict[str, str] = {}               # integer value → its dequantized float value
        self.emitted: set[str] = set()             # names of qgraph nodes already emitted
        # The quantized graph's own DequantizeLinear of an integer value, emitted early when
        # an integer node reads the value first, so its float output serves both.
        self.own_dq = {node.inputs[0]: node for node in qgraph.nodes
                       if _kind(node) is Quant.DEQUANTIZE and self._params_match(node)}

    def run(self, producer_name: str) -> onnx.ModelProto:
        for name in self.g.inputs:
            self.types[name] = self.g.type_of(name)
        for node in self.g.nodes:
            if node.name in self.emitted:
                continue
            if _kind(node) in (Quant.QUANTIZE, Quant.DEQUANTIZE):
                self._boundary(node)
            elif is_integer_node(self.g, node):
                self._integer(node)
            else:
                self._float(node)
        inputs = [self._info(name) for name in self.g.inputs]
        outputs = [self._info(name) for name in self.g.outputs]
        interface = set(self.g.inputs) | set(self.g.outputs) | set(self.inits)
        infos = [self._info(name) for name in self.types if name not in interface]
        graph = helper.make_graph(self.nodes, self.g.name, inputs, outputs,
                                  list(self.inits.values()), value_info=infos)
        model = helper.make_model(graph, producer_name=producer_name,
                                  opset_imports=[helper.make_opsetid("", max(QDQ_OPSET,
                                                                             self.g.opset))])
        model.ir_version = QDQ_IR_VERSION
        model.doc_string = (f"QDQ export of ember's int8 graph {self.g.name!r}: integer "
                            "values are QuantizeLinear outputs; node metadata hold scale, "
                            "zero_point, precision and SQNR")
        return model

    # -- names, constants, types --

    def _unique(self, name: str) -> str:
        base, k = name, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def _init(self, name: str, array: np.ndarray) -> str:
        """An initializer holding `array`, named `name` unless another array has that name."""
        array = np.asarray(array)
        existing = self.inits.get(name)
        if existing is not None:
            stored = numpy_helper.to_array(existing)
            if stored.dtype == array.dtype and np.array_equal(stored, array):
                return name
            name = self._unique(name)
        elif name in self.taken and not (name in self.g.values and self.g.values[name].is_const):
            name = self._unique(name)
        else:
            self.taken.add(name)
        self.inits[name] = numpy_helper.from_array(array, name)
        return name

    def _const(self, name: str) -> str:
        return self._init(name, self.g.values[name].const)

    def _params(self, base: str, params: QuantParams, dtype: str) -> tuple[str, str]:
        """Scale (float32) and zero-point (`dtype`) initializers of `params`."""
        if params.axis is None:
            scale = np.float32(params.scale[0])
            zero = np.asarray(params.zero_point[0], dtype)
        else:
            scale = np.asarray(params.scale, np.float32)
            zero = np.asarray(params.zero_point, dtype)
        return self._init(f"{base}/scale", scale), self._init(f"{base}/zero_point", zero)

    def _params_match(self, node: Node) -> bool:
        """Whether a quantized graph's DequantizeLinear uses its input type's own parameters."""
        params = self.g.type_of(node.inputs[0]).quant
        if params is None or params.axis is not None or len(node.inputs) < 3:
            return False
        scale, zero = (self.g.values[n].const for n in node.inputs[1:3])
        return (scale is not None and zero is not None
                and float(np.float32(params.scale[0])) == float(np.asarray(scale, np.float32))
                and int(params.zero_point[0]) == int(zero))

    def _info(self, name: str) -> onnx.ValueInfoProto:
        t = self.types[name]
        return helper.make_tensor_value_info(name, _ELEM[t.dtype], list(t.shape))

    def _emit(self, op: str, name: str, inputs, outputs, attrs: Mapping[str, Any] | None = None,
              metadata: Mapping[str, Any] | None = None) -> onnx.NodeProto:
        proto = helper.make_node(op, list(inputs), list(outputs), name=name,
                                 **{k: _attr(v) for k, v in (attrs or {}).items()
                                    if v is not None})
        for key, value in (metadata or {}).items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, _text(value)
        self.nodes.append(proto)
        return proto

    # -- quantize and dequantize --

    def _dequantize(self, name: str) -> str:
        """The float value of integer activation `name` (one DequantizeLinear, shared)."""
        if name in self.dq:
            return self.dq[name]
        own = self.own_dq.get(name)
        if own is not None and own.name not in self.emitted:
            self._boundary(own)
            return self.dq[name]
        t = self.g.type_of(name)
        scale, zero = self._params(name, t.quant, t.dtype)
        out = self._unique(f"{name}/dq")
        self.types[out] = Type("float32", t.shape)
        self._emit(DEQUANTIZE_LINEAR.name, self._unique(f"{name}/{DEQUANTIZE_LINEAR.name}"),
                   (name, scale, zero), (out,), metadata=_quant_metadata(t))
        self.dq[name] = out
        return out

    def _dequantize_const(self, name: str) -> str:
        """An int8 constant (weight, quantized operand) as an initializer with its dequantize."""
        if name in self.dq:
            return self.dq[name]
        t = self.g.type_of(name)
        stored = self._const(name)
        scale, zero = self._params(stored, t.quant, t.dtype)
        out = self._unique(f"{name}/dq")
        self.types[out] = Type("float32", t.shape)
        axis = {"axis": t.quant.axis} if t.quant.axis is not None else {}
        self._emit(DEQUANTIZE_LINEAR.name, self._unique(f"{name}/{DEQUANTIZE_LINEAR.name}"),
                   (stored, scale, zero), (out,), axis, _quant_metadata(t))
        self.dq[name] = out
        return out

    def _dequantize_bias(self, name: str, codes: np.ndarray, params: QuantParams) -> str:
        """int32 bias codes at scale s_x * s_w (zero point 0, so none is given)."""
        stored = self._init(name, codes.astype(np.int32))
        if params.axis is None:
            scale = self._init(f"{name}/scale", np.float32(params.scale[0]))
            attrs = {}
        else:
            scale = self._init(f"{name}/scale", np.asarray(params.scale, np.float32))
            attrs = {"axis": params.axis}
        out = self._unique(f"{name}/dq")
        self.types[out] = Type("float32", codes.shape)
        self._emit(DEQUANTIZE_LINEAR.name, self._unique(f"{name}/{DEQUANTIZE_LINEAR.name}"),
                   (stored, scale), (out,), attrs,
                   {"precision": "int32", **_scale_metadata(params)})
        return out

    def _quantize(self, source: str, out: str, name: str, metadata: Mapping[str, Any]) -> None:
        """QuantizeLinear of float value `source` into the integer value `out`."""
        t = self.g.type_of(out)
        scale, zero = self._params(out, t.quant, t.dtype)
        self.types[out] = t
        self._emit(QUANTIZE_LINEAR.name, name, (source, scale, zero), (out,), metadata=metadata)

    # -- the three kinds of node --

    def _boundary(self, node: Node) -> None:
        """The quantized graph's own QuantizeLinear/DequantizeLinear: ONNX semantics already."""
        self.emitted.add(node.name)
        inputs = [self._const(n) if n and self.g.values[n].is_const else n for n in node.inputs]
        for out in node.outputs:
            self.types[out] = self.g.type_of(out)
        side = node.outputs[0] if _kind(node) is Quant.QUANTIZE else node.inputs[0]
        source = self.g.type_of(node.inputs[0])
        if _kind(node) is Quant.QUANTIZE and source.dtype not in ("float32", "float16"):
            # An integer model input quantized for its Cast to float (`Quant.CAST`): ember's
            # host quantizes the integers, ONNX's QuantizeLinear takes floats only.
            real = self._unique(f"{node.inputs[0]}/float")
            self.types[real] = Type("float32", source.shape)
            self._emit(CAST.name, self._unique(f"{real}/{CAST.name}"), (inputs[0],), (real,),
                       {"to": TensorProto.FLOAT})
            inputs[0] = real
        metadata = {**_quant_metadata(self.g.type_of(side)), "ember_node": node.name}
        metadata.update(self._sqnr(side) or self._sqnr(node.outputs[0]))
        self._emit(node.op, node.name, inputs, node.outputs, _onnx_attrs(node), metadata)
        if _kind(node) is Quant.DEQUANTIZE and self.own_dq.get(node.inputs[0]) is node:
            self.dq.setdefault(node.inputs[0], node.outputs[0])

    def _float(self, node: Node) -> None:
        """A node kept in fp32: copied, reading float values and float constants."""
        inputs = [self._const(n) if n and self.g.values[n].is_const else n for n in node.inputs]
        for out in node.outputs:
            self.types[out] = self.g.type_of(out)
        metadata = {"precision": "fp32", "ember_node": node.name,
                    **self._sqnr(node.outputs[0]), **self.extra.get(node.name, {})}
        self._emit(node.op, node.name, inputs, node.outputs, _onnx_attrs(node), metadata)

    def _integer(self, node: Node) -> None:
        """An integer node as DequantizeLinear → fp32 op → [clamp] → QuantizeLinear."""
        out_type = self.g.type_of(node.outputs[0])
        metadata = {"precision": "int8", "ember_op": node.op, "ember_node": node.name,
                    **_quant_metadata(out_type), **self._sqnr(node.outputs[0])}
        clamp = self._clamp_of(node)
        if clamp is not None:
            metadata["qclamp"] = list(clamp)
        if OPS[node.op].weight is not None and len(node.inputs) > 1 and \
                self.g.type_of(node.inputs[1]).dtype == "int16":
            metadata["weight_precision"] = "int16"
        metadata.update(self.extra.get(node.name, {}))
        if _kind(node) is Quant.RESCALE:
            result = self._dequantize(node.inputs[0])
            result = self._clamped(node, result, clamp)
            self._quantize(result, node.outputs[0], node.name, metadata)
            return
        op, inputs, attrs = self._float_form(node)
        if _kind(node) is Quant.CLAMP and "table_of" not in node.attrs:  # its bounds: codes
            op, inputs, attrs = self._clamp_form(node, inputs[0])
            clamp = None
        results = [self._unique(f"{out}/float") for out in node.outputs]
        for result, out in zip(results, node.outputs):
            self.types[result] = Type("float32", self.g.type_of(out).shape)
        self._emit(op, node.name, inputs, results, attrs, metadata)
        for result, out in zip(results, node.outputs):
            result = self._clamped(node, result, clamp)
            self._quantize(result, out, self._unique(f"{out}/{QUANTIZE_LINEAR.name}"),
                           {**_quant_metadata(self.g.type_of(out)), "ember_node": node.name})

    # -- the fp32 form of an integer node --

    def _float_form(self, node: Node) -> tuple[str, list[str], dict[str, Any]]:
        attrs = _onnx_attrs(node)
        row = OPS[node.op]
        if row.weight is not None:
            return self._linear(node, attrs)
        if row.quant is Quant.DIVIDE:
            return self._divide(node)
        if row.quant is Quant.HYPOT:
            return self._hypot(node)
        if node.op == SWISH.name:
            return self._swish(node)
        if node.op == CHANNEL_MAP.name:
            return self._channel_map(node)
        names = list(node.inputs)
        if not row.variadic:
            # Inputs past the ONNX operator's are ember's own: the lookup tables of Sigmoid,
            # Tanh... and Softmax, which the fp32 operator itself replaces.
            names = names[:len(row.inputs)]
        inputs = [self._operand(n) for n in names]
        fill = row.fill_input(int8_attrs(node)) if row.fill_input else None
        if fill is not None and len(names) > fill and names[fill]:
            code = self.g.values[names[fill]].const
            params = self.g.type_of(node.inputs[0]).quant
            if code.dtype.kind in "iu" and self.g.type_of(names[fill]).quant is None:
                real = np.float32(numerics.dequantize(int(code), params.scale[0],
                                                      params.zero_point[0], arithmetic=np.float64))
                inputs[fill] = self._init(names[fill], real)
        return node.op, inputs, attrs

    def _divide(self, node: Node) -> tuple[str, list[str], dict[str, Any]]:
        """Div by an activation as ember computes it: the divisor's Reciprocal quantized in
        the parameters of the table's codes, then a Mul."""
        a, b = (self._operand(n) for n in node.inputs[:2])
        table = self.g.type_of(node.inputs[2])
        shape = self.g.type_of(node.inputs[1]).shape
        reciprocal = self._unique(f"{node.name}/reciprocal")
        codes, real = self._unique(f"{reciprocal}/q"), self._unique(f"{reciprocal}/dq")
        self.types[reciprocal] = self.types[real] = Type("float32", shape)
        self.types[codes] = Type(table.dtype, shape, table.quant)
        scale, zero = self._params(reciprocal, table.quant, table.dtype)
        self._emit(RECIPROCAL.name, self._unique(reciprocal), (b,), (reciprocal,))
        self._emit(QUANTIZE_LINEAR.name, self._unique(f"{reciprocal}/{QUANTIZE_LINEAR.name}"),
                   (reciprocal, scale, zero), (codes,), metadata=_quant_metadata(table))
        self._emit(DEQUANTIZE_LINEAR.name, self._unique(f"{reciprocal}/{DEQUANTIZE_LINEAR.name}"),
                   (codes, scale, zero), (real,))
        return MUL.name, [a, real], {}

    def _swish(self, node: Node) -> tuple[str, list[str], dict[str, Any]]:
        alpha = float(OPS[node.op].bind(node.name, _onnx_attrs(node))["alpha"])
        return self._swish_form(node.name, self._operand(node.inputs[0]), alpha,
                                self.g.type_of(node.outputs[0]).shape)

    def _swish_form(self, name: str, x: str, alpha: float, shape
                    ) -> tuple[str, list[str], dict[str, Any]]:
        """Swish (SiLU, as `fuse_gates` names x * Sigmoid(alpha x)) as the exporters write it:
        ONNX has Swish only from opset 24, and the export's opset is 21."""
        gate_input = x
        if alpha != 1.0:
            gate_input = self._unique(f"{name}/scaled")
            self.types[gate_input] = Type("float32", shape)
            self._emit(MUL.name, self._unique(gate_input),
                       (x, self._init(f"{name}/alpha", np.float32(alpha))), (gate_input,))
        gate = self._unique(f"{name}/gate")
        self.types[gate] = Type("float32", shape)
        self._emit(SIGMOID.name, self._unique(gate), (gate_input,), (gate,))
        return MUL.name, [x, gate], {}

    def _channel_map(self, node: Node) -> tuple[str, list[str], dict[str, Any]]:
        """ember's ChannelMap as equalization writes it: Mul by the channels' pre scales, the
        table op, Mul by their post scales (the int8 form's tables are their composition)."""
        x, pre, post = (self._operand(n) for n in node.inputs[:3])
        attrs = OPS[node.op].bind(node.name, _onnx_attrs(node))  # not an int16 form's
        shape = self.g.type_of(node.outputs[0]).shape
        scaled, mapped = (self._unique(f"{node.name}/{part}") for part in ("scaled", "mapped"))
        for name in (scaled, mapped):
            self.types[name] = Type("float32", shape)
        self._emit(MUL.name, self._unique(scaled), (x, pre), (scaled,))
        inner = OPS[attrs["map"]].bind(node.name, attrs["map_attrs"])
        op, inputs, inner = (self._swish_form(mapped, scaled, float(inner["alpha"]), shape)
                             if attrs["map"] == SWISH.name else (attrs["map"], [scaled], inner))
        self._emit(op, self._unique(mapped), inputs, (mapped,), inner)
        return MUL.name, [mapped, post], {}

    def _hypot(self, node: Node) -> tuple[str, list[str], dict[str, Any]]:
        """ember's Hypot as ONNX writes a magnitude: the squares of both inputs (Mul), their
        sum (Add) and its Sqrt, in fp32 between the Dequantize and Quantize nodes."""
        squares = []
        shape = self.g.type_of(node.outputs[0]).shape
        for name in node.inputs[:2]:
            x = self._operand(name)
            square = self._unique(f"{node.name}/square_{name}")
            self.types[square] = Type("float32", shape)
            self._emit(MUL.name, self._unique(square), (x, x), (square,))
            squares.append(square)
        total = self._unique(f"{node.name}/sum")
        self.types[total] = Type("float32", shape)
        self._emit(ADD.name, self._unique(total), squares, (total,))
        return SQRT.name, [total], {}

    def _operand(self, name: str) -> str:
        if not name:
            return ""
        value = self.g.values[name]
        if value.is_const:
            if value.type.quant is not None and value.type.dtype in ("int8", "uint8", "int16"):
                return self._dequantize_const(name)
            return self._const(name)
        if value.type.quant is not None:
            return self._dequantize(name)
        return name

    def _linear(self, node: Node, attrs: dict[str, Any]) -> tuple[str, list[str], dict]:
        """Conv/Gemm/MatMul with int8 operands and the int32 bias, its zero-point fold undone."""
        a, b = node.inputs[0], node.inputs[1]
        inputs = [self._operand(a), self._operand(b)]
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        attrs.pop("beta", None)  # Gemm's beta is in the int32 bias already
        if bias is None:
            return node.op, inputs, attrs
        codes = self.g.values[bias].const.astype(np.int64)
        fold = zero_point_fold(OPS[node.op].weight, int8_attrs(node),
                               *(self.g.values[n] for n in node.inputs[:2]))
        codes = codes - (np.int64(0) if fold is None else fold)
        lo, hi = RANGES["int32"]
        if np.any(codes < lo) or np.any(codes > hi):
            raise QuantizeError(f"node {node.name!r} ({node.op}): bias {bias!r} without its "
                                "folded zero-point term does not fit int32")
        original = self.g.origin.get(bias, node.name) != node.name
        if not original and not np.any(codes):
            return node.op, inputs, attrs
        params = self.g.type_of(bias).quant
        dq = self._dequantize_bias(bias, codes, params)
        if len(OPS[node.op].inputs) > 2:
            return node.op, inputs + [dq], attrs
        # MatMul has no bias input in ONNX (the quantizer only gives it one for the fold).
        product = self._unique(f"{node.outputs[0]}/matmul")
        self.types[product] = Type("float32", self.g.type_of(node.outputs[0]).shape)
        self._emit(node.op, self._unique(f"{node.name}/matmul"), inputs, (product,),
                   metadata={"precision": "int8", "ember_node": node.name})
        return ADD.name, [product, dq], {}

    # -- clamps --

    def _clamp_of(self, node: Node) -> tuple[int, int] | None:
        """The node's qclamp when it is narrower than its output type's range, else None."""
        qclamp = node.attrs.get("qclamp")
        t = self.g.type_of(node.outputs[0])
        if qclamp is None or t.quant is None:
            return None
        qclamp = (int(qclamp[0]), int(qclamp[1]))
        return None if qclamp == tuple(RANGES[t.dtype]) else qclamp

    def _bounds(self, node: Node, clamp: tuple[int, int]) -> tuple[str, dict, list[str]]:
        """Relu, or Clip with the clamp codes' real values, in the output's parameters."""
        t = self.g.type_of(node.outputs[0])
        scale, zero = t.quant.scale[0], t.quant.zero_point[0]
        qmin, qmax = RANGES[t.dtype]
        if clamp[0] == zero and clamp[1] == qmax:
            return RELU.name, {}, []
        bounds = []
        for which, code, edge in (("min", clamp[0], qmin), ("max", clamp[1], qmax)):
            if code == edge:
                bounds.append("")
                continue
            real = np.float32(numerics.dequantize(code, scale, zero, arithmetic=np.float64))
            bounds.append(self._init(f"{node.name}/clamp_{which}", real))
        while bounds and not bounds[-1]:
            bounds.pop()
        return CLIP.name, {}, bounds

    def _clamp_form(self, node: Node, x: str) -> tuple[str, list[str], dict]:
        """An unfused Relu or Clip: its qclamp, in its input's (= output's) parameters."""
        qmin, qmax = RANGES[self.g.type_of(node.outputs[0]).dtype]
        clamp = self._clamp_of(node) or (qmin, qmax)
        op, attrs, bounds = self._bounds(node, clamp)
        return op, [x] + bounds, attrs

    def _clamped(self, node: Node, value: str, clamp: tuple[int, int] | None) -> str:
        """`value` clamped as `node`'s fused qclamp says (nothing when its range implies it)."""
        if clamp is None:
            return value
        op, attrs, bounds = self._bounds(node, clamp)
        out = self._unique(f"{node.outputs[0]}/clamped")
        self.types[out] = Type("float32", self.g.type_of(node.outputs[0]).shape)
        self._emit(op, self._unique(f"{node.name}/clamp"), [value] + bounds, (out,), attrs,
                   {"precision": "int8", "ember_node": node.name, "qclamp": list(clamp)})
        return out

    def _sqnr(self, name: str) -> dict[str, Any]:
        for key in (name, self.g.origin.get(name, name)):
            if key in self.sqnr:
                return {"sqnr_db": f"{float(self.sqnr[key]):.2f}"}
        return {}


# --- helpers ---------------------------------------------------------------------------------


def _kind(node: Node) -> Quant | None:
    return OPS[node.op].quant


def _onnx_attrs(node: Node) -> dict[str, Any]:
    """The node's ONNX attributes: the integer parameters the quantizer added set aside."""
    return {k: v for k, v in node.attrs.items() if k not in INT8_ATTRS}


def _attr(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return numpy_helper.from_array(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return str(value)


def _scale_metadata(params: QuantParams) -> dict[str, Any]:
    if params.axis is None:
        return {"scale": float(params.scale[0]), "zero_point": int(params.zero_point[0])}
    return {"scale": [float(s) for s in params.scale],
            "zero_point": [int(z) for z in params.zero_point], "axis": params.axis}


def _quant_metadata(t: Type) -> dict[str, Any]:
    if t.quant is None:
        return {"precision": "fp32"}
    return {"precision": t.dtype, **_scale_metadata(t.quant)}
