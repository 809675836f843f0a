"""Which activations are int16: the residual streams a LayerNorm reads, where int8 loses them.

A LayerNorm divides each row by its own spread, so every channel counts alike however small.
A transformer's residual stream often carries a few channels a hundred times larger than the
rest (BERT's outlier dimensions): an int8 step fitted to those leaves the others a step or
less, and the LayerNorm's output loses them. The quantizer measures it on the profile: when the
median |x| of a LayerNorm's input is under `MIN_STEPS` int8 steps of its calibrated range, the
input is int16 (256 times finer). Only an Add's output read by nothing but the LayerNorm, its
operands whole tensors of its shape, qualifies: the vector unit's ADD writes it as two byte
planes and LAYERNORM reads them
(`numerics.split_wide`). The projection added into that stream (an attention output's or a
feed-forward's Gemm, through views) carries the same outlier channels, so it is measured the
same way and, when int8 loses it too, requantized to int16 (REQUANT wide) for the ADD to read.
The previous block's LayerNorm output added into the stream is measured alike (`norm_copies`).
So are a spectrum's two parts, the Convs or Gemms whose outputs a Hypot reads: int16 in one
scale for the pair (`hypot_operands`), the magnitude's ADD reading both planes of each.
Every other value stays 8-bit, unless named: `QuantOptions.int16_tensors` makes a Conv's,
ConvTranspose's, Gemm's or MatMul's output, by a constant weight or of two activations
(REQUANT wide=1), an Add's or Sub's (ADD wide=1: a residual stream, an LSTM step's gates, its
cell state), a table op's (Sigmoid, HardSwish, ...: LUT wide=1, its 256 entries int16 codes),
an AveragePool's or GlobalAveragePool's (AVGPOOL wide=1), a Mul of two activations' (MUL
wide=1: a squeeze-and-excitation block's product), a Hypot's (ADD op hypot, wide=1: a
spectrum's magnitude), a LayerNorm's (LAYERNORM out_wide,
smoothed as an int8 one would be: `smooth_norms`, the name then `smoothed_name`'s) or a
Softmax's along the last axis (SOFTMAX out_wide: probabilities in steps of 2^-15, coarser
where an accumulator narrows them; LogSoftmax stays 8-bit) int16 for
readers that are Convs, ConvTransposes, Gemms or MatMuls by constant weights, which stream its
two planes through the array (COMPUTE shift), MatMuls of two activations, which stream or
PRELOAD its planes (attention's Q, K, V or context: `numerics.activation_passes`, the codes
narrowed to the bits the accumulator holds with the other operand's, `product_bits`),
LayerNorms and Softmaxes along the last axis of a tensor's rows in order, its own or a
Reshape's (LAYERNORM, SOFTMAX wide: a Softmax's exp of an int16 distance is a table entry for
its high byte times one for its low byte, `numerics.wide_exps`), Adds and Subs, which read
both planes of an operand that is whole, a slice of another tensor or broadcast over the
other (a value per channel, pixel or image; a constant bias is then int16 codes too), table
ops, which
interpolate between 257 knots by the low byte, or a window of finer ones where the function
bends (LUT in_wide=1, zoom, `numerics.interpolate`, `int8.knot_window`), into int8 or int16
codes, averages, which sum whole int16 codes (AVGPOOL in_wide=1), and Muls of two
activations, one broadcast as a gate or not (MUL a_wide, b_wide: `numerics.mul` multiplies
the whole codes) (`array_values`). The
values that hold the same codes, through views, Slices, Splits, Transposes, Concats, MaxPools
(MAXPOOL wide=1, a compare of whole values: `numerics.window_max`), nearest Resizes and edge,
reflect or wrap Pads (their borders copies of input rows: a speech model's framed signal), are
one group (`wide_group`): int16 together, in one scale over their ranges, as the int8 path
gives a Concat's inputs one by Rescales (here each producer requantizes into it, and a copy
moves each plane). A group's codes are narrowed to the bits its array readers' int32
accumulators allow (`accumulator_bits`). A group a saturating function writes (a Sigmoid's
scores) spans the function's bounds where they are near its calibrated range
(`within_bounds`): int16 has the bits to keep what the calibration data never reached.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Callable

import numpy as np

from compiler.graph.ir import Graph, Node
from compiler.graph.ops import (ADD, HYPOT, LAYER_NORMALIZATION, MUL, OPS, SOFTMAX, SUB, Lower,
                                Quant, ViewKind, run_fp32)
from profiler.format import TensorStats
from quantizer.calibrate import abs_histogram, weight_scales
from quantizer.errors import QuantizeError
from quantizer.requant import BIAS_CODE_LIMIT
from simulator import numerics

MODES = ("auto", "never", "always")
# Fewer int8 steps than this under the median |x|: the value is int16.
MIN_STEPS = 8


def wide_values(graph: Graph, mode: str, stats_of: Callable[[str], TensorStats],
                range_of: Callable[[str], tuple[float, float]],
                keep: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """The fp32 activations to quantize as int16 under `mode`: "never", "always" (every
    qualifying value) or "auto" (those the profile shows int8 loses); none that a node kept
    in fp32 (`keep`) writes or reads directly (a rule from when host segments took 8-bit
    codes only; they take int16 bindings since)."""
    if mode == "never":
        return set()
    producers, users = graph.producers(), graph.users()

    def loses(name: str) -> bool:
        return mode == "always" or int8_steps_under_median(stats_of(name),
                                                           *range_of(name)) < MIN_STEPS

    def only_norms(name: str) -> bool:
        readers = users.get(name, [])
        return bool(readers) and name not in graph.outputs and \
            all(reader.op == LAYER_NORMALIZATION.name for reader in readers)

    chosen = set()
    for node in graph.nodes:
        if node.op != LAYER_NORMALIZATION.name:
            continue
        x = node.inputs[0]
        producer = producers.get(x)
        if producer is None or producer.op != ADD.name or not only_norms(x) or \
                not all(_whole(graph, producers, name, graph.type_of(x).shape)
                        for name in producer.inputs) or not loses(x):
            continue
        chosen.add(x)
        for operand in producer.inputs:
            projection = _projection(graph, producers, users, operand)
            if projection is not None and loses(projection.outputs[0]):
                chosen.add(projection.outputs[0])
            norm = producers.get(operand)
            if norm is not None and norm.op == LAYER_NORMALIZATION.name and \
                    operand not in graph.outputs and loses(operand):
                chosen.add(operand)  # the previous block's output, the stream carried on
    for node in graph.nodes:  # a spectrum's two parts, into its magnitude
        if node.op != HYPOT.name:
            continue
        projections = [_projection(graph, producers, users, operand)
                       for operand in node.inputs[:2]]
        if all(p is not None for p in projections) and \
                any(loses(p.outputs[0]) for p in projections):
            chosen.update(p.outputs[0] for p in projections)
    return {name for name in chosen
            if (name not in producers or producers[name].name not in keep)
            and not any(reader.name in keep for reader in users.get(name, []))}


def hypot_operands(graph: Graph, wide: set[str]) -> list[tuple[str, str]]:
    """The pairs of int16 projections a Hypot reads (through views): they share one scale,
    the integer kernel's (`numerics.hypot` squares codes of one scale)."""
    producers, users = graph.producers(), graph.users()
    pairs = []
    for node in graph.nodes:
        if node.op == HYPOT.name:
            found = [_projection(graph, producers, users, operand)
                     for operand in node.inputs[:2]]
            if all(p is not None and p.outputs[0] in wide for p in found):
                pairs.append((found[0].outputs[0], found[1].outputs[0]))
    return pairs


