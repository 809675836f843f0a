"""The quantizer: an fp32 Graph and its profile → an int8 Graph whose types carry the scales.

As in Glow, the quantized type is part of the type: every integer activation has a `Type` with
`QuantParams`, weights are int8 (per output channel by default), biases int32 at scale
s_x * s_w with zero point 0. Quantized activations keep their ONNX names, so per-layer reports
find their fp32 counterparts by name; values the quantizer creates are named after the value
they derive from (`x/q`, `x/fp32`, `x/to_<node>`) and `Graph.origin` maps every activation to
its ONNX name. The model's inputs and outputs keep their names and stay float:
QuantizeLinear/DequantizeLinear sit at the boundary (so the integer copies of graph inputs and
outputs are `name/q`), and around the nodes kept in fp32.

Each operator's rule kind (the operator table's `quant` column) names its rule in `RULES`; the
rules read the operator's own details from its row (weight axes, clamp bounds, window sizes)
and compute the integer parameters each kernel needs once, storing them on the node.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import numpy as np

from compiler.graph.int8 import (
    Quant,
    channel_slopes,
    code_density,
    knot_window,
    layer_norm_params,
    lookup_table,
    reciprocal_range,
    wide_table,
    zero_point_fold,
)
from compiler.graph.ir import Graph, Node, QuantParams, Type, Value
from compiler.graph.ops import (CONV, DEQUANTIZE_LINEAR, GEMM, MATMUL, OPS, QUANTIZE_LINEAR,
                                RECIPROCAL, RESCALE, Lower)
from compiler.graph.reference import resolve_pads
from profiler.format import Profile
from quantizer import calibrate
from quantizer.checks import check_quantizable, integer_node, is_float
from quantizer.cleanup import cleanup
from quantizer.errors import QuantizeError, QuantizeWarning
from quantizer.masks import additive_mask_ranges
from quantizer.smooth import smooth_norms, smoothed_name
from quantizer.wide import (MIN_ARRAY_BITS, accumulator_bits, array_values, hypot_operands,
                            norm_copies, table_input, wide_values, within_bounds)
from quantizer.options import QuantOptions
from quantizer.wide_weights import (MIN_WEIGHT_BITS, input_bits, largest_pass_magnitude,
                                    weight_bits, weight_nodes)
from quantizer.requant import BIAS_CODE_LIMIT, RATIO_MIN, add_ratios, ratio, ratios
from quantizer.rounding import load_rounding, weight_digest
from quantizer.verify import verify_int8
from simulator import numerics
from simulator.errors import listing
from simulator.numerics import RANGES

WEIGHT_QMAX = 127  # weights are symmetric int8 in [-127, 127], so negation never overflows


def quantize(graph: Graph, profile: Profile, options: QuantOptions = QuantOptions(),
             float_weights: dict[str, np.ndarray] | None = None) -> Graph:
    """The int8 graph of `graph` (run `compiler.pipeline.optimize` first: BN must be folded).
    `float_weights`, if given, receives each integer weight's float values by its name: those
    of a weight a pass of the quantizer's made (a LayerNorm's smoothing scales its readers'
    weights: `quantizer.smooth`) are in no graph but the quantizer's own."""
    check_quantizable(graph, options)
    rewriter = _Rewriter(graph, profile, options)
    rewriter.check_profile()
    qgraph = cleanup(rewriter.run())
    verify_int8(qgraph)
    if float_weights is not None:
        float_weights.update({name: array for name, array in rewriter.float_weights.items()
                              if name in qgraph.values})
    return qgraph


# --- the rewrite ----------------------------------------------------------------------------


