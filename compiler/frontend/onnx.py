"""ONNX → Graph: check, fix dynamic dimensions, bind attributes through the operator table.

The importer keeps ONNX value names (profiles and per-layer reports key on them), turns
initializers into constants, and moves attributes that newer opsets turned into inputs (Squeeze's
axes, Split's split, ...) into constant inputs, so the rest of ember sees one form per operator.
Every output type comes from ember's own shape rules, which tests hold to onnxruntime; ONNX
shape inference only fills in where a rule cannot tell (it disagrees with onnxruntime on a few
edge cases: ceil_mode pooling windows, float32 Resize sizes, backward Slice to INT64_MAX).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper, shape_inference, version_converter

from compiler.errors import CompileError
from compiler.graph import ops as optable
from compiler.graph.ir import Graph, Node, Type, Value, toposort
from simulator.numerics import oversize

MIN_OPSET = 11             # the operator table's rules are written from this opset on
MIN_CONVERTED_OPSET = 7    # older models (tf2onnx's opset 9, ...) are converted up to MIN_OPSET
MAX_OPSET = onnx.defs.onnx_opset_version()
_DEFAULT_DOMAINS = ("", "ai.onnx")


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse `name=1,3,224,224` strings (the --input-shape option) into a dict."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise CompileError(f"--input-shape {spec!r}: expected NAME=D0,D1,... with positive "
                               "integer dimensions, e.g. input=1,3,224,224")
        shapes[name] = shape
    return shapes


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read and parse an ONNX file, with one-line errors for missing or broken files."""
    path = Path(path)
    if not path.is_file():
        raise CompileError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=True)
    except (DecodeError, ValueError, RuntimeError, OSError,
            onnx.checker.ValidationError) as err:  # the last: external data outside its folder
        raise CompileError(f"{path}: not a valid ONNX model ({_first_line(err)})") from None
    if not model.graph.node and not model.graph.output:
        raise CompileError(f"{path}: not a valid ONNX model (no graph)")
    return dynamic_minus_one(model)


def dynamic_minus_one(model: onnx.ModelProto) -> onnx.ModelProto:
    """An input dimension of -1 (paddle2onnx's way to say "any", which onnxruntime reads so) as
    the named dynamic dimension ONNX means, in place; `profiler.run.load_model` does the same,
    so that both fingerprint the same model."""
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value == -1:
                dim.dim_param = "?"
    return model


def import_model(source: str | os.PathLike | onnx.ModelProto,
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 label: str | None = None) -> Graph:
    """Import an ONNX model (a path or a ModelProto) into a typed, verified Graph. Errors
    start with `label`: by default the path, or "model" for a ModelProto, whose caller
    should pass the file it came from."""
    label = label or (str(source) if not isinstance(source, onnx.ModelProto) else "model")
    model = load_model(source) if not isinstance(source, onnx.ModelProto) else source
    opset = _check_opset(model, label)
    if opset < MIN_OPSET:
        model, opset = _convert_opset(model, label, opset), MIN_OPSET
    model = fix_input_shapes(model, input_shapes or {}, label)
    inferred = _inferred(model, label)
    if any(n.op_type in UNROLLED for n in inferred.graph.node):
        inferred = _inferred(unroll_recurrent(inferred, label), label)
    return _GraphBuilder(inferred, label, opset).build()