def norm_copies(graph: Graph, wide: set[str]) -> tuple[Graph, set[str]]:
    """`graph` with each int16 LayerNorm output that other nodes read too computed twice: an
    int16 copy (`<name>/wide`, the same node's parameters) for the residual Adds, and the
    original, 8-bit unless named int16 too, for the rest (the array's Gemms, which its
    smoothing may then scale: `quantizer.smooth`). One more LAYERNORM pass costs less than the
    residual stream's precision that an 8-bit operand loses. Returns the graph and the int16
    set with the copies' names in place of the originals'."""
    users = graph.users()
    copies = {}
    for node in graph.nodes:
        y = node.outputs[0] if node.op == LAYER_NORMALIZATION.name else None
        if y in wide and any(reader.op != ADD.name or reader.outputs[0] not in wide
                             for reader in users[y]):
            copies[y] = f"{y}/wide"
    if not copies:
        return graph, wide
    nodes, values, origin = [], dict(graph.values), dict(graph.origin)
    for node in graph.nodes:
        if node.op == ADD.name and node.outputs[0] in wide:
            node = dataclasses.replace(node, inputs=tuple(copies.get(name, name)
                                                          for name in node.inputs))
        nodes.append(node)
        copy = copies.get(node.outputs[0]) if node.op == LAYER_NORMALIZATION.name else None
        if copy is not None:
            nodes.append(dataclasses.replace(node, name=f"{node.name}/wide",
                                             outputs=(copy,)))
            values[copy] = dataclasses.replace(graph.values[node.outputs[0]], name=copy)
            origin[copy] = graph.origin.get(node.outputs[0], node.outputs[0])
    return (dataclasses.replace(graph, nodes=tuple(nodes), values=values, origin=origin),
            (wide - set(copies)) | set(copies.values()))


def _whole(graph: Graph, producers: dict, name: str, shape: tuple[int, ...]) -> bool:
    """Whether operand `name` of a residual Add is of the sum's shape and its own values in
    their order (through Reshapes at most): the vector unit adds int16 planes over whole
    tensors, not over a Transpose's or a Slice's strided view."""
    if graph.type_of(name).shape != shape:
        return False
    while name in producers and OPS[producers[name].op].view is ViewKind.RESHAPE:
        name = producers[name].inputs[0]
    return name not in producers or OPS[producers[name].op].view is None


def _projection(graph: Graph, producers: dict, users: dict, name: str) -> Node | None:
    """The Gemm, MatMul or Conv by a constant weight that computes `name` through reshaping
    views, each value on the way read once; None if there is none."""
    while len(users.get(name, [])) == 1 and name not in graph.outputs and name in producers:
        node = producers[name]
        row = OPS[node.op]
        if row.view is ViewKind.RESHAPE:
            name = node.inputs[0]
            continue
        weight = node.inputs[1] if len(node.inputs) > 1 else ""
        if row.lower in (Lower.GEMM, Lower.MATMUL, Lower.CONV) and weight and \
                graph.values[weight].is_const:
            return node
        return None
    return None


