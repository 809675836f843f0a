"""Lowering: the quantized Graph → accelerator layers over DRAM tensors.

Each integer node becomes one layer that the array or the vector unit runs, reading and writing
whole tensors in DRAM; views (Flatten, Reshape, Squeeze, Unsqueeze, Identity) become no layer at
all, only another name for the same bytes. Every number a layer needs (int8 weights, int32 bias,
per-channel multipliers and shifts, tables) is taken from the quantized node's own attributes,
the ones the quantizer computed and the integer reference (`quantizer.reference.run_int8`) runs,
so the program and the oracle read the same integers.

The operator table's `lower` column names each operator's rule (`RULES`): a function of `array`
(Conv, ConvTranspose, Gemm, MatMul), `vector` (pools, Pad, Add/Sub/Mul, lookup tables,
Softmax), `resize` (Resize; border-copying Pads) or `data` (views, slices, Transpose, Concat,
Gather, the model's bindings), run by the walk (`walk`). An operator without one has no lowering: a
CompileError naming it, or with `allow_host` it joins a host segment
(`compiler.backend.partition`).
"""

from __future__ import annotations

from compiler.backend.layers import Lowered
from compiler.backend.lower.array import (lower_conv, lower_conv_transpose, lower_gemm,
                                          lower_matmul)
from compiler.backend.lower.data import (lower_concat, lower_dequantize, lower_gather,
                                         lower_quantize, lower_slice, lower_split,
                                         lower_transpose, lower_view)
from compiler.backend.lower.resize import lower_resize
from compiler.backend.lower.vector import (lower_add, lower_average_pool, lower_channel_lut,
                                           lower_div, lower_global_average_pool,
                                           lower_global_max_pool, lower_hypot,
                                           lower_layer_norm, lower_lut,
                                           lower_max, lower_max_pool, lower_min, lower_mul,
                                           lower_pad, lower_reduce, lower_reduce_mean,
                                           lower_softmax,
                                           lower_sub)
from compiler.backend.lower.walk import Unsupported, Walk, unsupported
from compiler.graph.ir import Graph
from compiler.graph.ops import Lower

__all__ = ["RULES", "Unsupported", "lower", "unsupported"]


# The operator table's `lower` column → the function that lowers a node of that kind.
RULES = {
    Lower.CONV: lower_conv,
    Lower.CONV_TRANSPOSE: lower_conv_transpose,
    Lower.GEMM: lower_gemm,
    Lower.MATMUL: lower_matmul,
    Lower.MAX_POOL: lower_max_pool,
    Lower.AVERAGE_POOL: lower_average_pool,
    Lower.GLOBAL_MAX_POOL: lower_global_max_pool,
    Lower.GLOBAL_AVERAGE_POOL: lower_global_average_pool,
    Lower.REDUCE_MEAN: lower_reduce_mean,
    Lower.ADD: lower_add,
    Lower.SUB: lower_sub,
    Lower.MAX: lower_max,
    Lower.HYPOT: lower_hypot,
    Lower.REDUCE: lower_reduce,
    Lower.MIN: lower_min,
    Lower.MUL: lower_mul,
    Lower.DIVIDE: lower_div,
    Lower.LUT: lower_lut,
    Lower.CHANNEL_LUT: lower_channel_lut,
    Lower.SOFTMAX: lower_softmax,
    Lower.LAYER_NORM: lower_layer_norm,
    Lower.GATHER: lower_gather,
    Lower.VIEW: lower_view,
    Lower.SLICE: lower_slice,
    Lower.SPLIT: lower_split,
    Lower.CONCAT: lower_concat,
    Lower.QUANTIZE: lower_quantize,
    Lower.TRANSPOSE: lower_transpose,
    Lower.RESIZE: lower_resize,
    Lower.PAD: lower_pad,
    Lower.DEQUANTIZE: lower_dequantize,
}


def lower(graph: Graph, allow_host: bool = False) -> Lowered:
    """The accelerator layers of a quantized graph; CompileError names any node that cannot run
    on the accelerator, unless `allow_host` gives such nodes to host segments
    (`compiler.backend.partition`)."""
    return Walk(graph, allow_host, RULES).run()