class _Rewriter:
    """The state of one walk over the fp32 graph: the int8 graph's nodes and values so far,
    and the operations the rules share (declaring values, quantizing operands, emitting)."""

    def __init__(self, graph: Graph, profile: Profile, options: QuantOptions):
        self.g, self.profile, self.opts = graph, profile, options
        self.dtype = options.activation_dtype
        self.keep = set(options.keep_fp32)
        self.wide: set[str] = set()  # the int16 activations, chosen in `run`
        self.wide_bits: dict[str, int] = {}  # int16 tensors the array reads: their code bits
        self.wide_weights: set[str] = set()  # nodes with int16 weights, checked in `run`
        # (graph, its users, its producers), made again when the graph is replaced
        self._maps: tuple[Graph, dict[str, list[Node]], dict[str, Node]] | None = None
        self.uncorrected: list[str] = []  # nodes bias correction found no input means for
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.origin: dict[str, str] = {}
        self.quantized: dict[str, str] = {}  # fp32 activation → the name of its integer value
        self.floating: dict[str, str] = {}   # fp32 activation → the name of its float value
        self.ranges: dict[str, QuantParams] = {}
        self.weights: dict[tuple[str, int | None, tuple[float, ...], int], str] = {}
        self.float_weights: dict[str, np.ndarray] = {}  # an integer weight -> its floats
        self.casts: dict[str, Node] = {}  # a Cast of a model input's integers, not yet emitted
        producers = graph.producers()
        self.float_primary = set(graph.inputs) | set(graph.outputs) | {
            out for node in graph.nodes if node.name in self.keep for out in node.outputs}
        self.fp32_consts = {name for node in graph.nodes if node.name in self.keep
                            for name in node.inputs if name and graph.values[name].is_const}
        self.fused = self._plan_fusion(producers)
        self.absorbed = {clamp.name for clamp in self.fused.values()}
        # --weight-rounding: each weight's chosen codes, by its name (`ember.rounding`)
        self.rounding = load_rounding(options.weight_rounding) if options.weight_rounding \
            else {}
        self.rounded_elsewhere: list[str] = []  # weights the file rounded at other scales

    def run(self) -> Graph:
        """Each node in order through its kind's rule (or kept in fp32)."""
        # int16 residual streams are int8 codes' refinement: not with uint8 activations.
        self.wide = wide_values(self.g, self.opts.wide_norm_inputs if self.dtype == "int8"
                                else "never",
                                lambda name: self.profile.tensors[self.onnx_name(name)],
                                self.real_range, self.keep)
        self.g, self.wide = norm_copies(self.g, self.wide)
        groups = array_values(self.g, self.opts.int16_tensors, self.keep, self.fused)
        # After the copies: the int16 one a residual Add reads keeps the norm's own channels.
        # A smoothed norm's output and the views to its Gemms are renamed (their values are
        # x / f); an int16 one stays int16 under its new name, smoothed too: int16 keeps its
        # outlier channels, and smoothing keeps the Gemms' int8 weights of those channels'
        # rows from weighing them up.
        self.g, smoothed = smooth_norms(
            self.g, self.opts.smooth_norms if self.dtype == "int8" else "never",
            lambda name: self.profile.tensors.get(self.onnx_name(name)))
        producers = self.g.producers()
        groups = [[smoothed_name(m) if smoothed_name(m) in producers else m for m in group]
                  for group in groups]
        for group in groups:
            self.wide |= set(group)
        self.wide_weights = weight_nodes(self.g, self.opts.int16_weights, self.keep)
        for group in groups:  # one scale a group, narrowed to what the accumulators hold
            self._wide_group(group, smoothed)
        for a, b in hypot_operands(self.g, self.wide):  # one scale for both parts
            if a in self.wide_bits:
                continue  # named: one group already (`wide.wide_group`)
            lo = min(self.real_range(a)[0], self.real_range(b)[0])
            hi = max(self.real_range(a)[1], self.real_range(b)[1])
            self.ranges[a] = self.ranges[b] = self.params_over(lo, hi, "int16")
        for name, (lo, hi) in smoothed.items():
            if name not in self.wide:  # an int16 one's are its group's
                self.ranges[name] = self.params_over(lo, hi)
        masks = additive_mask_ranges(self.g, self.real_range)
        for name, (lo, hi) in masks.items():
            self.ranges[name] = self.params_over(lo, hi)
        for name in self.g.inputs:
            self.values[name] = self.g.values[name]
            self.floating[name] = name
        for node in self.g.nodes:
            if node.name in self.absorbed:
                continue
            rule = keep_float if node.name in self.keep or integer_node(self.g, node) else \
                table_form if self.tabled(node) else RULES[OPS[node.op].quant]
            with warnings.catch_warnings():
                if self._final_output(node) in masks:
                    # A mask saturates by design: its requantization ratio may be clamped.
                    warnings.simplefilter("ignore", QuantizeWarning)
                rule(self, node)
        for name in self.g.outputs:
            self.float_input(name)
        if self.rounded_elsewhere:
            warnings.warn(QuantizeWarning(
                f"--weight-rounding {self.opts.weight_rounding}: {len(self.rounded_elsewhere)} "
                f"weight(s) were rounded there at other scales (other quantizer options, or "
                f"int16 weights) and take their nearest codes: "
                f"{listing(self.rounded_elsewhere)}"), stacklevel=2)
        if self.uncorrected:
            warnings.warn(QuantizeWarning(
                f"--bias-correction left {len(self.uncorrected)} node(s) uncorrected, whose "
                f"input a graph pass made (the profile has no means of it): "
                f"{listing(self.uncorrected)}"), stacklevel=2)
        return Graph(self.g.name, self.g.inputs, self.g.outputs, tuple(self.nodes),
                     dict(self.values), self.g.opset, dict(self.origin))

    def _wide_group(self, group: list[str], smoothed: dict[str, tuple[float, float]]) -> None:
        """The parameters of an int16 group (`quantizer.wide.wide_group`: values holding the
        same codes through views, Concats, MaxPools, ...): one scale over the union of its
        profiled ranges (a smoothed norm output's, `smoothed`: the profile's divided by the
        smoothing), its codes of the fewest bits any member's array readers' int32
        accumulators allow (`accumulator_bits`), so that every producer in the group
        requantizes into the codes every reader takes."""
        name = group[0]
        profiled = [m for m in group if self.onnx_name(m) in self.profile.tensors]
        ranges = [smoothed[m] for m in group if m in smoothed] + \
            [self.real_range(m) for m in profiled]
        ranges = ranges or [self.real_range(name)]
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        producers = self.g.producers()
        for member in group:  # a saturating function's bounds (`wide.within_bounds`)
            if member in producers:
                lo, hi = within_bounds(self.g, producers[member], lo, hi)
        inputs = [m for m in group if m in self.g.inputs]
        users = self.g.users()
        bits, narrowest = 16, name
        for member in group:
            # Readers with int16 weights share the accumulator with it: the two widths are
            # chosen jointly (`wide_weights.input_bits`), the others bound it alone.
            joint = [node for node in users.get(member, []) if node.name in self.wide_weights]
            found = accumulator_bits(self.g, member, max(-lo, hi), self.opts.per_channel,
                                     self.opts.schema == "power2", self.opts.bias_correction,
                                     skip={node.name for node in joint}, wide=self.wide)
            found = input_bits(self.g, member, joint, found, max(-lo, hi),
                               self.opts.per_channel, self.opts.schema == "power2",
                               fixed=bool(inputs))
            if found < bits:
                bits, narrowest = found, member
        where = f"int16 tensor {narrowest!r}" + ("" if narrowest == name else
                                                 f" (with {name!r})")
        if bits < 16 and inputs:
            raise QuantizeError(f"{where}: a model input ({inputs[0]!r}) is quantized by the "
                                f"host to all 16 bits, and its readers' weights leave "
                                f"only {bits} inside the int32 accumulator")
        if bits < MIN_ARRAY_BITS:
            raise QuantizeError(f"{where}: its readers' weights leave only "
                                f"{bits} bits of codes inside the int32 accumulator (at "
                                f"least {MIN_ARRAY_BITS} make int16 worth its second pass)")
        if bits < 16:
            warnings.warn(QuantizeWarning(
                f"{where}: {bits}-bit codes, so that its readers' int32 "
                f"accumulators cannot overflow"), stacklevel=3)
        params = self.params_over(lo, hi, "int16", bits)
        fixed = [producers[m] for m in group
                 if m in producers and OPS[producers[m].op].quant is Quant.FIXED_OUTPUT]
        if fixed:  # a Softmax's probabilities: its fixed steps, in codes of `bits` bits
            out = OPS[fixed[0].op].fixed_output(1.0, "int16", self.dtype, bits)
            params = QuantParams.per_tensor(out.scale, out.zero_point)
        for member in group:
            self.wide_bits[member] = bits
            self.ranges[member] = params

    # -- planning --

    def _plan_fusion(self, producers: dict[str, Node]) -> dict[str, Node]:
        """Producer node name → the clamp (Relu, Clip) folded into its requantization (its
        only reader)."""
        users = self.g.users()
        fused = {}
        for node in self.g.nodes:
            if OPS[node.op].quant is not Quant.CLAMP or node.name in self.keep:
                continue
            source = node.inputs[0]
            producer = producers.get(source)
            if (producer is None or producer.name in self.keep
                    or not (OPS[producer.op].quant and OPS[producer.op].quant.fuses_clamp)
                    or producer.name in fused or source in self.g.outputs
                    or len(users.get(source, [])) != 1):
                continue
            fused[producer.name] = node
        return fused

    def _profiled(self) -> list[str]:
        """The activations whose ranges come from the profile, in graph order."""
        needed: list[str] = []
        for node in self.g.nodes:
            if node.name in self.keep or node.name in self.absorbed or \
                    integer_node(self.g, node):
                continue
            for name in node.inputs:
                if name and not self.g.values[name].is_const and name in self.float_primary \
                        and is_float(self.g.type_of(name)):
                    needed.append(name)
            if OPS[node.op].quant.profiled_output:
                needed.append(self._final_output(node))
        return list(dict.fromkeys(needed))

    def check_profile(self) -> None:
        missing = [n for n in self._profiled()
                   if self.onnx_name(n) not in self.profile.tensors]
        if missing:
            where = f" ({self.profile.path})" if self.profile.path else ""
            raise QuantizeError(f"the profile{where} lacks tensor(s) {listing(missing, quote=True)}"
                                f" that quantizing "
                                f"graph {self.g.name!r} needs; profile this model again")

    # -- naming and values --

    def onnx_name(self, name: str) -> str:
        return self.g.origin.get(name, name)

    def _int_name(self, name: str) -> str:
        return f"{name}/q" if name in self.float_primary else name

    def _float_name(self, name: str) -> str:
        return name if name in self.float_primary else f"{name}/fp32"

    def _final_output(self, node: Node) -> str:
        clamp = self.fused.get(node.name)
        return clamp.outputs[0] if clamp is not None else node.outputs[0]

    def add_value(self, name: str, type_: Type, const: np.ndarray | None = None,
                  origin: str | None = None) -> str:
        if name in self.values:
            raise QuantizeError(f"internal: value {name!r} defined twice while quantizing")
        self.values[name] = Value(name, type_, const)
        if origin is not None:
            self.origin[name] = origin
        return name

    def const(self, name: str, array: np.ndarray, quant: QuantParams | None = None,
              origin: str | None = None) -> str:
        array = np.asarray(array)
        if name in self.values:
            return name
        return self.add_value(name, Type(str(array.dtype), array.shape, quant), array, origin)

    def copy_const(self, name: str) -> str:
        if name and name not in self.values:
            self.values[name] = self.g.values[name]
        return name

    def const_params(self, node: Node) -> list[np.ndarray | None]:
        """The values of the node's constant parameter inputs (all but the first; None where
        absent), as the row's detail functions take them."""
        return [self.g.values[n].const if n else None for n in node.inputs[1:]]

    def emit(self, op: str, name: str, inputs, outputs, attrs) -> None:
        self.nodes.append(Node(op, name, tuple(inputs), tuple(outputs), dict(attrs)))

    def activation(self, name: str, params: QuantParams, dtype: str | None = None) -> str:
        """Declare the integer value of fp32 activation `name` with `params` (and `dtype`, by
        default `dtype_of` it)."""
        shape = self.g.type_of(name).shape
        qname = self.add_value(self._int_name(name),
                               Type(dtype or self.dtype_of(name), shape, params),
                               origin=self.onnx_name(name))
        self.quantized[name] = qname
        return qname

    def real_range(self, name: str) -> tuple[float, float]:
        """The calibrated real range [lo, hi] of fp32 activation `name` (for `auto`: on the
        steps of its integer type, as its readers see it)."""
        origin = self.onnx_name(name)
        dtype = self.dtype_of(name)
        reader = self._reader(name) if self.opts.calibration == "auto" else None
        lo, hi = calibrate.tensor_range(
            self.profile.tensors[origin], self.opts.calibration, self.opts.percentile, origin,
            levels=RANGES[dtype][1] - RANGES[dtype][0], symmetric=self.symmetric(dtype),
            reader=reader)
        return self._saturating(name, lo, hi)

    def _saturating(self, name: str, lo: float, hi: float) -> tuple[float, float]:
        """The range of `name` where a saturating function (Sigmoid, Tanh, HardSigmoid) reads
        or writes it. Its input needs no codes where the function is flat to within half an
        output step (`calibrate.moving_interval`): the range is cut there, which only adds
        steps. A score the model outputs (through views) keeps its function's whole range,
        in and out: what a calibration set never scored high (a detector's rare class at its
        finest stride) must not be clipped where users threshold it."""
        producer = self._producer(name)
        if producer is not None and len(producer.inputs) == 1 and self._scores(name):
            bounds = calibrate.saturation(self._function(producer))
            if bounds is not None:
                return bounds[0][0], bounds[0][1]
        function = self._reader(name)
        readers = self._readers(name)
        if function is None or len(readers[0].inputs) != 1:
            return lo, hi
        output = readers[0].outputs[0]
        if len(readers) == 1 and self._scores(output):
            low, high = RANGES[self.dtype_of(output)]
            bounds = calibrate.saturation(function, high - low)
            if bounds is None:
                return lo, hi
            if self.dtype_of(name) == "int16":  # extended, never cut: its values stay whole
                return min(lo, bounds[1][0]), max(hi, bounds[1][1])
            return bounds[1]
        out = self.profile.tensors.get(self.onnx_name(output))
        if out is None or self.dtype_of(name) == "int16":
            return lo, hi  # 65,535 steps: little to gain, and its stored values stay whole
        # An int16 output too: its int8 input's rounding errs more than half an int8 step.
        moving = calibrate.moving_interval(function, (out.max - out.min) / 255)
        if moving is None or moving[0] >= hi or moving[1] <= lo:
            return lo, hi
        return max(lo, moving[0]), min(hi, moving[1])

    def _scores(self, name: str) -> bool:
        """Whether a one-input saturating table op writes `name` and the model outputs it,
        as it is or through views."""
        producer = self._producer(name)
        if producer is None or OPS[producer.op].quant is not Quant.LOOKUP or \
                len(producer.inputs) != 1 or producer.name in self.keep:
            return False
        while name not in self.g.outputs:
            readers = self._readers(name)
            if len(readers) != 1 or OPS[readers[0].op].view is None:
                return False
            name = readers[0].outputs[0]
        return True

    def _graph_maps(self) -> tuple[Graph, dict[str, list[Node]], dict[str, Node]]:
        if self._maps is None or self._maps[0] is not self.g:
            self._maps = (self.g, self.g.users(), self.g.producers())
        return self._maps

    def _readers(self, name: str) -> list[Node]:
        return self._graph_maps()[1].get(name, [])

    def _producer(self, name: str) -> Node | None:
        return self._graph_maps()[2].get(name)

    def _function(self, node: Node):
        op = OPS[node.op]
        attrs = op.bind(node.name, node.attrs)
        return lambda v: op.fp32(np.asarray(v, np.float32), **attrs)

    def symmetric(self, dtype: str) -> bool:
        """Whether activations of `dtype` get a symmetric range: by the options, and int16 ones
        always (their zero point 0 is what a wide REQUANT's or ADD's 8-bit offset holds)."""
        return self.opts.symmetric_activations or dtype == "int16"

    def _reader(self, name: str):
        """The elementwise function every reader of `name` applies to it, if they all apply
        the same one (a table op: Sigmoid, Tanh, HardSigmoid, ...); None otherwise, and for a
        model output, whose own error is what counts."""
        if name in self.g.outputs:
            return None
        readers = self._readers(name)
        if not readers or any(OPS[n.op].quant is not Quant.LOOKUP or n.inputs[0] != name
                              or n.name in self.keep for n in readers):
            return None
        first = readers[0]
        if any((n.op, n.inputs[1:], n.attrs) != (first.op, first.inputs[1:], first.attrs)
               for n in readers[1:]):
            return None
        op, consts = OPS[first.op], [self.g.values[n].const for n in first.inputs[1:]]
        if any(c is None or np.size(c) != 1 for c in consts):
            return None
        attrs = op.bind(first.name, first.attrs)
        return lambda v: op.fp32(np.asarray(v, np.float32), *consts, **attrs)

    def params_over(self, lo: float, hi: float, dtype: str | None = None,
                    bits: int | None = None) -> QuantParams:
        """Per-tensor parameters covering [lo, hi] by the options' scheme; int16 ones are
        symmetric (zero point 0, which the 8-bit out_offset fields of a wide REQUANT or ADD
        hold, and 32767 steps a side, or 2^(bits-1) - 1)."""
        dtype = dtype or self.dtype
        return calibrate.activation_params(lo, hi, dtype,
                                           self.symmetric(dtype),
                                           self.opts.schema == "power2", bits)

    def code_range(self, name: str) -> tuple[int, int]:
        """The codes fp32 activation `name` may take: its type's, or a b-bit int16 tensor's."""
        bits = self.wide_bits.get(name)
        if bits is None:
            return RANGES[self.dtype_of(name)]
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def dtype_of(self, name: str) -> str:
        """The integer type of fp32 activation `name`: int16 for a wide one (`quantizer.wide`),
        else the options' activation type."""
        return "int16" if name in self.wide else self.dtype

    def params(self, name: str) -> QuantParams:
        """The calibrated per-tensor parameters of fp32 activation `name`."""
        if name not in self.ranges:
            self.ranges[name] = self.params_over(*self.real_range(name), self.dtype_of(name))
        return self.ranges[name]

    def quant_of(self, name: str) -> QuantParams:
        """The parameters of integer value `name` of the int8 graph."""
        return self.values[name].type.quant

    def quant_input(self, name: str) -> str:
        """The integer value of activation `name`, quantizing its float value on first use."""
        if name in self.quantized:
            return self.quantized[name]
        params = self.params(name)
        source = self.floating[name]
        scale = self.const(f"{name}/q/scale", np.float32(params.scale[0]))
        zero = self.const(f"{name}/q/zero_point",
                          np.asarray(params.zero_point[0], self.dtype_of(name)))
        qname = self.activation(name, params)
        self.emit(QUANTIZE_LINEAR.name, f"{name}/{QUANTIZE_LINEAR.name}", (source, scale, zero),
                  (qname,), {})
        return qname

    def float_input(self, name: str) -> str:
        """The float value of activation `name`, dequantizing its integer value on first use
        (or, a model input's integers cast to float, the Cast: `cast`)."""
        cast = self.casts.pop(name, None)
        if cast is not None:
            fname = self.add_value(self._float_name(name), self.g.type_of(name),
                                   origin=self.onnx_name(name))
            self.emit(cast.op, cast.name, cast.inputs, (fname,), cast.attrs)
            self.floating[name] = fname
        if name in self.floating:
            return self.floating[name]
        qname = self.quantized[name]
        params = self.quant_of(qname)
        scale = self.const(f"{qname}/scale", np.float32(params.scale[0]))
        zero = self.const(f"{qname}/zero_point",
                          np.asarray(params.zero_point[0], self.values[qname].type.dtype))
        fname = self.add_value(self._float_name(name),
                               Type("float32", self.g.type_of(name).shape),
                               origin=self.onnx_name(name))
        self.emit(DEQUANTIZE_LINEAR.name, f"{name}/{DEQUANTIZE_LINEAR.name}",
                  (qname, scale, zero), (fname,), {})
        self.floating[name] = fname
        return fname

    def quant_const(self, name: str, params: QuantParams | None = None,
                    dtype: str | None = None) -> str:
        """A float constant used as an activation operand, quantized per tensor (by default
        over its own min and max) into `dtype` (by default the activations' type; int16 for
        an int16 Add's bias, symmetric)."""
        array = self.g.values[name].const
        dtype = dtype or self.dtype
        if params is None:
            params = calibrate.activation_params(float(array.min(initial=0.0)),
                                                 float(array.max(initial=0.0)), dtype,
                                                 self.symmetric(dtype),
                                                 self.opts.schema == "power2")
        qname, k = f"{name}/q", 1
        while qname in self.values and (self.values[qname].type.quant != params or
                                        self.values[qname].type.dtype != dtype):
            qname, k = f"{name}/q{k}", k + 1
        return self.const(qname, _quantize_array(array, params, dtype), params, name)

    def operand(self, name: str, dtype: str | None = None) -> str:
        """The integer value of an operand: an activation's, or a constant's in `dtype`."""
        return self.quant_const(name, dtype=dtype) if self.g.values[name].is_const else \
            self.quant_input(name)

    def quant_weight(self, name: str, axis: int | None, floor: np.ndarray | None = None,
                     where: str = "", bits: int = 8) -> str:
        """A constant weight as symmetric int8 (or `bits`-bit int16: `weight_codes`), per
        slice along `axis` (None: per tensor), each scale at least its `floor`
        (`weight_floor`): a slice raised to its floor is degenerate (near-zero weights), and
        is said in a warning that names `where`."""
        params, q, raised = self.weight_codes(name, axis, floor, bits)
        if raised:
            warnings.warn(QuantizeWarning(
                f"{where}: weight {name!r} has {_count(raised, len(params.scale))} whose "
                f"weights are negligible beside their bias or output range; their scales are "
                f"floored so the "
                f"bias fits int32 and the requantization its fixed-point range (their "
                f"weights quantize to 0, their outputs are the bias)"), stacklevel=2)
        key = (name, axis, params.scale, bits)
        if key in self.weights:
            return self.weights[key]
        if bits <= 8:  # int16 weights are not in a rounding file
            q = self._rounded(name, params.scale, axis, q)
        # The int8 weight keeps the initializer's name unless an fp32 node still reads the float
        # weight, or the same weight is quantized along another axis (or with other floors) for
        # another node.
        shared = name in self.fp32_consts or any(k[0] == name for k in self.weights)
        qname, k = (f"{name}/q{'' if axis is None else axis}" if shared else name), 1
        while qname in self.values:
            qname, k = f"{name}/q{'' if axis is None else axis}_{k}", k + 1
        self.weights[key] = self.const(qname, q, params, name)
        self.float_weights[qname] = self.g.values[name].const
        return qname

    def _rounded(self, name: str, scales: tuple[float, ...], axis: int | None,
                 nearest: np.ndarray) -> np.ndarray:
        """Weight `name`'s codes: the --weight-rounding file's for every output channel it
        rounded at the scale these options give it (each channel's codes were chosen on their
        own), the `nearest` codes for the others (a dead channel whose floor moved with its
        input's scale, say: its codes are 0 either way). A file that rounded none of them at
        these scales (other options) is said in one warning for all such weights."""
        found = self.rounding.get(name)
        if found is None:
            return nearest
        if found.digest != weight_digest(self.g.values[name].const):
            raise QuantizeError(f"--weight-rounding {self.opts.weight_rounding}: weight "
                                f"{name!r} was rounded for other values (another model, or "
                                f"another --equalize): run `ember round-weights` again")
        stored, given = np.asarray(found.scales), np.asarray(scales)
        if found.axis != axis or stored.shape != given.shape or \
                found.codes.shape != nearest.shape:
            self.rounded_elsewhere.append(name)
            return nearest
        same = stored == given
        if not same.any():
            self.rounded_elsewhere.append(name)
            return nearest
        if axis is None:
            return found.codes.astype(nearest.dtype)
        shape = [1] * nearest.ndim
        shape[axis] = len(same)
        return np.where(same.reshape(shape), found.codes, nearest).astype(nearest.dtype)

    def weight_codes(self, name: str, axis: int | None, floor: np.ndarray | None,
                     bits: int = 8) -> tuple[QuantParams, np.ndarray, list[int]]:
        """`quant_weight`'s parameters and codes, made without declaring them, and the slices
        raised to their floor: codes in [-(2^(bits-1) - 1), 2^(bits-1) - 1], int8 ones
        ([-127, 127] at 8 bits) or, for `bits` > 8, int16 (`QuantOptions.int16_weights`)."""
        power2 = self.opts.schema == "power2"
        qmax = (1 << (bits - 1)) - 1  # int8's WEIGHT_QMAX at 8 bits
        w = self.g.values[name].const.astype(np.float64)
        scales = calibrate.weight_scales(w, axis, power2, qmax)
        raised: list[int] = []
        if floor is not None:
            floor = np.broadcast_to(np.max(floor) if axis is None else floor, len(scales))
            raised = [i for i, (s, f) in enumerate(zip(scales, floor)) if s < f]
            if raised:
                scales = calibrate.weight_scales_floored(scales, floor, power2)
        q = numerics.quantize(w, scales, 0, -qmax, qmax, axis=axis, arithmetic=np.float64,
                              dtype="int8" if bits <= 8 else "int16")
        return QuantParams(scales, (0,) * len(scales), axis), q, raised

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
        return self.const(name, q.astype(np.int32), params)

    # -- outputs of requantizing nodes --

    def requant_output(self, node: Node) -> tuple[str, QuantParams, tuple[int, int]]:
        """Declare the node's (possibly clamp-fused) output: name, params and qclamp."""
        final = self._final_output(node)
        params = self.params(final)
        clamp = self.fused.get(node.name)
        qclamp = self.qclamp(clamp, params, final) if clamp is not None else \
            self.code_range(final)
        name = self.activation(final, params)
        return name, params, qclamp

    def qclamp(self, clamp: Node, params: QuantParams, final: str | None = None,
               table: bool = False) -> tuple[int, int]:
        """A clamp's real bounds (its row's `clamp_bounds`) as integer codes in `params` (of
        fp32 activation `final`'s type: an int16 one's bounds must be what a wide REQUANT
        clamps to, `numerics.wide_clamp`, as a ReLU's [0, max] is; any, with `table`, which
        a table form's entries hold)."""
        dtype = self.dtype if final is None else self.dtype_of(final)
        qmin, qmax = RANGES[self.dtype] if final is None else self.code_range(final)
        lo, hi = OPS[clamp.op].clamp_bounds(*self.const_params(clamp))
        # The nearest code to each bound: a clamp then errs by at most half a step.
        q_lo = qmin if lo is None else max(qmin, int(_quantize_array(lo, params, dtype)))
        q_hi = qmax if hi is None else min(qmax, int(_quantize_array(hi, params, dtype)))
        if dtype == "int16" and q_lo == qmin + 1 and params.zero_point[0] == 0:
            # A lower bound at the symmetric range's end (an LSTM's clip, which calibrated its
            # range): -(2^(b-1) - 1), one code above the type's own end. Clamping at the
            # type's end instead, which a wide REQUANT's high byte bounds, lets one code more
            # through, a step past the clip's bound.
            q_lo = qmin
        if dtype == "int16" and not table and \
                numerics.wide_clamp(q_lo >> 8, max(q_lo, q_hi) >> 8) != \
                (q_lo, max(q_lo, q_hi)):
            raise QuantizeError(f"int16 tensor {final!r}: {clamp.op} {clamp.name!r} clamps to "
                                f"codes [{q_lo}, {q_hi}], which a wide REQUANT cannot (it "
                                f"bounds the high byte: a ReLU's [0, max] it can)")
        return q_lo, max(q_lo, q_hi)

    def requant_attrs(self, out: str, qclamp, multipliers, shifts) -> dict:
        """The requantization attributes of a node writing integer value `out` (declared:
        its type gives the zero point and the output type, int16 for a wide one)."""
        kind = self.values[out].type
        return {"multiplier": tuple(int(m) for m in multipliers),
                "shift": tuple(int(s) for s in shifts), "out_zero_point": kind.quant.zero_point[0],
                "qclamp": tuple(int(q) for q in qclamp), "out_dtype": kind.dtype}

    def tabled(self, node: Node) -> bool:
        """Whether `node` is an Add, Sub, Max, Min, Mul or Div by a scalar constant, or a
        Relu or Clip, that maps one activation with int16 codes in or out (`table_form`; the
        table ops' own rules build their int16 tables). Not an Add or Sub from int16 codes to
        int16 codes without a fused clamp: a table's knots would round to output codes before
        it interpolates between them (two roundings, 1 to 5 dB), where the ADD of the constant
        (`add`, `numerics.wide_add`) rounds once."""
        if OPS[node.op].quant not in (Quant.ADD, Quant.MUL, Quant.DIVIDE, Quant.CLAMP):
            return False
        index = table_input(self.g, node)
        if index is None:
            return False
        wide_in, wide_out = node.inputs[index] in self.wide, self._final_output(node) in self.wide
        if wide_in and wide_out and OPS[node.op].lower in (Lower.ADD, Lower.SUB) and \
                node.name not in self.fused:
            return False
        return wide_in or wide_out

    def wide_table(self, node: Node, name: str, x: str, fp32, attrs, window: bool = True
                   ) -> tuple[np.ndarray, dict[str, Any]] | None:
        """The int16 table of table op `node` (its input `name`'s integer value `x`, its function
        `fp32` with `attrs`) when its input or output is int16 (`int8.wide_table`), and the
        attribute of an int16 input's window of finer knots, placed over the input's
        calibrated range by `int8.knot_window` (none when no window helps); else None. The
        output's own codes bound the entries (a b-bit tensor's)."""
        y = self._final_output(node)
        in_dtype, out_dtype = self.values[x].type.dtype, self.dtype_of(y)
        if "int16" not in (in_dtype, out_dtype):
            return None
        source, out_params = self.quant_of(x), self.params(y)
        form = (fp32, attrs, source.scale[0], source.zero_point[0])
        out = (out_params.scale[0], out_params.zero_point[0], out_dtype, self.code_range(y))
        knots = (0, 0)
        if in_dtype == "int16" and window:
            span = self._code_span(name, x)
            stats = self.profile.tensors.get(self.onnx_name(name))
            density = None if stats is None else code_density(
                stats.bin_edges, stats.hist, source.scale[0], source.zero_point[0], span)
            knots = knot_window(*form, *out, span=span, density=density)
        return (wide_table(*form, in_dtype, *out, knots=knots),
                {"knots": knots} if knots[0] else {})

    def _code_span(self, name: str, x: str) -> tuple[int, int]:
        """The codes of `name`'s integer value `x` that its calibrated range covers (all its
        type's when the profile has no range of it)."""
        dtype = self.values[x].type.dtype
        lo, hi = RANGES[dtype]
        if self.onnx_name(name) not in self.profile.tensors:
            return lo, hi
        quant = self.quant_of(x)
        codes = numerics.quantize(np.array(self.real_range(name), np.float64), quant.scale[0],
                                  quant.zero_point[0], lo, hi, dtype=dtype,
                                  arithmetic=np.float64)
        return int(codes[0]), int(codes[1])

    def rescale(self, name: str, x: str, params: QuantParams, reader: str) -> str:
        """A Rescale of integer value x (of activation `name`) to `params`, for node `reader`."""
        source = self.quant_of(x)
        where = f"node {reader!r}: rescale of {name!r}"
        m, s = ratio(source.scale[0] / params.scale[0], where)
        out = self.add_value(f"{name}/to_{reader}",
                             Type(self.dtype, self.values[x].type.shape, params),
                             origin=self.onnx_name(name))
        self.emit(RESCALE.name, f"{reader}/rescale_{name}", (x,), (out,),
                  {"x_zero_point": source.zero_point[0],
                   **self.requant_attrs(out, RANGES[self.dtype], (m,), (s,))})
        return out