def int8_steps_under_median(stats: TensorStats, lo: float, hi: float) -> float:
    """How many int8 steps of the range [lo, hi] the median |x| of the profile's histogram
    spans."""
    counts, width = abs_histogram(stats)
    if counts.sum() == 0 or hi <= lo:
        return float("inf")
    median = (int(np.searchsorted(np.cumsum(counts), counts.sum() / 2)) + 0.5) * width
    return median / ((max(hi, 0.0) - min(lo, 0.0)) / 255)


# The array reads an int16 value as two passes of int8 planes (`numerics.split_wide`); a
# ConvTranspose is one convolution per output phase.
_ARRAY = (Lower.CONV, Lower.CONV_TRANSPOSE, Lower.GEMM, Lower.MATMUL)
# The lowerings whose outputs hold their inputs' codes unchanged, in their scale and type:
# views, copies (Concat, a Transpose, a nearest Resize or an edge, reflect or wrap Pad: identity
# tables over each plane) and a max (MAXPOOL wide, `numerics.window_max`). An int16 value and
# the values it flows into or from through them are one group (`wide_group`): int16 all, in
# one scale.
_MOVES = (Lower.VIEW, Lower.SLICE, Lower.SPLIT, Lower.TRANSPOSE, Lower.CONCAT, Lower.MAX_POOL,
          Lower.GLOBAL_MAX_POOL, Lower.RESIZE, Lower.PAD)
# The averages the vector unit runs over int16 codes (AVGPOOL in_wide, wide): window sums of
# whole values, requantized once.
_AVERAGES = (Lower.AVERAGE_POOL, Lower.GLOBAL_AVERAGE_POOL)
# An int16 window sums at most this many codes: |sum| <= 2^31, whose product with a Q31
# multiplier stays inside int64 (`numerics.rescale`).
MAX_WIDE_WINDOW = 1 << 16
# A b-bit int16 tensor is clamped by its producer's wide REQUANT, whose 8-bit fields bound the
# high byte (`numerics.wide_clamp`): b >= 9. Fewer bits would be int8's precision or less.
MIN_ARRAY_BITS = 9


def moves(graph: Graph, node: Node) -> bool:
    """Whether `node` carries its inputs' codes to its outputs unchanged (`_MOVES`; a Resize
    when nearest: a linear one weighs neighbours by ADDs, which read int16 over whole tensors
    only; a Pad when it copies input rows into its border, edge, reflect or wrap: a constant
    one's border is the LOAD's one pad code, a byte)."""
    row = OPS[node.op]
    if row.lower not in _MOVES:
        return False
    mode = row.bind(node.name, node.attrs).get("mode")
    return row.lower is Lower.RESIZE and mode == "nearest" or \
        row.lower is Lower.PAD and mode != "constant" or \
        row.lower not in (Lower.RESIZE, Lower.PAD)


def moved_inputs(node: Node) -> tuple[str, ...]:
    """The inputs whose codes a moving node (`moves`) carries: all of a Concat's, else the
    first (the others are constant parameters: shapes, starts, scales)."""
    return tuple(node.inputs) if OPS[node.op].lower is Lower.CONCAT else node.inputs[:1]


def wide_group(graph: Graph, name: str) -> list[str]:
    """Activation `name` and every value it reaches through moving nodes (`moves`), either
    way: into their outputs from their moved inputs, and from a Concat's output or input to
    its other inputs. They hold the same codes, so they are int16 together and share one
    scale, as the int8 path's Concat rescales its inputs to one (here none is rescaled: each
    value's producer writes the group's scale). A Hypot's two operands are one group too:
    its kernel squares codes of one scale (a spectrum's parts, as `hypot_operands` pairs
    them). In graph order of discovery, `name` first."""
    producers, users = graph.producers(), graph.users()
    group, todo = [name], [name]
    while todo:
        value = todo.pop()
        linked: list[str] = []
        producer = producers.get(value)
        if producer is not None and moves(graph, producer):
            linked += [*moved_inputs(producer), *producer.outputs]
        for reader in users.get(value, []):
            if moves(graph, reader) and value in moved_inputs(reader):
                linked += [*moved_inputs(reader), *reader.outputs]
            elif OPS[reader.op] is HYPOT and value in reader.inputs[:2]:
                linked += list(reader.inputs[:2])  # squared in one scale (`numerics.hypot`)
        for other in linked:
            if other and other not in group:
                group.append(other)
                todo.append(other)
    return group