def _inferred(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    try:
        onnx.checker.check_model(model)
        return shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                            data_prop=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise CompileError(f"{label}: invalid ONNX model: {_first_line(err)}") from None


# The operators whose rows expand them on import (`OpDef.expand`): LSTM, GRU, Einsum, and Max
# and Min of other than two inputs.
UNROLLED = frozenset(name for name, op in optable.OPS.items() if op.expand is not None)


def unroll_recurrent(model: onnx.ModelProto, label: str = "model") -> onnx.ModelProto:
    """`model` with every recurrent node replaced by its cell equations over the static
    sequence length (`compiler.graph.recurrent`), as ONNX nodes and initializers: the importer
    reads this form, and `ember quantize-profile` profiles it, so that every value of the
    unrolled steps has its range under the name the quantizer looks for."""
    opset = _check_opset(model, label)
    if opset < MIN_OPSET:
        model, opset = _convert_opset(model, label, opset), MIN_OPSET
    # ember's own typing of the model as it is (the recurrent rows have shape rules), so that
    # the layers' inputs have static shapes and their weights are known even where ONNX's
    # shape inference or a Constant node leaves them open.
    typing = _GraphBuilder(_inferred(model, label), label, opset)
    typing.build()

    def value(name: str) -> Value | None:
        if not name:
            return None
        known = typing.known.get(name)
        return Value(name, typing.values[name].type, known)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    added: list[onnx.TensorProto] = []

    def make_const(name: str, array: np.ndarray) -> str:
        array = np.asarray(array)
        array = array.astype(np.int64 if array.dtype.kind in "iu" else np.float32)
        added.append(numpy_helper.from_array(array, name))
        return name

    for index, proto in enumerate(model.graph.node):
        op = optable.OPS.get(proto.op_type) if proto.domain in _DEFAULT_DOMAINS else None
        if op is None or op.expand is None:
            out.graph.node.append(proto)
            continue
        name = proto.name or f"{proto.op_type}_{index}"
        node = Node(op.name, name, tuple(proto.input), tuple(proto.output),
                    {a.name: _attr_value(a) for a in proto.attribute})
        try:
            op.bind(name, node.attrs)
            parts = op.expand(node, [value(i) for i in node.inputs], make_const)
        except CompileError as err:
            raise CompileError(f"{label}: {err}") from None
        out.graph.node.extend(helper.make_node(p.op, list(p.inputs), list(p.outputs),
                                               name=p.name, **p.attrs) for p in parts)
    out.graph.initializer.extend(added)
    return out


def fix_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]],
                     label: str = "model") -> onnx.ModelProto:
    """Return a copy whose graph inputs all have static shapes, or fail naming the input."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    names = [i.name for i in inputs]
    for name in input_shapes:
        if name not in names:
            raise CompileError(f"{label}: --input-shape names {name!r}, but the model's inputs "
                               f"are {names}")
    model = _copy(model)
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        if value.name in input_shapes:
            shape = tuple(input_shapes[value.name])
            if len(shape) != len(dims):
                raise CompileError(f"{label}: --input-shape {value.name}: rank {len(shape)} "
                                   f"given, but the input has rank {len(dims)}")
            for dim, size in zip(dims, shape):
                if dim.HasField("dim_value") and dim.dim_value != size:
                    raise CompileError(f"{label}: --input-shape {value.name}: dimension "
                                       f"{dim.dim_value} is static and cannot become {size}")
                dim.Clear()
                dim.dim_value = size
        elif any(not d.HasField("dim_value") for d in dims):
            shown = ",".join(str(d.dim_value) if d.HasField("dim_value") else
                             (d.dim_param or "?") for d in dims)
            raise CompileError(f"{label}: input {value.name!r} has dynamic shape [{shown}]; "
                               f"fix it with --input-shape {value.name}=D0,D1,...")
    return model


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _check_opset(model: onnx.ModelProto, label: str) -> int:
    versions = {op.domain: op.version for op in model.opset_import}
    opset = versions.get("", versions.get("ai.onnx"))
    if opset is None:
        raise CompileError(f"{label}: the model imports no default-domain opset")
    if opset > MAX_OPSET:
        raise CompileError(f"{label}: opset {opset} is newer than the installed onnx "
                           f"{onnx.__version__} knows (up to {MAX_OPSET}); upgrade onnx")
    if opset < MIN_CONVERTED_OPSET:
        raise CompileError(f"{label}: opset {opset} is too old; ember reads opsets "
                           f"{MIN_CONVERTED_OPSET}..{MAX_OPSET} (converting below {MIN_OPSET})")
    return opset


def _convert_opset(model: onnx.ModelProto, label: str, opset: int) -> onnx.ModelProto:
    """An opset-7..10 model in today's operator forms, by onnx's own version converter, which
    keeps every value name (profiles and reports key on them)."""
    try:
        converted = version_converter.convert_version(model, MIN_OPSET)
    except (RuntimeError, ValueError, IndexError, onnx.checker.ValidationError,
            onnx.shape_inference.InferenceError) as err:
        raise CompileError(f"{label}: cannot convert opset {opset} to {MIN_OPSET}: "
                           f"{_first_line(err)}") from None
    _restore_names(model.graph, converted.graph)
    return converted


def _restore_names(original: onnx.GraphProto, converted: onnx.GraphProto) -> None:
    """The converter renames the output of a node it replaces (Upsample → Resize writes
    `_v_21` where the model said `u`) and leaves the new node unnamed; profiles and per-layer
    reports key on the model's own names, so both are put back. A renamed value shows where a
    node of the original's name and type reads it."""
    before = {node.name: node for node in original.node if node.name}
    renamed: dict[str, str] = {}
    for node in converted.node:
        old = before.get(node.name)
        if old is not None and old.op_type == node.op_type:
            renamed.update((new, name) for new, name in zip(node.input, old.input)
                           if new != name)
    for new, old in zip(converted.output, original.output):
        if new.name != old.name:
            renamed[new.name] = old.name
            new.name = old.name
    names = {out: node.name for node in original.node for out in node.output if node.name}
    for node in converted.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        node.output[:] = [renamed.get(name, name) for name in node.output]
        if not node.name and node.output and node.output[0] in names:
            node.name = names[node.output[0]]


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _attr_value(attr: onnx.AttributeProto):
    value = helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    if isinstance(value, (onnx.GraphProto, onnx.SparseTensorProto)):
        raise CompileError(f"attribute {attr.name!r}: graph and sparse attributes are not "
                           "supported")
    return value


