"""The accelerator's layers: what lowering produces and tiling, memory planning and codegen
consume. Each layer reads and writes whole activation tensors in DRAM and carries every integer
it needs (int8 weights, int32 bias, multipliers and shifts, tables).

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
            return () if self.same_bytes(Layout.row_major(shape)) else None
        physical = [self.dims[p] for p in self.perm]
        phys_strides = [int(np.prod(physical[i + 1:], dtype=np.int64)) * item_bytes
                        for i in range(len(physical))]
        strides = [0] * len(shape)
        for i, axis in enumerate(self.perm):
            strides[axis] = phys_strides[i]
        return tuple(strides)


@dataclass(frozen=True)
class Tensor:
    """An activation buffer in DRAM (int8), named after the graph value that owns it."""

    name: str
    size_bytes: int


@dataclass(frozen=True, eq=False)
class ConvLayer:
    """A convolution on the array: y = requant(conv(x - x_zp, w) + bias), channels-last."""

    node: str
    x: str
    y: str
    batch: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    in_channels: int
    out_channels: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right
    x_zero_point: int
    weights: np.ndarray  # (out, in, kh, kw) int8, dense (groups expanded block-diagonally)
    bias: np.ndarray | None  # (out,) int32
    multiplier: np.ndarray  # (out,) int64
    shift: np.ndarray  # (out,) int64
    out_zero_point: int
    qclamp: tuple[int, int]
    group: int = 1

    @property
    def macs(self) -> int:
        """The model's multiply-accumulates (the zeros outside each group excluded)."""
        oh, ow = self.out_hw
        return (self.batch * oh * ow * self.out_channels * (self.in_channels // self.group)
                * self.kernel[0] * self.kernel[1])


@dataclass(frozen=True, eq=False)
class PoolLayer:
    """MaxPool, or AveragePool with a single window size (params set), on the vector unit."""

    node: str
    x: str
    y: str
    batch: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
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


@dataclass(frozen=True, eq=False)
class AddLayer:
    """TFLite's quantized ADD over two tensors of the same layout (Sub negates b's rescale)."""

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


@dataclass(frozen=True, eq=False)
class LutLayer:
    """y = table[x + 128] elementwise: any int8 → int8 map of one input."""

    node: str
    x: str
    y: str
    size: int
    table: np.ndarray  # 256 int8


Layer = ConvLayer | PoolLayer | AddLayer | LutLayer


@dataclass(frozen=True)
class Binding:
    """A program input or output: the graph's float name, its DRAM tensor and quantization."""

    name: str
    tensor: str
    shape: tuple[int, ...]
    scale: float
    zero_point: int
    strides: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Lowered:
    """The graph as accelerator layers: what tiling, memory planning and codegen consume."""

    graph: str
    layers: tuple[Layer, ...]
    tensors: dict[str, Tensor]
    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]
    views: dict[str, str] = field(default_factory=dict)  # view value → its buffer
