"""The accelerator's layers: what lowering produces and tiling, memory planning and codegen
consume. Each layer reads and writes whole activation tensors in DRAM and carries every integer
it needs (int8 or int16 weights, int32 bias, multipliers and shifts, tables).

**Layout.** A feature map N x C x H x W is stored channels-last (N, H, W, C): one pixel's
channels are contiguous, so one DMA element fills the lanes of one local row (`simulator.isa`).
Other tensors are row-major. A view keeps its source's bytes, so a tensor's `Layout` says how its
logical elements sit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NHWC = (0, 2, 3, 1)


@dataclass(frozen=True)
class Layout:
    """Physical order of a tensor: memory = logical.reshape(dims).transpose(perm), row-major."""

    dims: tuple[int, ...]
    perm: tuple[int, ...]

    @classmethod
    def row_major(cls, shape: tuple[int, ...]) -> "Layout":
        return cls(tuple(shape), tuple(range(len(shape))))

    @classmethod
    def channels_last(cls, shape: tuple[int, ...]) -> "Layout":
        return cls(tuple(shape), NHWC) if len(shape) == 4 else cls.row_major(shape)

    def order(self) -> np.ndarray:
        """Physical position → logical flat index."""
        size = int(np.prod(self.dims, dtype=np.int64))
        return np.arange(size, dtype=np.int64).reshape(self.dims).transpose(self.perm).ravel()

    def same_bytes(self, other: "Layout") -> bool:
        if (self.dims, self.perm) == (other.dims, other.perm):
            return True
        return np.array_equal(self.order(), other.order())

    def strides(self, shape: tuple[int, ...], item_bytes: int = 1) -> tuple[int, ...] | None:
        """Byte strides of the logical axes, or None when the layout is no axis permutation of
        `shape` (then an I/O binding cannot describe it)."""
        if tuple(self.dims) != tuple(shape):
            if self.same_bytes(Layout.row_major(shape)):
                return ()
            # A Reshape view of the layout's own axes (ones added or removed, axes merged
            # where their strides nest, split): numpy's test for a reshape without a copy.
            return reshaped_strides(self.dims, self.strides(self.dims, item_bytes), shape)
        physical = [self.dims[p] for p in self.perm]
        phys_strides = [int(np.prod(physical[i + 1:], dtype=np.int64)) * item_bytes
                        for i in range(len(physical))]
        strides = [0] * len(shape)
        for i, axis in enumerate(self.perm):
            strides[axis] = phys_strides[i]
        return tuple(strides)


def reshaped_strides(dims, strides, shape) -> tuple[int, ...] | None:
    """Strides of `shape` over the same row-major elements as `dims` at `strides`, or None when
    a reshape of them is no strided view (a merge of axes whose strides do not nest)."""
    old = [(d, s) for d, s in zip(dims, strides) if d != 1]
    new = [d for d in shape if d != 1]
    if int(np.prod([d for d, _ in old], dtype=np.int64)) != int(np.prod(new, dtype=np.int64)):
        return None
    found: list[int] = [0] * len(new)
    i = j = 0
    while i < len(old) and j < len(new):
        size_old, size_new, i_end, j_end = old[i][0], new[j], i + 1, j + 1
        while size_old != size_new:
            if size_new < size_old:
                size_new, j_end = size_new * new[j_end], j_end + 1
            else:
                size_old, i_end = size_old * old[i_end][0], i_end + 1
        if any(old[k][1] != old[k + 1][1] * old[k + 1][0] for k in range(i, i_end - 1)):
            return None
        found[j_end - 1] = old[i_end - 1][1]
        for k in range(j_end - 1, j, -1):
            found[k - 1] = found[k] * new[k]
        i, j = i_end, j_end
    own = iter(found)
    return tuple(next(own) if d != 1 else 0 for d in shape)


def common_axes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The coarsest axes both row-major shapes `a` and `b` split into (of the same elements):
    (6, 4, 5) and (2, 3, 20) give (2, 3, 4, 5); None when no such axes exist ((4, 6) and
    (6, 4))."""
    a, b = [d for d in a if d != 1], [d for d in b if d != 1]
    out: list[int] = []
    i = j = 0
    left_a, left_b = (a[0] if a else 1), (b[0] if b else 1)
    while i < len(a) and j < len(b):
        step = min(left_a, left_b)
        if max(left_a, left_b) % step:
            return None
        out.append(step)
        left_a, left_b = left_a // step, left_b // step
        if left_a == 1:
            i += 1
            left_a = a[i] if i < len(a) else 1
        if left_b == 1:
            j += 1
            left_b = b[j] if j < len(b) else 1
    return tuple(out) if i == len(a) and j == len(b) else None