def _elem_dtype(elem_type: int, what: str) -> str:
    try:
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError):
        dtype = "unknown"
    if dtype not in ("float32", "float64", "float16", "int8", "uint8", "int32", "int64", "bool"):
        raise CompileError(f"{what}: element type {dtype} is not supported")
    return dtype


class _GraphBuilder:
    """Walks the ONNX graph once, typing each value with ember's rules as it goes."""

    def __init__(self, model: onnx.ModelProto, label: str, opset: int):
        self.model, self.label, self.opset = model, label, opset
        self.values: dict[str, Value] = {}
        self.known: dict[str, np.ndarray] = {}   # constant-propagated values, for typing only
        self.onnx_types = {vi.name: vi.type for vi in
                           list(model.graph.value_info) + list(model.graph.output)}

    def build(self) -> Graph:
        g = self.model.graph
        for init in g.initializer:
            where = f"{self.label}: initializer {init.name!r}"
            _elem_dtype(init.data_type, where)
            try:
                array = numpy_helper.to_array(init)
            except ValueError as err:  # raw_data of another size than its dims say
                raise CompileError(f"{where}: its data does not fit its shape "
                                   f"{list(init.dims)} ({err})") from None
            self.values[init.name] = Value.constant(init.name, array)
            self.known[init.name] = array
        inputs = []
        for vi in g.input:
            if vi.name in self.values:
                continue  # pre-IR-4 models list initializers among the inputs
            kind = vi.type.WhichOneof("value")
            if kind not in (None, "tensor_type"):
                raise CompileError(f"{self.label}: input {vi.name!r} is a "
                                   f"{kind.removesuffix('_type').replace('_', ' ')}, not a "
                                   "tensor; ember takes tensors only")
            tt = vi.type.tensor_type
            dtype = _elem_dtype(tt.elem_type, f"{self.label}: input {vi.name!r}")
            shape = tuple(d.dim_value for d in tt.shape.dim)
            if (why := oversize(shape, dtype)) is not None:
                raise CompileError(f"{self.label}: input {vi.name!r} is too large: {why}")
            self.values[vi.name] = Value(vi.name, Type(dtype, shape))
            inputs.append(vi.name)
        nodes = [self._node(i, n) for i, n in enumerate(g.node)]
        available = set(inputs) | set(self.values)
        nodes = [self._type_outputs(node) for node in toposort(nodes, available)]
        outputs = tuple(o.name for o in g.output)
        for name in outputs:
            if name not in self.values:
                raise CompileError(f"{self.label}: graph output {name!r} is never produced")
        return Graph(name=g.name or Path(self.label).stem, inputs=tuple(inputs),
                     outputs=outputs, nodes=tuple(nodes), values=dict(self.values),
                     opset=self.opset)

    def _node(self, index: int, proto: onnx.NodeProto) -> Node:
        name = proto.name or f"{proto.op_type}_{index}"
        if (proto.domain not in _DEFAULT_DOMAINS or proto.op_type not in optable.OPS
                or proto.op_type not in optable.IMPORTABLE):
            domain = f"{proto.domain}." if proto.domain not in _DEFAULT_DOMAINS else ""
            raise CompileError(f"{self.label}: node {name!r} has unsupported operator "
                               f"{domain}{proto.op_type}; supported: {optable.supported_ops()}")
        op = optable.OPS[proto.op_type]
        try:
            attrs = {a.name: _attr_value(a) for a in proto.attribute}
        except CompileError as err:
            raise CompileError(f"{self.label}: node {name!r} ({proto.op_type}): {err}") from None
        inputs = list(proto.input)
        for attr, position in op.attr_to_input.items():
            if attr in attrs:
                inputs += [""] * (position + 1 - len(inputs))
                inputs[position] = self._constant(f"{name}/{attr}", attrs.pop(attr))
        if op.count_outputs:
            attr, index = op.count_outputs
            if (len(inputs) <= index or not inputs[index]) and not attrs.get(attr):
                attrs[attr] = len(proto.output)
        for attr in op.dropped_attrs:
            attrs.pop(attr, None)
        while inputs and not inputs[-1]:
            inputs.pop()
        outputs = list(proto.output)
        while outputs and not outputs[-1]:
            outputs.pop()
        # An op the importer expands takes the counts its expansion does (Max of three).
        if op.expand is None and (len(inputs) < op.min_inputs or
                                  (len(inputs) > len(op.inputs) and not op.variadic)):
            raise CompileError(f"{self.label}: node {name!r} ({op.name}) has {len(inputs)} "
                               f"inputs; {op.name} takes {op.inputs}")
        try:
            op.bind(name, attrs)
        except CompileError as err:
            raise CompileError(f"{self.label}: {err}") from None
        return Node(op.name, name, tuple(inputs), tuple(outputs), attrs)

    def _constant(self, name: str, value) -> str:
        array = np.asarray(value)
        if array.dtype.kind in "iu":
            array = array.astype(np.int64)
        elif array.dtype.kind == "f":
            array = array.astype(np.float32)
        self.values[name] = Value.constant(name, array)
        self.known[name] = array
        return name

    def _legacy_axis(self, node: Node) -> Node:
        """Before its `coerced_2d_before` opset the op (Softmax) flattened to 2-D at `axis`;
        equal to today's form on the last axis. Decided from ember's own type of the input, so
        a missing or shapeless `value_info` never decides it."""
        op = optable.OPS[node.op]
        if not op.coerced_2d_before or self.opset >= op.coerced_2d_before:
            return node
        rank = self.values[node.inputs[0]].type.rank
        axis = node.attrs.get("axis", 1)
        if (axis + rank if axis < 0 else axis) != rank - 1:
            raise CompileError(f"{self.label}: node {node.name!r} ({op.name}, opset "
                               f"{self.opset}) normalizes over axes {axis}.. of a 2-D "
                               f"coercion; only the last axis is supported before opset "
                               f"{op.coerced_2d_before}")
        return node.with_(attrs={**node.attrs, "axis": -1})

    def _type_outputs(self, node: Node) -> Node:
        """Type `node`'s outputs (and constant-propagate them where its inputs are known);
        returns the node with any input-type-dependent attribute resolved."""
        inputs = []
        for name in node.inputs:
            if not name:
                inputs.append(None)
                continue
            if name not in self.values:
                raise CompileError(f"{self.label}: node {node.name!r} ({node.op}) reads "
                                   f"{name!r}, which is neither an input, an initializer nor "
                                   "a node output")
            value = self.values[name]
            known = self.known.get(name)
            inputs.append(Value(name, value.type, known) if known is not None else value)
        node = self._legacy_axis(node)
        try:
            types = optable.infer_from(node, inputs)
        except CompileError as err:
            raise CompileError(f"{self.label}: {err}") from None
        if types is None:
            types = [self._onnx_type(node, out) for out in node.outputs]
        for out, t in zip(node.outputs, types):
            self.values[out] = Value(out, t)
        if optable.OPS[node.op].shape_only:  # shapes are static: the value follows from the type
            data = np.broadcast_to(np.uint8(0), inputs[0].type.shape)
            self.known.update(zip(node.outputs, optable.run_fp32(node, [data])))
        elif all(i is None or i.is_const for i in inputs) and node.op != "Dropout":
            results = optable.run_fp32(node, [i.const if i is not None else None
                                              for i in inputs])
            self.known.update(zip(node.outputs, results))
        return node

    def _onnx_type(self, node: Node, name: str) -> Type:
        """ONNX shape inference's type, for the rare value ember's rules cannot type."""
        onnx_type = self.onnx_types.get(name)
        dims = onnx_type.tensor_type.shape.dim if onnx_type is not None else None
        if dims is None or not onnx_type.tensor_type.HasField("shape") or any(
                not d.HasField("dim_value") for d in dims):
            raise CompileError(f"{self.label}: cannot determine the static shape of "
                               f"{name!r} (output of node {node.name!r}, {node.op})")
        dtype = _elem_dtype(onnx_type.tensor_type.elem_type, f"{self.label}: value {name!r}")
        return Type(dtype, tuple(d.dim_value for d in dims))