# --- the rules: one per kind of the table's quant column ------------------------------------


def keep_float(r: _Rewriter, node: Node) -> None:
    """A node of keep_fp32: float inputs (dequantized where needed), float outputs."""
    inputs = [r.copy_const(n) if (not n or r.g.values[n].is_const) else r.float_input(n)
              for n in node.inputs]
    for out in node.outputs:
        r.add_value(out, r.g.type_of(out), origin=r.onnx_name(out))
        r.floating[out] = out
    r.emit(node.op, node.name, inputs, node.outputs, node.attrs)


def keep_params(r: _Rewriter, node: Node) -> None:
    """Data movement and max: the outputs keep the input's parameters; a real fill value (the
    row's `fill_input`, default 0) becomes its code."""
    x = r.quant_input(node.inputs[0])
    params = r.quant_of(x)
    inputs = [x] + [r.copy_const(n) for n in node.inputs[1:]]
    row = OPS[node.op]
    fill = row.fill_input(row.bind(node.name, node.attrs)) if row.fill_input else None
    if fill is not None:
        value = node.inputs[fill] if len(node.inputs) > fill and node.inputs[fill] else None
        real = 0.0 if value is None else float(np.asarray(r.g.values[value].const).item())
        inputs += [""] * (fill + 1 - len(inputs))
        inputs[fill] = r.const(f"{node.name}/{row.inputs[fill].rstrip('?')}",
                               _quantize_array(np.float32(real), params, r.dtype))
    # Data movement keeps the input's type too (a view of an int16 value is int16).
    outputs = [r.activation(out, params, r.values[x].type.dtype) for out in node.outputs]
    r.emit(node.op, node.name, inputs, outputs, node.attrs)


