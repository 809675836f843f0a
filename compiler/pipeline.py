"""The compiler's plan, in order: each step is a named pass, and each says why it is there.

`optimize` runs the fp32 graph passes; `compile_int8` is the backend, from the quantized graph
to the accelerator's Program: lower → tile → codegen → plan DRAM → schedule.
"""

from __future__ import annotations

import gc
from typing import Callable

from compiler.backend.codegen.emit import relocate
from compiler.backend.codegen.generate import generate
from compiler.backend.codegen.host import HostTiles, host_segments
from compiler.backend.layer_order import order_for_memory
from compiler.backend.layers import ConvLayer, HostLayer, MatMulLayer
from compiler.backend.lower import lower
from compiler.backend.memory import plan_dram
from compiler.backend.program import BackendOptions, Compiled, bindings, packable, summarize
from compiler.backend.progress import Progress, quiet
from compiler.backend.reuse import keep_on_chip
from compiler.backend.schedule import schedule
from compiler.backend.tiling import alternate, tile
from compiler.errors import CompileError
from compiler.graph.ir import Graph, verify
from compiler.passes.cast_early import cast_early
from compiler.passes.channel_affine import channel_affine
from compiler.passes.conv1d_as_2d import conv1d_as_2d
from compiler.passes.pad_as_4d import pad_as_4d
from compiler.passes.eliminate_common import eliminate_common
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_batchnorm import fold_batchnorm
from compiler.passes.fold_bias import fold_bias
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fold_pad import fold_pad
from compiler.passes.fold_scale import fold_scale
from compiler.passes.fuse_channel_map import fuse_channel_map
from compiler.passes.fuse_gates import fuse_gates
from compiler.passes.fuse_hypot import fuse_hypot
from compiler.passes.fuse_layer_norm import fuse_layer_norm
from compiler.passes.fuse_norm_by_value import fuse_norm_by_value
from compiler.passes.fuse_one_hot import fuse_one_hot
from compiler.passes.fuse_softmax import fuse_softmax
from compiler.passes.offset_uint8 import offset_uint8, unsigned_io
from compiler.passes.remove_identity import remove_identity
from compiler.passes.split_clip import split_clip
from compiler.passes.sink_expand import sink_expand
from compiler.passes.split_fused_heads import split_fused_heads
from compiler.passes.split_sliced_conv import split_sliced_conv
from compiler.passes.ungroup_conv_transpose import ungroup_conv_transpose
from simulator.arch import Arch
from simulator.program import Program

Pass = Callable[[Graph], Graph]

GRAPH_PASSES: list[Pass] = [
    remove_identity,   # first: Identity/Dropout hide producer-consumer pairs from every rewrite
    fold_constants,    # before BN folding, which needs constant parameters; folds Shape chains
    cast_early,        # after folding, which makes the Expand's shapes constant: an integer
    #                    mask's Cast to float → onto the mask (then the input's quantization)
    sink_expand,       # after cast_early, which leaves the mask's Expand on floats: past the
    #                    Mul, sums and maps that broadcast by themselves
    fuse_one_hot,      # after folding, which makes the range constant; before bias folding,
    #                    which would take its Add: a one-hot of ids times a table → Gather
    split_fused_heads,  # after folding, which makes the Slices constant: a fused Q/K/V's
    #                    rank-5 Transpose → a channel Slice, Reshape and Transpose per part
    fuse_layer_norm,   # after folding, which makes eps, gamma and beta constant: a LayerNorm
    #                    written out → LayerNormalization (integer mean, variance and root)
    fuse_norm_by_value,  # after the structural LayerNorm fusion: any other form of a norm
    #                    over one axis (JAX's, Keras's), recognized by evaluating the region
    fuse_softmax,      # after folding, which makes the axes constant: a softmax written out
    #                    (Exp, ReduceSum, Div, the ReduceMax shift or not) → Softmax
    split_sliced_conv,  # after folding, which makes the Slices constant: a Conv read only by
    #                    Slices → one Conv per slice (an STFT's two parts, its frames)
    fuse_hypot,        # after folding, which makes Pow's exponent constant: sqrt(a² + b²),
    #                    a spectrum's magnitude → Hypot (its power never rounds to int8)
    split_clip,        # after folding, which makes bounds constant: a run-time one → Max/Min
    fold_pad,          # after folding, which makes pads constant: zero Pad → the Conv's pads
    fold_batchnorm,    # Conv/Gemm + BN → one Conv/Gemm: BN costs nothing on the accelerator
    fuse_gates,        # before bias folding takes hard-sigmoid's "+ 3": x * Sigmoid(x) → Swish
    fuse_channel_map,  # after gate fusion, which makes an equalized HardSwish one op; before
    #                    channel_affine takes its per-channel Muls: Mul → table op → Mul → one
    #                    table per channel
    fold_bias,         # after BN folding: a constant Add after a Conv/Gemm/MatMul → its bias
    fold_scale,        # after bias folding: attention's 1/√Dh → the query projection's weights
    channel_affine,    # after BN folding: the BNs left, and per-channel Add/Mul... by constants,
    #                    become depthwise 1x1 Convs (Div by a constant a Mul)
    ungroup_conv_transpose,  # after BN folding, which scales the grouped weight: one group,
    #                    so that the weight has an output-channel axis for per-channel scales
    conv1d_as_2d,      # after BN and bias folding into the 1-D Conv: a 2-D Conv one row high,
    #                    as the array runs them
    pad_as_4d,         # likewise a Pad of a rank-2/3 value: of a one-channel map's H and W
    eliminate_common,  # after folding, equal constant-fed nodes are now visible as equal
    eliminate_dead,    # last: earlier passes leave unread constants and nodes behind
]