@dataclass(frozen=True)
class View:
    """Where a block of elements sits in its buffer: element (n, y, x, c) of an N x H x W x C
    block is the byte at offset + n * strides[0] + y * strides[1] + x * strides[2] + c.

    A feature map N x C x H x W is the block (N, H, W, C); a row-major tensor of rank r < 4 is
    its shape padded with leading ones, so an (M, K) matrix is M pixels of K channels. Slices
    and Split outputs are views of their producer's buffer, and Concat inputs views of the
    Concat's: channels stay contiguous (stride 1), everything else is a stride and an offset.
    """

    shape: tuple[int, int, int, int]
    offset: int
    strides: tuple[int, int, int]

    @classmethod
    def dense(cls, shape: tuple[int, int, int, int]) -> "View":
        n, h, w, c = shape
        return cls(tuple(shape), 0, (h * w * c, w * c, c))

    @property
    def pixel(self) -> int:
        return self.strides[2]

    @property
    def row(self) -> int:
        return self.strides[1]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def at(self, n: int, y: int, x: int, c: int = 0) -> int:
        """Byte offset of element (n, y, x, c) in the buffer."""
        return self.offset + n * self.strides[0] + y * self.strides[1] + x * self.strides[2] + c

    @property
    def contiguous(self) -> bool:
        """Whether the block is one run of bytes in N, H, W, C order (from `offset`)."""
        n, h, w, c = self.shape
        dense = View.dense(self.shape).strides
        return all(s == d or size == 1 for s, d, size in zip(self.strides, dense, (n, h, w)))

    def span(self) -> tuple[int, int]:
        """The bytes [lo, hi) the block touches, from the buffer's start."""
        last = self.at(*(max(d - 1, 0) for d in self.shape))
        return self.offset, last + 1

    def sub(self, axis: int, start: int, count: int, step: int = 1) -> "View":
        """Elements start, start + step, ... (count of them) along block axis `axis`."""
        shape = list(self.shape)
        shape[axis] = count
        strides = list(self.strides)
        offset = self.offset + start * (strides[axis] if axis < 3 else 1)
        if axis < 3:
            strides[axis] *= step
        elif step != 1:
            raise ValueError("channels are contiguous: a channel step must be 1")
        return View(tuple(shape), offset, tuple(strides))


def block_axis(rank: int, axis: int) -> int:
    """The View axis of logical axis `axis` of a rank-`rank` tensor (NCHW → N, H, W, C for a
    feature map; leading ones for a row-major tensor of lower rank)."""
    return (0, 3, 1, 2)[axis] if rank == 4 else 4 - rank + axis