def gather(r: _Rewriter, node: Node) -> None:
    """Gather: rows of a constant table, its codes per tensor over the table's own range (so
    every row an index may pick is covered, seen in calibration or not), or of an activation
    in its own parameters; the output keeps them. The integer indices stay as they are."""
    data, indices = node.inputs
    x = r.quant_const(data) if r.g.values[data].is_const else r.quant_input(data)
    out = r.activation(node.outputs[0], r.quant_of(x))
    r.emit(node.op, node.name, (x, r.copy_const(indices)), (out,), node.attrs)


def cast(r: _Rewriter, node: Node) -> None:
    """A model input's integers cast to float: `quant_input` quantizes the integers themselves
    (a QuantizeLinear of them, the host's at the input); a reader kept in fp32 reads the Cast,
    emitted then (`float_input`)."""
    r.floating[node.outputs[0]] = node.inputs[0]
    r.casts[node.outputs[0]] = node


def clamp(r: _Rewriter, node: Node) -> None:
    """A Relu or Clip not fused into its producer: a clamp in the input's own parameters."""
    x = r.quant_input(node.inputs[0])
    params = r.quant_of(x)
    qclamp = r.qclamp(node, params)
    out = r.activation(node.outputs[0], params)
    r.emit(node.op, node.name, (x,), (out,), {"qclamp": qclamp})