def array_values(graph: Graph, names, keep: set[str], fused: dict[str, Node]
                 ) -> list[list[str]]:
    """The activations `names` (`QuantOptions.int16_tensors`) checked, each with its group
    (`wide_group`: the values it reaches through views, Concats, Transposes, MaxPools and
    nearest Resizes, which carry its codes unchanged), as the list of the groups. Each value
    of a group that no moving node makes is a model input (the host writes its two planes;
    likewise it reads a model output's) or made by a Conv, ConvTranspose, Gemm or MatMul by a
    constant weight (or the Relu fused into its requantization: `fused`, producer name ->
    clamp), by an Add or Sub (`_vector_add`), by a table op (`_table`), by an AveragePool or
    GlobalAveragePool or by a Mul of two activations (`_writes`). Every reader that is no
    moving node of the group is such a Conv, ConvTranspose, Gemm or MatMul as its first input,
    an Add or Sub (`_vector_add`), a table op, an AveragePool or GlobalAveragePool or a Mul
    of two activations (`_activation_product`) (`_check_readers`), or a node kept in fp32
    (a host segment reads and writes both planes); a Concat's inputs are activations. Raises
    QuantizeError naming the first value that is not (and the named tensor, when it was
    reached through its group)."""
    producers, users = graph.producers(), graph.users()
    groups: list[list[str]] = []
    for name in names:
        value = graph.values.get(name)
        if value is None or value.is_const or \
                (name in graph.inputs and not value.type.dtype.startswith("float")):
            raise QuantizeError(f"int16 tensor {name!r}: not an activation of the model "
                                f"(a model input or a node's output)")
        if any(name in group for group in groups):
            continue
        group = wide_group(graph, name)
        for member in group:
            where = f"int16 tensor {member!r}" + ("" if member == name else
                                                  f" (with {name!r}, which it flows into or "
                                                  f"from unchanged)")
            value = graph.values[member]
            if value.is_const:
                raise QuantizeError(f"{where}: a constant; a Concat of int16 values joins "
                                    f"activations only")
            if member not in graph.inputs:
                _check_writer(graph, producers, producers[member], member, where, keep, fused)
            _check_readers(graph, producers, users, member, keep, where)
        groups.append(group)
    return groups


def _check_writer(graph: Graph, producers: dict[str, Node], producer: Node, name: str,
                  where: str, keep: set[str], fused: dict[str, Node]) -> None:
    """That `producer` may write int16 value `name`: a moving node of its group, or
    `_writes`."""
    if producer.name in keep or moves(graph, producer):
        return  # kept in fp32: the host quantizes its output into both planes
    clamp = None
    if OPS[producer.op].quant is Quant.CLAMP and producer.inputs[0] in producers and \
            fused.get(producers[producer.inputs[0]].name) is producer:
        clamp, producer = producer, producers[producer.inputs[0]]
    if clamp is None and producer.name in fused:
        raise QuantizeError(f"{where}: its {fused[producer.name].op} is fused "
                            f"into {producer.name!r}; name the {fused[producer.name].op}'s "
                            f"output {fused[producer.name].outputs[0]!r}")
    if _table(graph, producer) is False:
        raise QuantizeError(f"{where}: made by {producer.op} "
                            f"{producer.name!r} with a table per channel of a value that is "
                            f"not a map [N, C, H, W]; only one table writes int16 there")
    if not _writes(graph, producers, producer) or producer.name in keep:
        raise QuantizeError(f"{where}: made by {producer.op} "
                            f"{producer.name!r}; only a Conv, ConvTranspose, Gemm or MatMul "
                            f"by a constant weight (a Relu fused into it) or of two "
                            f"activations, an Add or Sub of "
                            f"two activations (one broadcast per channel, pixel or image) or "
                            f"of one and a constant, a Mul of two activations, a Hypot, "
                            f"a LayerNorm "
                            f"or Softmax (not into a Concat), a table op "
                            f"(Sigmoid, "
                            f"HardSwish, ..., and an Add or Mul by a scalar), an AveragePool "
                            f"or GlobalAveragePool, or a view, Concat, Transpose, MaxPool, "
                            f"nearest Resize or edge, reflect or wrap Pad of int16 values "
                            f"writes int16")


def _writes(graph: Graph, producers: dict[str, Node], node: Node) -> bool:
    """Whether `node` requantizes into int16 codes: an array op by a constant weight or a
    MatMul of two activations (REQUANT wide), an Add or Sub (`_vector_add`: ADD wide), a table
    op (LUT wide), an average (AVGPOOL wide), a product of two activations (MUL wide) or a
    magnitude (ADD op hypot, wide: the root of the squares' exact sum, requantized once)."""
    return bool(_by_constant(graph, node) or activation_matmul(graph, node)
                or _vector_add(graph, node) or _table(graph, node) or OPS[node.op] is HYPOT
                or OPS[node.op].lower in _AVERAGES or _activation_product(graph, node)
                or _norm_writes(graph, node))