def block_shape(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The (N, H, W, C) block of a logical shape (see `View`)."""
    if len(shape) == 4:
        n, c, h, w = shape
        return (n, h, w, c)
    return tuple([1] * (4 - len(shape)) + list(shape))


@dataclass(frozen=True)
class Tensor:
    """An activation buffer in DRAM (int8; float32 for fp32 values that cross a host segment's
    boundary), named after the graph value that owns it."""

    name: str
    size_bytes: int


@dataclass(frozen=True, eq=False)
class _Windowed:
    """A layer from one [batch, h, w, channels] map to another: each side is a view of its
    buffer, or (x_view/y_view None) the whole buffer, dense."""

    node: str
    x: str
    y: str
    batch: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]

    @property
    def in_view(self) -> View:
        return self.x_view or View.dense((self.batch, *self.in_hw, self.in_channels))

    @property
    def out_view(self) -> View:
        return self.y_view or View.dense((self.batch, *self.out_hw, self.out_channels))


@dataclass(frozen=True, eq=False)
class ConvLayer(_Windowed):
    """A convolution on the array: y = requant(conv(x - x_zp, w) + bias), channels-last."""

    in_channels: int
    out_channels: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right
    x_zero_point: int
    # (out, in, kh, kw) int8, or int16 (`QuantOptions.int16_weights`: `weight_passes`),
    # dense (groups expanded block-diagonally)
    weights: np.ndarray
    bias: np.ndarray | None  # (out,) int32
    multiplier: np.ndarray  # (out,) int64
    shift: np.ndarray  # (out,) int64
    out_zero_point: int
    qclamp: tuple[int, int]
    # The model's multiply-accumulates (the operator table's count: the zeros outside each
    # group excluded).
    macs: int
    group: int = 1
    x_view: View | None = None  # None: x is its whole buffer, dense (likewise y)
    y_view: View | None = None
    # An int16 output (a projection added into a residual stream): y is two planes of
    # y_plane bytes, the high one first (REQUANT wide=1); 0: int8.
    y_plane: int = 0
    # An int16 input (`QuantOptions.int16_tensors`): x is two planes of x_plane bytes, the high
    # one first; each tap streams both through its weight tile, the high plane with COMPUTE
    # shift=8 and the low one with x_offset=-128 (`numerics.split_wide`); through int16
    # weights, four passes a tap, the shifts added (`numerics.wide_passes`); 0: int8.
    x_plane: int = 0

    @property
    def weight_passes(self) -> int:
        """Weight tiles per tap and K slice: 2 for int16 weights, whose high and low int8
        parts (`numerics.split_weight`) are each PRELOADed and streamed (COMPUTE shift=7 for
        the high one), 1 for int8 weights."""
        return 2 if self.weights.dtype == np.int16 else 1


@dataclass(frozen=True, eq=False)
class Operand:
    """One matrix of a MatMul of two activations in its buffer: element (i, j) of GEMM g is the
    byte at offsets[g] + i * rows + j * cols (any strides: a Transpose before the MatMul is a
    view, its strides permuted)."""

    tensor: str
    offsets: tuple[int, ...]
    rows: int
    cols: int


@dataclass(frozen=True, eq=False)
class MatMulLayer:
    """A MatMul of two activations on the array, one GEMM per index of the leading (batch,
    head) axes: y = requant((a - a_zp) @ (b - b_zp)), a (m, k) and b (k, n), y row-major
    (m, n) at y_offsets. b is the stationary operand, a tile of k rows of n lanes (PRELOAD
    w_offset = b_zp), a's rows stream (COMPUTE x_offset = a_zp): both zero points are
    subtracted on the array, exactly as `int8.matmul_int8` does. y's rows are n contiguous
    bytes at stride y_row from y_offsets[g]. An int16 operand (or y) is two planes of int8
    codes in its buffer, the low one `a_plane` (`b_plane`, `y_plane`) bytes after the high
    one at the same offsets (0: int8): the array takes each pair of planes in a pass of its
    own (`numerics.activation_passes`), and REQUANT wide=1 writes y's two."""

    node: str
    a: Operand
    b: Operand
    y: str
    y_offsets: tuple[int, ...]
    y_row: int  # the stride of y's rows (n, or a wider row of a Transpose it writes into)
    m: int
    k: int
    n: int
    a_zero_point: int
    b_zero_point: int
    multiplier: int
    shift: int
    out_zero_point: int
    qclamp: tuple[int, int]
    macs: int
    a_plane: int = 0
    b_plane: int = 0
    y_plane: int = 0


@dataclass(frozen=True, eq=False)
class PoolLayer(_Windowed):
    """MaxPool, or AveragePool with a single window size (params set), on the vector unit;
    of int8 codes, or of int16 ones (two planes each, `numerics.split_wide`)."""

    channels: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    pad_value: int
    average: bool = False
    multiplier: int = 0
    shift: int = 0
    out_zero_point: int = 0
    qclamp: tuple[int, int] = (-128, 127)
    x_view: View | None = None  # None: x is its whole buffer, dense (likewise y)
    y_view: View | None = None
    # An int16 input (MAXPOOL wide, AVGPOOL in_wide): x's buffer is two planes of x_plane
    # bytes, the high one first, and `pad_value` is an int16 code (each plane pads with its
    # byte of it); likewise an int16 output's y_plane (MAXPOOL wide, AVGPOOL wide); 0: int8.
    x_plane: int = 0
    y_plane: int = 0

    @property
    def in_channels(self) -> int:
        return self.channels

    @property
    def out_channels(self) -> int:
        return self.channels


class _BinaryOperands:
    """Where a binary vector layer's b operand broadcasts: its View's shape has 1 where y's has
    more, over the pixels (one value per image and channel), the channels (one value per
    pixel) or both (one per image); and which of a, b and y are int16 (`planes`: the bytes
    from each one's high plane to its low one, 0 for int8)."""

    views: tuple[View, View, View] | None
    planes: tuple[int, int, int]

    @property
    def a_wide(self) -> bool:
        return bool(self.planes[0])

    @property
    def b_wide(self) -> bool:
        return bool(self.planes[1])

    @property
    def wide(self) -> bool:
        return bool(self.planes[2])

    @property
    def b_channels(self) -> bool:
        """Whether b has a value per channel (else one per pixel or image, for every lane)."""
        return self.views is None or self.views[1].shape[3] == self.views[2].shape[3]

    @property
    def b_pixels(self) -> bool:
        """Whether b has a value per pixel (else one per image, for every pixel)."""
        return self.views is None or self.views[1].shape[1:3] == self.views[2].shape[1:3]


@dataclass(frozen=True, eq=False)
class AddLayer(_BinaryOperands):
    """TFLite's quantized ADD of a and b into y (Sub negates b's rescale), or with `op` "max"
    or "min" their larger or smaller (`numerics.extremum`). b is of y's shape or broadcast as
    MulLayer's."""

    node: str
    a: str
    b: str
    y: str
    size: int
    a_zero_point: int
    b_zero_point: int
    multipliers: tuple[int, int, int]
    shifts: tuple[int, int, int]
    out_zero_point: int
    qclamp: tuple[int, int]
    # Views of a, b and y in their buffers, all three or none (then each is its whole buffer,
    # and the layer runs over flat bytes).
    views: tuple[View, View, View] | None = None
    op: str = "add"  # the ADD instruction's op: add, max or min
    # An int16 a, b or y (a residual stream, an LSTM step's gates: ADD a_wide, b_wide, wide):
    # the bytes from its high plane to its low one in its tensor (`Walk.planes`), 0 for int8,
    # so a View of the high plane finds the low one, over flat bytes or pixel-wise (a slice of
    # a buffer, a broadcast bias), as MulLayer's.
    planes: tuple[int, int, int] = (0, 0, 0)


@dataclass(frozen=True, eq=False)
class MulLayer(_BinaryOperands):
    """A quantized product (numerics.mul) of a and b into y, a of y's shape. b is of y's shape
    too, or broadcast (`_BinaryOperands`; a squeeze-and-excitation gate is one value per image
    and channel). Fields as AddLayer's, one rescale."""

    node: str
    a: str
    b: str
    y: str
    size: int
    a_zero_point: int
    b_zero_point: int
    multiplier: int
    shift: int
    out_zero_point: int
    qclamp: tuple[int, int]
    views: tuple[View, View, View] | None = None
    # An int16 a, b or y (a squeeze-and-excitation block's map, gate or product: MUL a_wide,
    # b_wide, wide): the bytes from its high plane to its low one in its tensor (`Walk.planes`),
    # 0 for int8, so a View of the high plane finds the low one, over flat bytes or pixel-wise.
    planes: tuple[int, int, int] = (0, 0, 0)


@dataclass(frozen=True, eq=False)
class LutLayer:
    """y = table[x + 128] elementwise: any int8 → int8 map of one input (and a table op's
    int16 forms: `wide`, `in_wide`)."""

    node: str
    x: str
    y: str
    size: int
    # 256 int8; or (channels, 256), a table per channel (PRelu with a slope per channel): then
    # views are set, and the layer runs pixel by pixel with one channel block per row.
    table: np.ndarray
    views: tuple[View, View] | None = None  # of x and y, both or none (as AddLayer's)
    # int16 codes (`quantizer.wide`): an int16 y is two planes of `size`
    # bytes, the high one first (LUT wide=1); an int16 x likewise (LUT in_wide=1). The table
    # is then of int16 entries: 256 codes' outputs, or 257 knots for an int16 x, and 257
    # more for its window of finer knots, `knots` = (zoom, origin) (`numerics.interpolate`).
    wide: bool = False
    in_wide: bool = False
    knots: tuple[int, int] = (0, 0)
    # An int16 x read through a View of a larger buffer (an LSTM step's gate, a slice of its
    # pre-activations): the bytes from the buffer's high plane to its low one (`Walk.planes`),
    # pixel by pixel when the View is strided; 0: x is whole (`size` bytes a plane).
    x_plane: int = 0

    @property
    def per_channel(self) -> bool:
        return self.table.ndim == 2


@dataclass(frozen=True, eq=False)
class SoftmaxLayer:
    """Softmax or LogSoftmax (`log`) along the channels of y's pixels: the SOFTMAX instruction
    over each pixel's channel blocks, with the int32 `table` its kernel reads (the exp entries,
    and for log the log-mantissa entries after them); with `norm`, LayerNormalization, the
    LAYERNORM instruction over the same rows and `table` its parameters; with `reduce`, the
    REDUCE instruction over x's rows, one value each in y's one channel."""

    node: str
    x: str
    y: str
    table: np.ndarray
    log: bool
    shift: int  # the log table's fraction bits (log only)
    out_zero_point: int
    views: tuple[View, View]  # of x and y in their buffers
    norm: bool = False
    # An int16 x (LAYERNORM or SOFTMAX wide=1): the bytes from x's high plane to its low one
    # (0: x is int8); likewise of an int16 y (out_wide=1: a residual stream's operand, or
    # probabilities in steps of 2^-(8 + fine_bits)).
    x_plane: int = 0
    y_plane: int = 0
    fine_bits: int = 0
    # A row reduction (REDUCE op max, min or l2: ReduceMax, ReduceMin, ReduceL2 over the
    # contiguous axis): x's `channels` per row to one value in y's one channel (l2's rescale:
    # `table`, the int32 multiplier and shift).
    reduce: str = ""
    channels: int = 0
    in_zero_point: int = 0


@dataclass(frozen=True, eq=False)
class GatherLayer:
    """An embedding lookup: the rows of a constant int8 `table` [V, D] that the int32 indices
    in tensor x pick, into y [count, D] row-major; one GATHER, the indexed DMA, DRAM to DRAM
    (a following layer loads y as any other tensor)."""

    node: str
    x: str  # the int32 indices (a model input's binding)
    y: str
    table: np.ndarray
    count: int


@dataclass(frozen=True)
class HostPort:
    """One value a host segment reads or writes in DRAM: the subgraph's value name, the DRAM
    tensor holding it, and the shape, element type and byte strides it is accessed with there
    (the tensor's own layout, so the host reads and writes logical arrays; a view's value is
    its tensor's array reshaped, since views keep the logical order)."""

    value: str
    tensor: str
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]
    offset: int = 0  # bytes from the tensor's start (a part of a buffer: a slice, say)
    plane: int = 0  # int16: bytes from the high plane to the low one (each at `strides`)