def rescale_inputs(r: _Rewriter, node: Node) -> None:
    """Concat: every input rescaled to the output's profiled parameters."""
    out_params = r.params(node.outputs[0])
    inputs = []
    for name in node.inputs:
        if r.g.values[name].is_const:
            inputs.append(r.quant_const(name, out_params))
            continue
        x = r.quant_input(name)
        inputs.append(x if r.quant_of(x) == out_params
                      else r.rescale(name, x, out_params, node.name))
    out = r.activation(node.outputs[0], out_params)
    r.emit(node.op, node.name, inputs, (out,), node.attrs)


def lookup(r: _Rewriter, node: Node) -> None:
    """A 256-entry table of the fp32 reference at every input code, as an extra input; the
    constant inputs after the first (Pow's exponent) are bound into it and kept before it.
    With int16 codes in or out (`quantizer.wide`), an int16 table (`int8.wide_table`: the 256
    codes' int16 outputs, or 257 knots an int16 input interpolates between) and the output's
    type as `out_dtype`."""
    x = r.quant_input(node.inputs[0])
    source = r.quant_of(x)
    out_params = r.params(node.outputs[0])
    op = OPS[node.op]
    consts = [r.g.values[name].const for name in node.inputs[1:]]
    for name, value in zip(node.inputs[1:], consts):
        if np.size(value) != 1:
            raise QuantizeError(f"node {node.name!r} ({node.op}): its constant {name!r} of "
                                f"shape {list(np.shape(value))} is not one value, so no one "
                                "table maps the input; keep the node in fp32")

    def fp32(v, **attrs):
        return op.fp32(v, *consts, **attrs)

    attrs = op.bind(node.name, node.attrs)
    wide = r.wide_table(node, node.inputs[0], x, fp32, attrs)
    table = wide[0] if wide is not None else lookup_table(
        fp32, attrs, source.scale[0], source.zero_point[0], out_params.scale[0],
        out_params.zero_point[0], r.dtype)
    table_name = r.const(f"{node.name}/table", table)
    out = r.activation(node.outputs[0], out_params)
    r.emit(node.op, node.name, (x, *map(r.copy_const, node.inputs[1:]), table_name), (out,),
           node.attrs if wide is None else {**node.attrs, **wide[1],
                                            "out_dtype": r.dtype_of(node.outputs[0])})


def table_form(r: _Rewriter, node: Node) -> None:
    """An elementwise map of one activation that the vector unit runs as a LUT (an Add, Sub,
    Max, Min, Mul or Div by a scalar constant, with the clamp fused into it; a Relu or Clip)
    with int16 codes in or out (`_Rewriter.tabled`): a table op of its own fp32 form, its
    constants bound into an int16 table (`int8.wide_table`) as `lookup` builds one. The node
    keeps its inputs, the activation's integer value among its float constants, the table
    after them, and `table_of` names the activation's input (`int8.tabled`)."""
    index = table_input(r.g, node)
    op = OPS[node.op]
    x = r.quant_input(node.inputs[index])
    attrs = op.bind(node.name, node.attrs)
    consts = [None if i == index or not name else np.asarray(r.g.values[name].const, np.float32)
              for i, name in enumerate(node.inputs)]
    clamp = r.fused.get(node.name)

    def fp32(v):
        y = op.fp32(*[v if i == index else c for i, c in enumerate(consts)], **attrs)
        if clamp is None:
            return y
        row = OPS[clamp.op]
        bounds = [np.asarray(r.g.values[name].const, np.float32) if name else None
                  for name in clamp.inputs[1:]]
        return row.fp32(y, *bounds, **row.bind(clamp.name, clamp.attrs))

    table, knots = r.wide_table(node, node.inputs[index], x, fp32, {})
    final = r._final_output(node)
    out = r.activation(final, r.params(final))
    inputs = [x if i == index else r.copy_const(name) for i, name in enumerate(node.inputs)]
    # The fused clamp, in the table already, as codes for the QDQ export's fp32 form.
    fused = {} if clamp is None else \
        {"qclamp": r.qclamp(clamp, r.params(final), final, table=True)}
    r.emit(node.op, node.name, (*inputs, r.const(f"{node.name}/table", table)), (out,),
           {**node.attrs, **fused, **knots, "table_of": index, "out_dtype": r.dtype_of(final)})


def channel_lookup(r: _Rewriter, node: Node) -> None:
    """PRelu, ChannelMap: a 256-entry table of the fp32 reference per channel (one when the
    channels share one function: a scalar slope), each with that channel's constants, as an
    extra (C, 256) input; with int16 codes in or out, int16 tables as `lookup` builds one,
    (1, entries) or (C, entries): a table per channel is a lane's (LUT per_lane=1), without a
    window of finer knots (a LUT's window is one for all its lanes)."""
    x = r.quant_input(node.inputs[0])
    source = r.quant_of(x)
    out_params = r.params(node.outputs[0])
    functions = _channel_functions(r, node)
    wides = [r.wide_table(node, node.inputs[0], x, function, {}, window=len(functions) == 1)
             for function in functions]
    wide = None if wides[0] is None else (np.stack([w[0] for w in wides]), wides[0][1])
    tables = wide[0] if wide is not None else np.stack([
        lookup_table(function, {}, source.scale[0], source.zero_point[0],
                     out_params.scale[0], out_params.zero_point[0], r.dtype)
        for function in functions])
    table_name = r.const(f"{node.name}/tables", tables)
    out = r.activation(node.outputs[0], out_params)
    r.emit(node.op, node.name, (x, *map(r.copy_const, node.inputs[1:]), table_name), (out,),
           node.attrs if wide is None else {**node.attrs, **wide[1],
                                            "out_dtype": r.dtype_of(node.outputs[0])})