def _check_readers(graph: Graph, producers: dict[str, Node], users: dict[str, list[Node]],
                   name: str, keep: set[str], where: str | None = None) -> None:
    where = where or f"int16 tensor {name!r}"
    readers = users.get(name, [])
    for reader in readers:
        if reader.name in keep:
            continue  # kept in fp32: the host reads both planes (a segment's int16 binding)
        if moves(graph, reader) and name in moved_inputs(reader):
            continue  # its outputs are of the group, checked in turn
        on_array = _by_constant(graph, reader) and reader.inputs[0] == name and \
            name not in reader.inputs[1:]
        table = _table(graph, reader)
        if table and reader.inputs[table_input(graph, reader)] != name:
            table = None
        if table is False:
            raise QuantizeError(f"{where}: read by {reader.op} "
                                f"{reader.name!r} with a table per channel of a value that is "
                                f"not a map [N, C, H, W]; only one table reads int16 there")
        average = OPS[reader.op].lower in _AVERAGES and reader.inputs[0] == name
        if average and _window(graph, reader) > MAX_WIDE_WINDOW:
            raise QuantizeError(f"{where}: read by {reader.op} {reader.name!r}, whose "
                                f"windows of {_window(graph, reader)} codes may sum past "
                                f"int32 (at most {MAX_WIDE_WINDOW} int16 codes)")
        norm = _row_op(graph, reader) and reader.inputs[0] == name and \
            _rows_in_order(graph, producers, name)
        magnitude = OPS[reader.op] is HYPOT  # its operands one group (`wide_group`)
        if not (on_array or activation_matmul(graph, reader) or _vector_add(graph, reader)
                or table or average or norm or magnitude or _activation_product(graph, reader)):
            linear = " (a linear Resize: only a nearest one copies int16)" \
                if OPS[reader.op].lower is Lower.RESIZE else ""
            raise QuantizeError(f"{where}: read by {reader.op} "
                                f"{reader.name!r}{linear}; only Convs, ConvTransposes, Gemms "
                                f"and MatMuls by a constant weight or of two activations (on "
                                f"the array), Adds and "
                                f"Subs of two activations or of one and a constant, Muls of "
                                f"two activations (one broadcast per channel, pixel or image), "
                                f"LayerNorms and Softmaxes along the last axis (of a tensor's "
                                f"rows in order: its own, or a Reshape's), Hypots (both "
                                f"operands int16, in one scale), "
                                f"table ops (Sigmoid, "
                                f"HardSwish, ..., and Adds or Muls by a scalar), AveragePools and "
                                f"GlobalAveragePools, and views, Concats, Transposes, "
                                f"MaxPools, nearest Resizes and edge, reflect or wrap Pads "
                                f"(int16 all, in one scale) read int16")
    # An output: the host reads it. A part no node reads (a Split's unused gate) is a view
    # of its group's codes: nothing to check.
    if not readers and name not in graph.outputs and \
            not (name in producers and moves(graph, producers[name])):
        raise QuantizeError(f"{where}: read by no node")


def _window(graph: Graph, node: Node) -> int:
    """The most codes one window of an average sums."""
    row = OPS[node.op]
    attrs = row.bind(node.name, node.attrs)
    if row.lower is Lower.GLOBAL_AVERAGE_POOL:
        return int(np.prod(graph.type_of(node.inputs[0]).shape[2:]))
    return int(np.prod(attrs["kernel_shape"]))


def _vector_add(graph: Graph, node: Node) -> bool:
    """An Add or Sub the vector unit's ADD reads and writes int16 codes of (a_wide, b_wide,
    wide; `numerics.add`): of an activation of its output's shape and either another
    activation, of that shape too or broadcast over it as ADD reads one (`_broadcasts`), or a
    constant that broadcasts to it (a bias, int16 codes when the Add is int16:
    `quantize.add`). Either activation may be a view of another tensor (an LSTM step's slice
    of the whole sequence's input projection): ADD reads both planes of a View. Neither is a
    model input. An Add of a scalar constant is a table op (`table_input`)."""
    if node.op not in (ADD.name, SUB.name) or len(node.inputs) != 2 or \
            not all(node.inputs) or table_input(graph, node) is not None:
        return False
    shape = graph.type_of(node.outputs[0]).shape
    whole = [i for i, name in enumerate(node.inputs)
             if not graph.values[name].is_const and graph.type_of(name).shape == shape]
    if not whole or any(name in graph.inputs for name in node.inputs):
        return False
    other = graph.values[node.inputs[1 - whole[0]]]
    if other.is_const:
        return len(other.type.shape) <= len(shape) and \
            np.broadcast_shapes(other.type.shape, shape) == shape
    rows = _rows_in_order(graph, graph.producers(), node.inputs[whole[0]])
    return other.type.shape == shape or _broadcasts(other.type.shape, shape, rows)


def _broadcasts(other: tuple[int, ...], shape: tuple[int, ...], rows: bool = False) -> bool:
    """Whether an activation of shape `other` broadcasts over `shape` as the vector unit's ADD
    reads a second operand: of the same rank, one value per channel (every pixel axis 1: one
    row for all pixels, b_once), per pixel (the channel axis 1: lane 0 for every lane,
    b_splat) or per image (both), for each image or for all. The channels are a map's axis 1
    and a row-major value's last axis (a rank-4 value's too when its rows are in order,
    `rows`: attention's scores [B, H, S, S], a mask [B, 1, 1, S] over them); the pixels are the
    others but a rank-4 value's first, N."""
    if len(other) != len(shape) or not shape:
        return False
    channel = len(shape) - 1 if rows or len(shape) != 4 else 1
    pixels = tuple(range(1, 3)) if rows and len(shape) == 4 else \
        (2, 3) if len(shape) == 4 else tuple(range(len(shape) - 1))
    return other[channel] in (1, shape[channel]) and \
        (len(shape) != 4 or other[0] in (1, shape[0])) and \
        (all(other[i] == 1 for i in pixels) or all(other[i] == shape[i] for i in pixels))