@dataclass(frozen=True, eq=False)
class HostLayer:
    """A host segment: consecutive nodes the accelerator does not run (kept in fp32, their
    QuantizeLinear/DequantizeLinear wrappers, operators without a lowering), run on the host CPU by
    `compiler.backend.codegen.host.run_segment` between a read of its inputs from DRAM and a write
    of
    its outputs (`graph` is the serialized subgraph, `compiler.graph.serialize`)."""

    node: str  # the segment's name, the source of its instruction
    index: int  # its position in the program's host_segments
    nodes: tuple[str, ...]
    inputs: tuple[HostPort, ...]
    outputs: tuple[HostPort, ...]
    graph: dict
    flops: int  # the estimate that prices the segment (compiler.backend.partition.flops)

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.tensor for p in self.inputs))

    @property
    def writes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.tensor for p in self.outputs))

    @property
    def read_bytes(self) -> int:
        return sum(_port_bytes(p) for p in self.inputs)

    @property
    def write_bytes(self) -> int:
        return sum(_port_bytes(p) for p in self.outputs)


def _port_bytes(port: HostPort) -> int:
    return int(np.prod(port.shape, dtype=np.int64)) * np.dtype(port.dtype).itemsize


Layer = (ConvLayer | MatMulLayer | PoolLayer | AddLayer | MulLayer | LutLayer | SoftmaxLayer
         | GatherLayer | HostLayer)