def _channel_functions(r: _Rewriter, node: Node) -> list[Callable]:
    """The fp32 function of each channel (axis 1) of a PRelu or ChannelMap, or the one every
    channel shares; a constant that varies along another axis is refused by name."""
    shape = r.g.type_of(node.inputs[0]).shape
    columns = []
    for slot, name in zip(OPS[node.op].inputs[1:], node.inputs[1:]):
        const = r.g.values[name].const
        column = channel_slopes(const, shape)
        if column is None:
            raise QuantizeError(f"node {node.name!r} ({node.op}): {slot} of shape "
                                f"{const.shape} varies along an axis other than the channels "
                                f"(axis 1); keep the node in fp32")
        columns.append(column)
    channels = max(len(c) for c in columns)
    columns = [np.broadcast_to(c, (channels,)).astype(np.float32) for c in columns]
    row = OPS[node.op]
    attrs = row.bind(node.name, node.attrs)
    return [lambda v, k=k: row.fp32(v, *(c[k] for c in columns), **attrs)
            for k in range(channels)]


def fixed_output(r: _Rewriter, node: Node) -> None:
    """Softmax, LogSoftmax: a table of the input scale; the output's type is the row's
    (`OpDef.fixed_output`), not the profile's."""
    x = r.quant_input(node.inputs[0])
    y = node.outputs[0]
    fixed = OPS[node.op].fixed_output(r.quant_of(x).scale[0], r.dtype_of(y),
                                      r.values[x].type.dtype, r.wide_bits.get(y, 16))
    out_params = QuantParams.per_tensor(fixed.scale, fixed.zero_point)
    table_name = r.const(f"{node.name}/table", fixed.table)
    out = r.activation(y, out_params)
    attrs = {**node.attrs, **fixed.attrs}
    if r.values[x].type.dtype != r.dtype_of(y):  # int16 on one side (`quantizer.wide`)
        attrs["out_dtype"] = r.dtype_of(y)
    r.emit(node.op, node.name, (x, table_name), (out,), attrs)


def normalize(r: _Rewriter, node: Node) -> None:
    """LayerNormalization over the last axis: the integer kernel's parameters (`int8.
    layer_norm_params`) as an int32 input, the output's type from the profile."""
    if any(node.outputs[1:]):
        raise QuantizeError(f"node {node.name!r} ({node.op}): its Mean/InvStdDev outputs have no "
                            "int8 form; keep the node in fp32")
    shape = r.g.type_of(node.inputs[0]).shape
    attrs = OPS[node.op].bind(node.name, node.attrs)
    if attrs["axis"] % len(shape) != len(shape) - 1:
        raise QuantizeError(f"node {node.name!r} ({node.op}): it normalizes axes "
                            f"{attrs['axis']}.. of {list(shape)}; the int8 form normalizes the "
                            "last axis only; keep the node in fp32")
    x = r.quant_input(node.inputs[0])
    out_params = r.params(node.outputs[0])
    scale = r.g.values[node.inputs[1]].const
    bias = r.copy_const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else \
        r.const(f"{node.name}/B", np.zeros(shape[-1], np.float32))
    table = layer_norm_params(scale, r.values[bias].const, attrs["epsilon"], shape[-1],
                              r.quant_of(x).scale[0], out_params.scale[0])
    table_name = r.const(f"{node.name}/params", table)
    out = r.activation(node.outputs[0], out_params)
    # gamma and beta stay (the QDQ export's fp32 form reads them); the kernel reads the table.
    r.emit(node.op, node.name, (x, r.copy_const(node.inputs[1]), bias, table_name), (out,),
           {**node.attrs, "out_zero_point": int(out_params.zero_point[0]),
            "out_dtype": r.dtype_of(node.outputs[0])})


def weight_floor(real_bias: np.ndarray | None, x_scale: float, out_scale: float,
                 bias_limit: float | np.ndarray = BIAS_CODE_LIMIT) -> np.ndarray:
    """The smallest weight scale, per output channel along the bias's last axis (or one), that
    keeps a linear node quantizable: its bias code within `bias_limit` (one, or one per
    channel) and its requantization ratio x_scale * s_w / out_scale at least the fixed-point
    range's low end."""
    floor = np.asarray(RATIO_MIN * out_scale / x_scale, np.float64)
    if real_bias is not None:
        floor = np.maximum(floor, _per_channel(np.abs(real_bias)) / (x_scale * bias_limit))
    return np.atleast_1d(floor)


def _per_channel(values: np.ndarray) -> np.ndarray:
    """The largest of `values` per channel along its last axis (a scalar stays one)."""
    return values.reshape(-1, values.shape[-1]).max(axis=0) if values.ndim else values


def _count(indices: list[int], total: int) -> str:
    """`3 of 32 slices (4, 9, 17)`, at most five listed."""
    shown = ", ".join(str(i) for i in indices[:5]) + (", ..." if len(indices) > 5 else "")
    return f"{len(indices)} of {total} slice{'s' if total > 1 else ''} ({shown})"


def linear(r: _Rewriter, node: Node) -> None:
    """Conv, Gemm, MatMul: int8 operands, int32 bias at s_x * s_w, per-channel requant.

    The constant operand is the weight, symmetric int8, per output channel (the row's
    `weight.out_axis`) unless per_channel is off; a node of `QuantOptions.int16_weights` has
    int16 weight codes of as many bits as its accumulators hold (`_wide_weight`). An
    activation operand's zero point is folded into the bias (`zero_point_fold`) when the other
    operand is constant; two activation operands keep both zero points.
    """
    where = f"node {node.name!r} ({node.op})"
    weight = OPS[node.op].weight
    attrs = OPS[node.op].bind(node.name, node.attrs)
    a_name, b_name = node.inputs[0], node.inputs[1]
    a_const = r.g.values[a_name].is_const
    b_const = r.g.values[b_name].is_const
    w_axis = None
    if b_const and r.opts.per_channel:
        w_axis = weight.out_axis(r.g.type_of(b_name).rank, attrs)
    out, out_params, qclamp = r.requant_output(node)
    alpha = float(attrs.get("alpha", 1.0))
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
    real_bias = (r.g.values[node.inputs[2]].const.astype(np.float64) * float(attrs.get("beta", 1.0))
                 if has_bias else None)
    if a_const:
        b = r.quant_input(b_name)
        a = r.quant_weight(a_name, None, weight_floor(real_bias, alpha * r.quant_of(b).scale[0],
                                                      out_params.scale[0]), where)
    else:
        a = r.quant_input(a_name)
        floor, bits = weight_floor(real_bias, alpha * r.quant_of(a).scale[0],
                                   out_params.scale[0]), 8
        if node.name in r.wide_weights:
            bits, floor = _wide_weight(r, node, attrs, a, w_axis, out_params.scale[0],
                                       real_bias)
        b = r.quant_weight(b_name, w_axis, floor, where, bits) if b_const else \
            r.quant_input(b_name)
    pa, pb = r.quant_of(a), r.quant_of(b)
    if r.opts.bias_correction and b_const and not a_const:
        correction = _weight_error_mean(r, node, attrs, a_name, b_name, b, where)
        if correction is not None:
            real_bias = (real_bias if has_bias else 0.0) - alpha * correction
    acc_scales = alpha * pa.scale[0] * np.asarray(pb.scale)
    multipliers, shifts = ratios(acc_scales / out_params.scale[0], where)
    new_attrs = {**node.attrs, **r.requant_attrs(out, qclamp, multipliers, shifts)}
    if weight.padded:
        new_attrs["x_zero_point"] = pa.zero_point[0]
    elif not (a_const or b_const):
        new_attrs["a_zero_point"] = pa.zero_point[0]
        new_attrs["b_zero_point"] = pb.zero_point[0]
    inputs = [a, b]
    bias = _bias_codes(weight, attrs, r.values[a], r.values[b], real_bias, acc_scales)
    if bias is not None:
        name = r.int32_bias(f"{node.name}/bias", bias, acc_scales, where)
        r.origin[name] = node.inputs[2] if has_bias else node.name
        inputs.append(name)
    r.emit(node.op, node.name, inputs, (out,), new_attrs)


def _bias_codes(weight, attrs: dict, a: Value, b: Value, real_bias: np.ndarray | None,
                acc_scales: np.ndarray) -> np.ndarray | None:
    """The int32 bias codes (as float64 integers) of a linear node with operands `a`, `b`
    (one constant): the real bias at the accumulator's scales, plus the folded zero point of
    the activation operand (`zero_point_fold`); None when there is neither."""
    activation = b.type.quant if a.is_const else a.type.quant
    bias = (zero_point_fold(weight, attrs, a, b) if activation.zero_point[0] else None)
    if real_bias is not None:
        q = np.rint(real_bias / acc_scales)
        bias = q if bias is None else q + bias
    return bias