def _activation_product(graph: Graph, node: Node) -> bool:
    """A Mul of two activations, one of its output's shape and the other of it too or, of rank
    4, broadcast over it as the vector unit's MUL reads it (a squeeze-and-excitation gate
    [N, C, 1, 1], a value per pixel [N, 1, H, W] or per image), or of rank 3 a value per row
    or per channel of a row-major value (`_broadcasts`: a pooling's weight per token [N, S,
    1]): MUL reads and writes int16
    codes, through Views too (a_wide, b_wide, wide; `numerics.mul`). Or a Mul of an activation
    of its output's shape by a constant tensor that broadcasts to it (an LSTM's peephole P ⊙ C,
    a GRU's r ⊙ Rbh), int16 codes when the Mul is int16 (`quantize.mul`); a Mul by a scalar is
    a table op (`table_input`)."""
    if node.op != MUL.name or len(node.inputs) != 2 or not all(node.inputs):
        return False
    constants = [graph.values[name] for name in node.inputs if graph.values[name].is_const]
    shape = graph.type_of(node.outputs[0]).shape
    if constants:
        other = constants[0].type.shape
        return len(constants) == 1 and table_input(graph, node) is None and \
            len(other) <= len(shape) and np.broadcast_shapes(other, shape) == shape and \
            any(graph.type_of(name).shape == shape for name in node.inputs
                if not graph.values[name].is_const)
    shapes = [graph.type_of(name).shape for name in node.inputs]
    if shape not in shapes:
        return False
    whole = node.inputs[0] if shapes[0] == shape else node.inputs[1]
    other = shapes[1] if shapes[0] == shape else shapes[0]
    if other == shape:
        return True
    if len(shape) == 3:  # row-major: a value per row (a pooling's mask weights) or per channel
        return _broadcasts(other, shape, _rows_in_order(graph, graph.producers(), whole))
    return len(shape) == 4 and len(other) == 4 and other[0] in (1, shape[0]) and \
        other[1] in (1, shape[1]) and other[2:] in ((1, 1), shape[2:])


# The kinds whose op runs as a LUT of its one activation when every other operand is a scalar
# constant (`compiler.backend.lower.vector`: Add, Sub, Max, Min, Mul, Div by a scalar), or
# always (a clamp not fused into its producer; a table op).
_SCALAR_OPERAND = (Quant.ADD, Quant.MUL, Quant.DIVIDE)
_MAPS = (Quant.LOOKUP, Quant.CLAMP)


def table_input(graph: Graph, node: Node) -> int | None:
    """The input index of the one activation that `node` maps elementwise through a table of
    the vector unit (LUT): a table op's (Quant.LOOKUP: Sigmoid, HardSwish, Pow by a constant,
    ...; PRelu of one slope, or a PRelu or ChannelMap with a table per channel of a map [N, C,
    H, W], a table per lane), a Relu's or Clip's (by constant bounds), or an Add's, Sub's,
    Max's, Min's, Mul's or Div's whose other operand is a one-element constant, the output of
    its shape; None for any other node. With int16 codes in or out it is a LUT of an int16
    table (`numerics.lookup_wide`, `numerics.interpolate`)."""
    row = OPS[node.op]
    active = [i for i, name in enumerate(node.inputs)
              if name and not graph.values[name].is_const]
    if len(active) != 1 or graph.type_of(node.inputs[active[0]]).shape != \
            graph.type_of(node.outputs[0]).shape:
        return None
    if row.quant in _MAPS or (row.quant is Quant.CHANNEL_LOOKUP and _lanes_or_one(graph, node)):
        return active[0] if active[0] == 0 else None
    if row.quant in _SCALAR_OPERAND and all(
            np.size(graph.values[name].const) == 1 for i, name in enumerate(node.inputs)
            if name and i != active[0]):
        return active[0]
    return None


# An int16 output of a function that saturates (Sigmoid, Tanh, HardSigmoid, a Clip) spans its
# bounds where they lie within this factor of the calibrated range's magnitude: a detector's
# class scores, calibrated on 8 images up to 0.23, read 0.78 on another as 0.23. The wider
# range costs at most log2 of it of int16's 8 bits beyond int8 (PicoDet's: 2.1 bits); a bound
# far beyond the data (a Clip at 1000 as a guard) is left to the calibration.
MAX_BOUND_WIDENING = 16.0
# Where a saturating function has reached its bound in float32, and far past that.
_FAR = np.array([-1e4, -1e8, 1e4, 1e8], np.float32)


def within_bounds(graph: Graph, node: Node, lo: float, hi: float) -> tuple[float, float]:
    """[lo, hi] widened to the values table op `node`'s function takes at -inf and +inf
    (`table_input`), on each side where it is constant there and the widened range stays
    within MAX_BOUND_WIDENING of [lo, hi]'s magnitude; [lo, hi] itself for any other node."""
    index = table_input(graph, node)
    if index is None:
        return lo, hi
    args = [_FAR if i == index else (graph.values[name].const if name else None)
            for i, name in enumerate(node.inputs)]
    with np.errstate(all="ignore"):
        far = np.asarray(run_fp32(node, args)[0], np.float64).ravel()
    if far.size != _FAR.size or not np.all(np.isfinite(far)):
        return lo, hi
    low = float(far[0]) if far[0] == far[1] else lo
    high = float(far[2]) if far[2] == far[3] else hi
    magnitude = max(-lo, hi)
    if magnitude <= 0 or max(-min(lo, low), max(hi, high)) > MAX_BOUND_WIDENING * magnitude:
        return lo, hi
    return min(lo, low), max(hi, high)