# The passes over the quantized graph, before lowering.
INT8_PASSES: list[Pass] = [
    offset_uint8,      # uint8 activations → int8 codes offset by -128: local memories hold int8
]


def optimize(graph: Graph, passes: list[Pass] | None = None, check: bool = False) -> Graph:
    """Apply graph passes in order (the fp32 `GRAPH_PASSES` unless given); with `check`,
    verify the graph after each."""
    for graph_pass in GRAPH_PASSES if passes is None else passes:
        graph = graph_pass(graph)
        if check:
            verify(graph)
    return graph


def compile_int8(qgraph: Graph, arch: Arch, options: BackendOptions = BackendOptions(),
                 metadata: dict | None = None, progress: Progress = quiet) -> Compiled:
    """The backend plan: a quantized graph (`quantizer.quantize`) → a Program for `arch`;
    `progress` hears how far the per-layer and per-instruction steps have come.

    Python's cycle collector is paused meanwhile: the backend makes no cycles, and the
    collector would traverse its hundreds of thousands of live instructions again and again
    (ResNet-18 on edge: 21.9 s with it, 11.7 s without)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _compile_int8(qgraph, arch, options, metadata, progress)
    finally:
        if collecting:
            gc.enable()


def _compile_int8(qgraph: Graph, arch: Arch, options: BackendOptions, metadata: dict | None,
                  progress: Progress) -> Compiled:
    # Lower first: views vanish and every integer node becomes one array or vector layer over
    # DRAM tensors, with the quantizer's own integers; anything else fails here, naming it, or
    # with allow_host runs on the host (each run of such nodes one HostLayer, `partition`).
    # The int8 passes run first (uint8 activations become int8 codes; the program's bindings
    # stay uint8, and the machine flips the top bit at its I/O).
    progress("lowering", 0, None)
    lowered = lower(optimize(qgraph, INT8_PASSES), options.allow_host)
    # Order the layers to keep little activation memory live (Glow's memory-size scheduler):
    # before tiling and codegen, which follow the layers' order.
    lowered = order_for_memory(lowered)
    # Tile each layer from the target's sizes, so every layer fits the local memories; a first
    # convolution with few input channels may pack kernel taps into K. Host segments use no
    # local memory.
    sole_readers = packable(lowered)
    tiles = []
    for done, layer in enumerate(lowered.layers):
        progress("tiling layers", done, len(lowered.layers))
        tiles.append(HostTiles() if isinstance(layer, HostLayer) else
                     tile(layer, arch, layer.node in sole_readers))
    progress("keeping activations on chip", 0, None)
    # Keep in the scratchpad an activation only the next layer reads, when that layer loads it
    # whole and the rows fit beside both layers' own (the producer re-tiled around them): it
    # then never goes to DRAM. Before alternating, which must leave the shared rows in place.
    tiles, on_chip, reserved = keep_on_chip(lowered, tiles, arch, sole_readers)
    # Alternate layers between the bottom and the top of the local memories, so that the next
    # layer's weights load while this one still computes.
    tiles = alternate(tiles, arch, reserved)
    # Codegen before DRAM planning: it packs the constants (and pre-padded inputs), so it fixes
    # the image size; DRAM addresses stay relative to each activation until the plan places them.
    image, steps, padded, constants = generate(lowered, tiles, arch, options, on_chip, progress)
    # Place activations above the image, reusing buffers by liveness; kept tensors get none
    # (constant operands are in the image).
    progress("planning DRAM", 0, None)
    plan = plan_dram(lowered, image.size_bytes, arch.dram.size_bytes, qgraph.name,
                     set(padded) | set(on_chip))
    sizes = {name: t.size_bytes for name, t in lowered.tensors.items()}
    steps = [relocate(layer_steps, {**plan.addresses, **constants}, sizes)
             for layer_steps in steps]
    # Schedule last: tokens come from hazards on final addresses (local rows and DRAM bytes).
    scheduled = schedule(steps, arch, options.double_buffer, progress)
    # A target's vector unit may implement only some operations: a program that needs another
    # is refused here, naming the node, not when it runs.
    # (Whether it lacks an instruction depends on its row: looked for only when one lacks.)
    rows = {insn.op: insn for insn in scheduled.instructions}
    lacking = any(map(arch.vector_lacks, rows.values())) and next(
        (insn, node) for insn, node in zip(scheduled.instructions, scheduled.source)
        if arch.vector_lacks(insn))
    if lacking:
        insn, node = lacking
        raise CompileError(f"{qgraph.name}: node {node!r} needs the vector unit's "
                           f"{insn.op.mnemonic}, which target {arch.name!r} lacks (its vector.ops: "
                           f"{', '.join(arch.vector.ops) or 'none'})")
    inputs, outputs = (tuple(unsigned_io(b, qgraph) for b in side)
                       for side in bindings(lowered, plan, padded))
    meta = {"compiler": {"options": options.to_dict(), "layers": len(lowered.layers)},
            **(metadata or {})}
    # The model's MACs (a grouped convolution's zero blocks excluded) are the roofline's.
    model_macs = sum(layer.macs for layer in lowered.layers
                     if isinstance(layer, (ConvLayer, MatMulLayer)))
    program = Program(arch=arch, instructions=scheduled.instructions, dram_image=image.bytes(),
                      inputs=inputs, outputs=outputs, source=scheduled.source, metadata=meta,
                      host_segments=host_segments(lowered, plan), model_macs=model_macs)
    progress("summarizing", 0, None)
    return Compiled(program, summarize(lowered, plan, scheduled, program, tiles))