def _wide_weight(r: _Rewriter, node: Node, attrs: dict, x: str, axis: int | None,
                 out_scale: float, real_bias: np.ndarray | None) -> tuple[int, np.ndarray]:
    """The bits of the int16 weight codes of `node` (`QuantOptions.int16_weights`), the most,
    up to 15, whose accumulators stay inside int32 for every code of its input `x`
    (`wide_weights.weight_bits`), tried with the very codes, floors, bias correction and
    folded zero point that `linear` then makes; and the weight scales' floors at those bits.

    An int8 layer's bias floor keeps each bias code within BIAS_CODE_LIMIT, far inside int32.
    Against int16 weights (and an int16 input) the accumulator's step s_x s_w is up to 2^14
    times finer, so that floor would coarsen every channel of a BatchNorm-folded layer (a
    PicoDet stem's 16 of 16, at 52 dB where its int16 codes hold 76): here a channel's bias
    may take half the room its products leave at those bits (`_bias_room`), never less than
    BIAS_CODE_LIMIT; and a width is taken only if it floors no channel that the fewest bits
    leave unfloored (a floored channel is coarser than its own bits would make it)."""
    weight, w_name = OPS[node.op].weight, node.inputs[1]
    px = r.quant_of(x)
    alpha = float(attrs.get("alpha", 1.0))
    means = _channel_means(r, node.inputs[0], f"node {node.name!r} ({node.op})") \
        if r.opts.bias_correction else None
    wide_input = r.values[x].type.dtype == "int16"  # four passes (`wide_weights`)
    code_range = r.code_range(node.inputs[0]) if wide_input else RANGES[r.values[x].type.dtype]
    x_scale = alpha * px.scale[0]
    ratio_floor = weight_floor(None, x_scale, out_scale)
    room = _bias_room(r, node, attrs, axis, ratio_floor, code_range, px.zero_point[0],
                      wide_input)

    @functools.lru_cache(maxsize=None)
    def floor_at(bits: int) -> np.ndarray:
        return ratio_floor if real_bias is None else \
            weight_floor(real_bias, x_scale, out_scale, room(bits))

    def candidate(bits: int) -> tuple[np.ndarray, np.ndarray | None]:
        params, codes, _ = r.weight_codes(w_name, axis, floor_at(bits), bits)
        real = real_bias
        if means is not None:
            w = r.g.values[w_name].const.astype(np.float64)
            correction = _error_mean(node, attrs, r.g.type_of(node.inputs[0]).shape, means,
                                     _weight_error(w, codes, params))
            if correction is not None:
                real = (0.0 if real is None else real) - alpha * correction
        acc_scales = alpha * px.scale[0] * np.asarray(params.scale)
        b = Value(w_name, Type("int16", codes.shape, params), codes)
        return codes, _bias_codes(weight, attrs, r.values[x], b, real, acc_scales)

    def floored(bits: int) -> set[int]:
        return set(r.weight_codes(w_name, axis, floor_at(bits), bits)[2])

    least = floored(MIN_WEIGHT_BITS)  # a dead channel's, floored at any width
    bits = weight_bits(node, attrs, code_range, px.zero_point[0], candidate, wide_input,
                       allowed=lambda bits: floored(bits) <= least)
    return bits, floor_at(bits)


def _bias_room(r: _Rewriter, node: Node, attrs: dict, axis: int | None, ratio_floor: np.ndarray,
               code_range: tuple[int, int], zero: int, wide_input: bool
               ) -> Callable[[int], np.ndarray]:
    """For each weight width b, the bias code each output channel may take beside its
    products: half of int32's room above a bound on the products, at least BIAS_CODE_LIMIT.

    The bound holds at the b-bit scales and at any coarser one (a floor only coarsens):
    X (sum |w| / s_w + c K) per channel, X the input codes' largest magnitude (an int16
    input's largest pass magnitude `wide_weights`), K its terms, c a code's rounding (1/2)
    and, against an int16 input's passes, the 254 that a negative weight code's pass
    magnitude may exceed its magnitude by (`numerics.pass_magnitude`). So products plus a
    bias at its floor stay inside int32, and `weight_bits` checks it exactly."""
    weight, w_name = OPS[node.op].weight, node.inputs[1]
    w = r.g.values[w_name].const.astype(np.float64)
    largest = largest_pass_magnitude(*code_range) if wide_input else \
        max(abs(code_range[0] - zero), abs(code_range[1] - zero))
    magnitude = weight.b_sum(np.abs(w), attrs)
    terms = weight.b_sum(np.ones_like(w), attrs)
    slack = 254.5 if wide_input else 0.5
    limit = float(RANGES["int32"][1])

    def room(bits: int) -> np.ndarray:
        params, _, _ = r.weight_codes(w_name, axis, ratio_floor, bits)
        scales = np.asarray(params.scale)
        if axis is not None:  # laid along the sums' channel axis (their last)
            scales = scales.reshape((1,) * (np.ndim(magnitude) - 1) + (-1,))
        products = _per_channel(largest * (magnitude / scales + slack * terms))
        return np.maximum((limit - products) / 2, BIAS_CODE_LIMIT)
    return room


def _channel_means(r: _Rewriter, x_name: str, where: str) -> np.ndarray | None:
    """The per-channel means of activation `x_name` from the profile (bias correction), or
    None when a graph pass made it (the profile has no means of it); raises when the profile
    has none at all."""
    stats = r.profile.tensors.get(r.onnx_name(x_name))
    means = stats.channel_means() if stats is not None else None
    if means is None and not any(t.channel_sum is not None for t in r.profile.tensors.values()):
        raise QuantizeError(f"{where}: --bias-correction needs the per-channel means of "
                            f"its input {r.onnx_name(x_name)!r}, which the profile lacks; "
                            f"profile with `ember quantize-profile --channel-means`")
    return means


def _weight_error(w: np.ndarray, codes: np.ndarray, params: QuantParams) -> np.ndarray:
    """W_q - W: the quantized weight's real values less the float ones."""
    scale = np.asarray(params.scale, np.float64)
    if params.axis is not None:
        scale = scale.reshape([-1 if i == params.axis else 1 for i in range(w.ndim)])
    return codes.astype(np.float64) * scale - w


def _weight_error_mean(r: _Rewriter, node: Node, attrs: dict, x_name: str, w_name: str,
                       qw_name: str, where: str) -> np.ndarray | None:
    """Bias correction (Nagel et al. 2019): the mean over the calibration data of what the int8
    weights add to each output channel, (W_int8 - W) contracted with the input's per-channel
    means from the profile; None (with a warning) where those means do not fit the weight."""
    if node.op not in (CONV.name, GEMM.name, MATMUL.name):
        return None  # (a ConvTranspose's weight contracts another axis: not corrected)
    means = _channel_means(r, x_name, where)
    if means is None:
        r.uncorrected.append(node.name)  # its input is a graph pass's: no means of it
        return None
    w = r.g.values[w_name].const.astype(np.float64)
    error = _weight_error(w, r.values[qw_name].const, r.quant_of(qw_name))
    correction = _error_mean(node, attrs, r.g.type_of(x_name).shape, means, error)
    if correction is None:
        warnings.warn(QuantizeWarning(f"{where}: no bias correction: its input's {len(means)} "
                                      f"channel means do not match its weight {w_name!r} of "
                                      f"shape {list(w.shape)}"), stacklevel=2)
    return correction