def _one_slope(graph: Graph, node: Node) -> bool:
    """Whether a PRelu (ChannelMap) has one slope (pair of scales): one table (a slope per
    channel is a table per lane)."""
    return all(np.size(graph.values[name].const) == 1 for name in node.inputs[1:])


def _lanes_or_one(graph: Graph, node: Node) -> bool:
    """Whether a PRelu (ChannelMap) is one table, or a table per channel whose channels are
    the vector unit's lanes (a map [N, C, H, W]: LUT per_lane=1, int16 codes too)."""
    return _one_slope(graph, node) or len(graph.type_of(node.inputs[0]).shape) == 4


def _table(graph: Graph, node: Node) -> bool | None:
    """Whether `node` maps one activation through a table (`table_input`); False for a PRelu
    (ChannelMap) with a table per channel of a value that is not a map (its channels are not
    the lanes), None for any other node."""
    if OPS[node.op].quant is Quant.CHANNEL_LOOKUP and not _lanes_or_one(graph, node):
        return False
    return True if table_input(graph, node) is not None else None


def _by_constant(graph: Graph, node: Node) -> bool:
    """A Conv, Gemm (not transA) or MatMul whose weight (input 1) is a constant."""
    return OPS[node.op].lower in _ARRAY and len(node.inputs) > 1 and \
        graph.values[node.inputs[1]].is_const and not node.attrs.get("transA", 0)


def _norm_writes(graph: Graph, node: Node) -> bool:
    """A LayerNorm or Softmax whose output is a tensor of its own (LAYERNORM and SOFTMAX
    out_wide write both planes of it; not into a Concat's buffer)."""
    return _row_op(graph, node) and not any(
        OPS[reader.op].lower is Lower.CONCAT for reader in _users(graph).get(node.outputs[0], []))


def _row_op(graph: Graph, node: Node) -> bool:
    """A LayerNorm, or a Softmax (not LogSoftmax) along the last axis: the vector unit's row
    ops that read and write int16 codes (LAYERNORM, SOFTMAX wide and out_wide)."""
    if OPS[node.op].lower is Lower.LAYER_NORM:
        return True
    if node.op != SOFTMAX.name:
        return False
    rank = len(graph.type_of(node.inputs[0]).shape)
    return OPS[node.op].bind(node.name, node.attrs)["axis"] % rank == rank - 1


def _rows_in_order(graph: Graph, producers: dict[str, Node], name: str) -> bool:
    """Whether value `name` is a tensor's own values in row-major order, the tensor's or a
    Reshape's of it: a Gemm's or MatMul's output, an elementwise Add's, Sub's or Mul's of such
    an operand (a mask added to attention's scores), or one of rank 3 at most; not a view, a
    slice or a copy's (LAYERNORM and SOFTMAX read an int16 input's two planes by rows, and
    only 8-bit codes are copied into order)."""
    while name in producers and OPS[producers[name].op].view in (ViewKind.RESHAPE,
                                                                ViewKind.SAME):
        name = producers[name].inputs[0]
    if name not in producers or moves(graph, producers[name]):
        return False
    producer = producers[name]
    if OPS[producer.op].lower in (Lower.ADD, Lower.SUB, Lower.MUL):  # as its operand of its shape
        shape = graph.type_of(name).shape
        return any(not graph.values[x].is_const and graph.type_of(x).shape == shape and
                   _rows_in_order(graph, producers, x) for x in producer.inputs if x)
    return OPS[producer.op].lower in (Lower.GEMM, Lower.MATMUL) or \
        len(graph.type_of(name).shape) <= 3


def activation_matmul(graph: Graph, node: Node) -> bool:
    """A MatMul or Gemm of two activations without a bias (attention's Q·Kᵀ and P·V), of
    ranks >= 2: the array reads either operand's int16 planes (PRELOAD's w_offset and
    COMPUTE's x_offset take each plane's) and REQUANT writes int16
    (`numerics.activation_passes`)."""
    return OPS[node.op].lower in (Lower.GEMM, Lower.MATMUL) and len(node.inputs) >= 2 and \
        not (len(node.inputs) > 2 and node.inputs[2]) and \
        all(name and not graph.values[name].is_const and len(graph.type_of(name).shape) >= 2
            for name in node.inputs[:2])


def product_terms(graph: Graph, node: Node) -> int:
    """K, the terms each output of a MatMul or Gemm of two activations sums."""
    a = graph.type_of(node.inputs[0]).shape
    return int(a[-2] if node.attrs.get("transA", 0) else a[-1])


