"""Each integer node's ideal output: the per-layer report's kernel error.

An integer node errs in two ways: its output is rounded to its codes (the output's own
quantization error), and its arithmetic only approximates the operator (a table interpolating
between 257 knots, a requantization multiplier of 31 bits, Softmax's exponential table, a
window sum divided by a multiplier, ...). To see the second alone, `kernel_outputs` runs a
node's fp32 reference (the operator table's `fp32` column, as the fp32 interpreter runs it) on
the dequantized integer inputs the node received in a keep_all run of the integer reference
(`quantizer.reference.run_int8`). That result is the signal; quantized in the node's output
parameters it is the ideal output, what a kernel rounding exactly once would give for the same
inputs. The node's own output against the signal is its kernel SQNR; the ideal's against the
same signal is the rounding level it would reach if its arithmetic were exact, so the two
differ only by what the kernel adds.

A node's inputs are taken as the kernel reads them: a weight dequantized per channel (its
rounding is the weight's own error, reported with the weights), the int32 bias without the
zero point folded into it (`zero_point_fold`) and at the accumulator's scale (Gemm's beta is in
it), a Rescale's output read through to the value it rescales (a Concat's or Hypot's rescaled
input: the rescale's rounding counts in the kernel that reads it), a fill value held as a code
(Pad's) dequantized in the data's parameters; the tables the quantizer appends after the
operator's inputs are left out, the fp32 operator replacing them. The signal is clamped to the
real values of the codes the output may take (its `qclamp`, else its type's range): a Relu or
Clip folded into the node is that clamp, or only the type's range (a Relu fused into a
producer whose zero point is the lowest code), and what lies beyond the range is saturation,
the tensor's own error (the report's own SQNR counts it), not the kernel's.

Measured: every integer node whose first output is a per-tensor quantized value with an ONNX
origin (`Graph.origin`) that no earlier node wrote, the node the per-layer report names for
that tensor. Skipped: QuantizeLinear and DequantizeLinear (the model's boundary: their error
is the tensor's own), Rescale (counted in its reader, above), views (Reshape, Transpose,
Slice, Split, ...: they move codes and cannot err), nodes kept in fp32 (no integer output),
and a later writer of a name that an earlier node wrote (a LayerNorm's int16 copy), which the
first writer stands for. A Rescale that cleanup folded into its producer is part of that
producer's kernel. Only a node's first output is measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from compiler.graph.int8 import INT8_ATTRS, Quant, zero_point_fold
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import OPS, int8_attrs, is_integer_node, run_fp32
from simulator import numerics
from simulator.numerics import RANGES

# The operators whose error is the tensor's own (the model's boundary) or counted in their
# reader (Rescale).
_NOT_KERNELS = (Quant.QUANTIZE, Quant.DEQUANTIZE, Quant.RESCALE)


@dataclass(frozen=True)
class Kernel:
    """One measured integer node: `name` is its output's ONNX name; `sources` its inputs as
    the kernel reads them (a Rescale's output replaced by the value it rescales)."""

    node: Node
    name: str
    sources: tuple[str, ...]


def kernels(qgraph: Graph) -> tuple[Kernel, ...]:
    """The integer nodes of `qgraph` whose kernel error the per-layer report measures (see the
    module's docstring for which, and why the others are not)."""
    producers = qgraph.producers()
    written: set[str] = set()
    found = []
    for node in qgraph.nodes:
        out = node.outputs[0] if node.outputs else ""
        name = qgraph.origin.get(out)
        first = name is not None and name not in written
        written.update(qgraph.origin[o] for o in node.outputs if o in qgraph.origin)
        row = OPS[node.op]
        quant = qgraph.type_of(out).quant if out else None
        if not first or quant is None or quant.axis is not None or row.view is not None or \
                row.quant in _NOT_KERNELS or row.int8 is None or \
                not is_integer_node(qgraph, node):
            continue
        found.append(Kernel(node, name, tuple(_source(qgraph, producers, i)
                                              for i in node.inputs)))
    return tuple(found)


def _source(qgraph: Graph, producers: Mapping[str, Node], name: str) -> str:
    """The value a kernel reads through `name`: the input of the Rescales that made it."""
    while name and name in producers and OPS[producers[name].op].quant is Quant.RESCALE:
        name = producers[name].inputs[0]
    return name


def kernel_outputs(qgraph: Graph, kernel: Kernel, env: Mapping[str, np.ndarray]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(signal, ideal, actual) of one kernel in a keep_all run's `env` (`run_int8`): the fp32
    operator on the dequantized inputs the node received, clamped to its output's codes, that
    signal quantized in the output's parameters and dequantized, and the node's own output
    dequantized; float32, flat, without the elements where the signal is not finite (a
    division by a divisor's zero code)."""
    node, row = kernel.node, OPS[kernel.node.op]
    count = len(node.inputs) if row.variadic else min(len(node.inputs), len(row.inputs))
    args = [_real(qgraph, env, name) for name in kernel.sources[:count]]
    attrs = {k: v for k, v in node.attrs.items() if k not in INT8_ATTRS}
    fill = row.fill_input(int8_attrs(node)) if row.fill_input else None
    if fill is not None and fill < count and kernel.sources[fill] and \
            qgraph.type_of(kernel.sources[fill]).quant is None:
        # A fill value held as a code in the data's parameters (Pad's constant_value).
        data = qgraph.type_of(kernel.sources[0]).quant
        args[fill] = _dequantize(env[kernel.sources[fill]], data.scale[0], data.zero_point[0])
    bias = _bias(qgraph, node, env) if row.weight is not None else None
    if bias is not None:
        attrs.pop("beta", None)  # Gemm's beta is in the int32 bias
        if len(row.inputs) > 2:
            args += [None] * (3 - len(args))
            args[2] = bias
    signal = np.asarray(run_fp32(node.with_(attrs=attrs), args)[0])
    if bias is not None and len(row.inputs) <= 2:
        signal = signal + bias  # MatMul's (ONNX has no bias input): added to the product
    out = node.outputs[0]
    t = qgraph.type_of(out)
    scale, zero = t.quant.scale[0], t.quant.zero_point[0]
    lo, hi = node.attrs.get("qclamp") or RANGES[t.dtype]
    signal = np.ravel(np.clip(signal, _dequantize(lo, scale, zero), _dequantize(hi, scale, zero)))
    actual = np.ravel(_dequantize(env[out], scale, zero))
    finite = np.isfinite(signal)
    if not finite.all():
        signal, actual = signal[finite], actual[finite]
    ideal = _dequantize(numerics.quantize(signal, scale, zero, lo, hi, dtype=t.dtype,
                                          arithmetic=np.float64), scale, zero)
    return signal, ideal, actual


def _real(qgraph: Graph, env: Mapping[str, np.ndarray], name: str) -> np.ndarray | None:
    """Input `name` as the fp32 operator takes it: integer codes dequantized (per channel for
    a weight), floats and integer indices as they are."""
    if not name:
        return None
    t = qgraph.type_of(name)
    if t.quant is None or t.dtype not in ("int8", "uint8", "int16"):
        return env[name]
    return _dequantize(env[name], t.quant.scale, t.quant.zero_point, t.quant.axis)


def _bias(qgraph: Graph, node: Node, env: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """A linear node's int32 bias in real terms, without the activation's zero point folded
    into it (the dequantized activation is centred already), or None without one."""
    if len(node.inputs) < 3 or not node.inputs[2]:
        return None
    codes = np.asarray(env[node.inputs[2]], np.int64)
    fold = zero_point_fold(OPS[node.op].weight, int8_attrs(node),
                           *(qgraph.values[n] for n in node.inputs[:2]))
    if fold is not None:
        codes = codes - fold
    params = qgraph.type_of(node.inputs[2]).quant
    return _dequantize(codes, params.scale, params.zero_point, params.axis)


def _dequantize(codes, scale, zero_point, axis: int | None = None) -> np.ndarray:
    """Codes as float32 reals, computed in float64 (as `quantizer.reference.dequantized`);
    per tensor (one scale) or per channel along `axis`."""
    return numerics.dequantize(codes, scale, zero_point, axis=axis,
                               arithmetic=np.float64).astype(np.float32)