def pixelwise(layer: AddLayer | MulLayer | LutLayer) -> bool:
    """Whether an elementwise layer runs pixel by pixel over its Views (an operand is strided:
    a channel slice, or a part of a Concat's buffer; or broadcast; or a table per channel)
    rather than over flat bytes."""
    return layer.views is not None and (not all(v.contiguous for v in layer.views) or any(
        v.shape != layer.views[-1].shape for v in layer.views) or (
        isinstance(layer, LutLayer) and layer.per_channel))


def transpose_input_strides(perm: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a Transpose's input axes, given its output's (output axis i is input axis
    perm[i]): how a binding reads the user's array straight into the transposed tensor."""
    source = [0] * len(perm)
    for axis, stride in zip(perm, strides):
        source[axis] = stride
    return tuple(source)


@dataclass(frozen=True)
class Binding:
    """A program input or output: the graph's float name, its DRAM tensor and quantization."""

    name: str
    tensor: str
    shape: tuple[int, ...]
    scale: float
    zero_point: int
    strides: tuple[int, ...]
    # float32 for a float value the host reads or writes, int32 for integer indices (scale 1,
    # zero point 0 both)
    dtype: str = "int8"
    offset: int = 0  # bytes from the tensor's start (an output that is a view of a buffer)
    perm: tuple[int, ...] | None = None  # the tensor is this binding's array transposed by perm
    plane: int = 0  # int16: bytes from the tensor's high plane to its low one


@dataclass(frozen=True, eq=False)
class Lowered:
    """The graph as accelerator layers: what tiling, memory planning and codegen consume."""

    graph: str
    layers: tuple[Layer, ...]
    tensors: dict[str, Tensor]
    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]
    views: dict[str, str] = field(default_factory=dict)  # view value → its buffer
    # Constant operands (an Add's or Mul's tensor of codes): tensor → its bytes, which live in
    # the DRAM image, not in the activation arena.
    constants: dict[str, bytes] = field(default_factory=dict)