def accumulator_bits(graph: Graph, name: str, amax: float, per_channel: bool,
                     power2: bool, bias_correction: bool = False,
                     skip: frozenset[str] | set[str] = frozenset(),
                     wide: frozenset[str] | set[str] = frozenset()) -> int:
    """The most bits b (<= 16) of symmetric int16 codes for tensor `name`, of real range
    [-amax, amax], such that no reader's int32 accumulator can overflow: for every output
    channel c of every reader, 2^(b-1) S_c + min(2^(b-1) B_c + 1, 2^24 + 1) <= 2^31 - 1, where
    S_c = sum |w_q| over the channel's int8 weight codes (its K terms) and B_c = |beta b_c| /
    (|alpha| amax s_w,c) bounds its int32 bias code per input step (the code is rint(beta b_c
    / (alpha s_x s_w,c)), s_x = amax / (2^(b-1) - 1)); the quantizer's floor keeps every bias
    code within 2^24 (`BIAS_CODE_LIMIT`: a dead channel's tiny weights would otherwise make
    B_c huge). With bias correction S_c gains K/2: the correction moves the bias by at most
    half a weight step times the input's mean, K times. A code is at most 2^(b-1) in
    magnitude (the producer clamps to b bits: `numerics.wide_clamp`), so |sum w x + bias| <
    2^31 and the two passes' int32 sum is exact. The weight scales are the quantizer's before
    any floor (a floor only shrinks codes), so the bound holds for the codes it makes.
    Readers in `skip` (int16 weights: `wide_weights.input_bits`) are not counted.
    A MatMul of two activations of K terms bounds its operands alone (`product_bits`): the
    other operand is int16 when in `wide`."""
    bits = 16
    for reader in _users(graph).get(name, []):
        if activation_matmul(graph, reader):
            other = [x for x in reader.inputs[:2] if x != name]
            bits = min(bits, product_bits(product_terms(graph, reader),
                                          bool(other) and other[0] in wide))
            continue
        if not _by_constant(graph, reader) or reader.name in skip:
            continue  # an Add or a table op: the vector unit's int16 operands have no such bound
        attrs = OPS[reader.op].bind(reader.name, reader.attrs)
        s_c, terms, scales = _code_sums(graph, reader, per_channel, power2)
        if bias_correction:
            s_c = s_c + terms / 2
        b_c = np.zeros_like(s_c)
        has_bias = len(reader.inputs) > 2 and reader.inputs[2]
        if has_bias and amax > 0:
            bias = np.abs(np.asarray(graph.values[reader.inputs[2]].const, np.float64))
            channels = len(s_c)
            bias = np.full(channels, bias.max()) if bias.size == 1 or \
                bias.size % channels else bias.reshape(-1, channels).max(axis=0)
            ratio = abs(float(attrs.get("beta", 1.0))) / abs(float(attrs.get("alpha", 1.0)))
            b_c = ratio * bias / (amax * np.broadcast_to(np.asarray(scales), (channels,)))
        while bits > 1 and np.any(2.0**(bits - 1) * s_c + np.minimum(
                2.0**(bits - 1) * b_c + 1, BIAS_CODE_LIMIT + 1) > 2**31 - 1):
            bits -= 1
    return bits


def product_bits(terms: int, other_wide: bool) -> int:
    """The most bits b (<= 16) of symmetric int16 codes for an operand of a MatMul of two
    activations summing `terms` products, whose int32 accumulator must hold any sum: terms *
    2^(b-1) * m <= 2^31 - 1, m the other operand's largest magnitude, 2^8 for int8 codes less
    a zero point (at most 255), 2^(b-1) for int16 codes of the same b (the two share the
    accumulator's bits evenly). A b-bit code is at most 2^(b-1) in magnitude (the producer
    clamps: `numerics.wide_clamp`), so the passes' int32 sum is exact
    (`numerics.activation_passes`)."""
    room = int(np.floor(np.log2((2**31 - 1) / max(terms, 1))))  # bits the two magnitudes share
    return min(16, room // 2 + 1 if other_wide else room - 8 + 1)


# Per graph (the budget quantizes one graph hundreds of times, and a group of int16 values asks
# for the same readers again): its users, and each reader's weight code sums.
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _users(graph: Graph) -> dict[str, list[Node]]:
    cache = _CACHE.setdefault(graph, {})
    if "users" not in cache:
        cache["users"] = graph.users()
    return cache["users"]


def _code_sums(graph: Graph, reader: Node, per_channel: bool, power2: bool
               ) -> tuple[np.ndarray, int, np.ndarray]:
    """Per output channel of `reader`, sum |w_q| over its int8 weight codes at the
    quantizer's scales (before any floor); the number of terms K; the scales."""
    key = (reader.name, reader.inputs[1], per_channel, power2)
    cache = _CACHE.setdefault(graph, {})
    if key not in cache:
        row = OPS[reader.op]
        attrs = row.bind(reader.name, reader.attrs)
        w = np.asarray(graph.values[reader.inputs[1]].const, np.float64)
        out_axis = row.weight.out_axis(w.ndim, attrs)
        if out_axis is None:  # a grouped Conv's or a rank-1 MatMul's: the last axis bounds it
            out_axis = {Lower.CONV: 0, Lower.CONV_TRANSPOSE: 1}.get(row.lower, w.ndim - 1)
        axis = out_axis if per_channel else None
        scales = weight_scales(w, axis, power2)
        q = numerics.quantize(w, scales, 0, -127, 127, axis=axis, arithmetic=np.float64)
        codes = np.abs(np.moveaxis(q.astype(np.int64), out_axis, 0)).reshape(q.shape[out_axis], -1)
        cache[key] = (codes.sum(axis=1).astype(np.float64), codes.shape[1], scales)
    return cache[key]