def _error_mean(node: Node, attrs: dict, x_shape, means: np.ndarray,
                error: np.ndarray) -> np.ndarray | None:
    """The weight error `error` (W_q - W) contracted with the input's channel `means` (a Conv's
    taps weighed by the share of outputs at which they read the input), per output channel;
    None when the means do not fit the weight."""
    if node.op == CONV.name:
        groups = int(attrs.get("group", 1))
        per_group = error.shape[1]
        if per_group * groups != len(means):
            return None
        grouped = means.reshape(groups, per_group)[np.arange(error.shape[0]) //
                                                    (error.shape[0] // groups)]
        # A tap reads the channel's mean where it falls inside the input, and the zero
        # padding elsewhere: weighted by the share of outputs where it falls inside.
        inside = _taps_inside(x_shape[2:], error.shape[2:], attrs)
        return np.einsum("ock,oc,k->o", error.reshape(*error.shape[:2], -1), grouped,
                         inside.reshape(-1))
    if error.ndim == 2:
        contract = 1 - OPS[node.op].weight.out_axis(2, attrs)
        if error.shape[contract] == len(means):
            return np.tensordot(means, error, axes=([0], [contract]))
    return None


def _taps_inside(spatial, kernel, attrs: dict) -> np.ndarray:
    """For each kernel tap, the share of a convolution's outputs at which it reads the input
    rather than its zero padding (one array over the kernel's shape)."""
    pads, out, strides, dilations = resolve_pads(spatial, kernel, attrs.get("strides"),
                                                 attrs.get("dilations"), attrs.get("pads"),
                                                 attrs.get("auto_pad", "NOTSET"))
    shares = []
    for axis, (size, taps) in enumerate(zip(spatial, kernel)):
        starts = np.arange(out[axis]) * strides[axis] - pads[axis]
        where = starts[:, None] + np.arange(taps)[None, :] * dilations[axis]
        shares.append(((where >= 0) & (where < size)).mean(axis=0))
    inside = shares[0]
    for share in shares[1:]:
        inside = np.multiply.outer(inside, share)
    return inside


def add(r: _Rewriter, node: Node) -> None:
    """Add/Sub: both inputs rescaled to 2^-20 of the larger input scale (TFLite's ADD); when
    one is int16, each operand's ratio to the output scale at one shift, the sum rounding once
    (`numerics.wide_add`). A constant operand (a bias the Add broadcasts) is int16 codes over
    its own range when the Add reads or writes int16 (`quantizer.wide`), so that it loses no
    more than the int16 operand it is added to; a scalar stays int8, one code holding it (to
    its scale's float32 rounding)."""
    where = f"node {node.name!r} ({node.op})"
    wide = _wide_operands(r, node)
    a, b = (r.operand(n, "int16" if wide and np.size(r.g.values[n].const) > 1 else None)
            for n in node.inputs[:2])
    pa, pb = r.quant_of(a), r.quant_of(b)
    out, out_params, qclamp = r.requant_output(node)
    if "int16" in (r.values[a].type.dtype, r.values[b].type.dtype):
        multipliers, shifts = add_ratios(pa.scale[0] / out_params.scale[0],
                                         pb.scale[0] / out_params.scale[0], where)
    else:
        larger = max(pa.scale[0], pb.scale[0])
        reals = (pa.scale[0] / larger, pb.scale[0] / larger,
                 larger / (2**numerics.ADD_LEFT_SHIFT * out_params.scale[0]))
        multipliers, shifts = ratios(reals, where)
    attrs = {**node.attrs, "a_zero_point": pa.zero_point[0], "b_zero_point": pb.zero_point[0],
             **r.requant_attrs(out, qclamp, multipliers, shifts)}
    r.emit(node.op, node.name, (a, b), (out,), attrs)


def _wide_operands(r: _Rewriter, node: Node) -> bool:
    """Whether a binary node's activation operands or its output are int16 (`quantizer.wide`):
    then its constant operand is int16 codes too, over its own range, so that it loses no
    more than the int16 values it meets."""
    return any(r.dtype_of(n) == "int16" for n in (*node.inputs[:2], r._final_output(node))
               if not r.g.values[n].is_const)


def hypot(r: _Rewriter, node: Node) -> None:
    """Hypot: both inputs in one scale (b rescaled to a's when they differ; a spectrum's
    real and imaginary parts, slices of one tensor, share theirs), the root of the squares'
    sum in Q8 requantized by s 2^-8 / s_out (`numerics.hypot`)."""
    where = f"node {node.name!r} ({node.op})"
    a, b = (r.operand(n) for n in node.inputs[:2])
    pa = r.quant_of(a)
    if r.quant_of(b) != pa:
        b = r.rescale(node.inputs[1], b, pa, node.name)
    out, out_params, qclamp = r.requant_output(node)
    m, s = ratio(pa.scale[0] / (2**numerics.HYPOT_FRACTION_BITS * out_params.scale[0]), where)
    attrs = {**node.attrs, "a_zero_point": pa.zero_point[0], "b_zero_point": pa.zero_point[0],
             **r.requant_attrs(out, qclamp, (0, 0, m), (0, 0, s))}
    r.emit(node.op, node.name, (a, b), (out,), attrs)


def norm_l2(r: _Rewriter, node: Node) -> None:
    """ReduceL2: the root of the centred codes' squares summed, in Q8, requantized by
    s_x 2^-8 / s_out (`numerics.reduce_rows`)."""
    where = f"node {node.name!r} ({node.op})"
    x = r.quant_input(node.inputs[0])
    px = r.quant_of(x)
    out, out_params, qclamp = r.requant_output(node)
    m, s = ratio(px.scale[0] / (2**numerics.HYPOT_FRACTION_BITS * out_params.scale[0]), where)
    axes = (r.copy_const(node.inputs[1]),) if len(node.inputs) > 1 and node.inputs[1] else ()
    r.emit(node.op, node.name, (x, *axes), (out,),
           {**node.attrs, "x_zero_point": px.zero_point[0],
            **r.requant_attrs(out, qclamp, (m,), (s,))})


def mul(r: _Rewriter, node: Node) -> None:
    """Mul: the product of the centred inputs, requantized by s_a s_b / s_out; a constant
    operand is int16 codes when the product reads or writes int16 (as `add`'s)."""
    where = f"node {node.name!r} ({node.op})"
    a, b = (r.operand(n, "int16" if _wide_operands(r, node) else None)
            for n in node.inputs[:2])
    pa, pb = r.quant_of(a), r.quant_of(b)
    out, out_params, qclamp = r.requant_output(node)
    m, s = ratio(pa.scale[0] * pb.scale[0] / out_params.scale[0], where)
    attrs = {**node.attrs, "a_zero_point": pa.zero_point[0], "b_zero_point": pb.zero_point[0],
             **r.requant_attrs(out, qclamp, (m,), (s,))}
    r.emit(node.op, node.name, (a, b), (out,), attrs)


def divide(r: _Rewriter, node: Node) -> None:
    """Div by an activation: a * (1 / b), the reciprocal a table of b's codes (the fp32
    Reciprocal at each), the product as Mul's. No profile holds 1 / b, so its parameters cover
    `reciprocal_range` of b's calibrated range; a divisor whose range holds 0 makes that range
    reach the reciprocal of one step of b, and a warning names it."""
    where = f"node {node.name!r} ({node.op})"
    a, b = (r.operand(n) for n in node.inputs[:2])
    pa, pb = r.quant_of(a), r.quant_of(b)
    divisor = node.inputs[1]
    lo, hi = ((float(r.g.values[divisor].const.min()), float(r.g.values[divisor].const.max()))
              if r.g.values[divisor].is_const else r.real_range(divisor))
    if lo <= 0.0 <= hi:
        warnings.warn(QuantizeWarning(
            f"{where}: divisor {divisor!r} ranges over [{lo:.4g}, {hi:.4g}], which holds 0: its "
            f"reciprocal is quantized up to 1 / {pb.scale[0]:.4g} (one step of the divisor), "
            f"coarsely; keep the node in fp32 if the accuracy suffers"), stacklevel=2)
    reciprocal = r.params_over(*reciprocal_range(lo, hi, pb.scale[0]))
    table = lookup_table(RECIPROCAL.fp32, {}, pb.scale[0], pb.zero_point[0],
                         reciprocal.scale[0], reciprocal.zero_point[0], r.dtype)
    # The table's entries are codes of the reciprocal: its type says in which parameters.
    table_name = r.const(f"{node.name}/reciprocal_table", table, reciprocal)
    out, out_params, qclamp = r.requant_output(node)
    m, s = ratio(pa.scale[0] * reciprocal.scale[0] / out_params.scale[0], where)
    attrs = {**node.attrs, "a_zero_point": pa.zero_point[0],
             "b_zero_point": reciprocal.zero_point[0],
             **r.requant_attrs(out, qclamp, (m,), (s,))}
    r.emit(node.op, node.name, (a, b, table_name), (out,), attrs)


def average(r: _Rewriter, node: Node) -> None:
    """AveragePool, GlobalAveragePool, ReduceMean: int32 window sums, one requant per window
    size (the row's `window_sizes`)."""
    where = f"node {node.name!r} ({node.op})"
    x = r.quant_input(node.inputs[0])
    px = r.quant_of(x)
    row = OPS[node.op]
    counts = row.window_sizes(r.g.type_of(node.inputs[0]).shape,
                              row.bind(node.name, node.attrs), *r.const_params(node))
    out, out_params, qclamp = r.requant_output(node)
    multipliers, shifts = ratios([px.scale[0] / (c * out_params.scale[0]) for c in counts],
                                 where)
    new_attrs = {**node.attrs, "x_zero_point": px.zero_point[0], "counts": tuple(counts),
                 **r.requant_attrs(out, qclamp, multipliers, shifts)}
    inputs = [x] + [r.copy_const(n) for n in node.inputs[1:]]
    r.emit(node.op, node.name, inputs, (out,), new_attrs)


# The rule of each kind an fp32 graph's operators have (RESCALE, QUANTIZE and DEQUANTIZE
# operators exist only in quantized graphs).
RULES = {
    Quant.KEEP_PARAMS: keep_params,
    Quant.CLAMP: clamp,
    Quant.RESCALE_INPUTS: rescale_inputs,
    Quant.LOOKUP: lookup,
    Quant.CHANNEL_LOOKUP: channel_lookup,
    Quant.FIXED_OUTPUT: fixed_output,
    Quant.NORMALIZE: normalize,
    Quant.LINEAR: linear,
    Quant.ADD: add,
    Quant.MUL: mul,
    Quant.DIVIDE: divide,
    Quant.AVERAGE: average,
    Quant.GATHER: gather,
    Quant.CAST: cast,
    Quant.HYPOT: hypot,
    Quant.NORM_L2: norm_l2,
}


# --- helpers ---------------------------------------------------------------------------------


def _quantize_array(array, params: QuantParams, dtype: str) -> np.ndarray:
    """A constant or a clamp's bound in per-tensor `params`, computed in float64."""
    return numerics.quantize(array, params.scale[0], params.zero_point[0], dtype=dtype,
                             arithmetic=np.float64)

