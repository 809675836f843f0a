"""The int8 backend's pieces: lowering rules and errors, tiles chosen from the Arch, implicit
im2col, DRAM reuse by liveness, and tokens derived from hazards."""

from __future__ import annotations

import dataclasses
import gc

import pytest
from onnx import helper

from compiler.backend.layers import ConvLayer
from compiler.backend.lower import lower
from compiler.backend.program import BackendOptions
from compiler.backend.schedule import schedule
from compiler.backend.steps import Op, Step
from compiler.backend.tiling import active_blocks, ceil_div, tile
from compiler.errors import CompileError
from compiler.pipeline import compile_int8
from quantizer.options import QuantOptions
from simulator import isa, machine
from simulator.arch import Arch, Memory, Queues
from simulator.program import Program
from tests.e2e import models
from tests.e2e.flow import check_bit_exact, quantized, samples
from tests.onnx_builder import model

EDGE = Arch.load("edge")


def _qgraph(build):
    proto = build()
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in proto.graph.input}
    return quantized(proto, samples(shapes, 4))


def test_big_conv_is_tiled_on_every_dimension_on_edge() -> None:
    conv = next(layer for layer in lower(_qgraph(models.big_conv)).layers
                if isinstance(layer, ConvLayer))
    tiles = tile(conv, EDGE)
    assert tiles.in_block == EDGE.array.rows and ceil_div(conv.in_channels, tiles.in_block) == 3
    assert tiles.out_block == EDGE.lanes and ceil_div(conv.out_channels, tiles.out_block) == 3
    assert tiles.tile_hw[0] < conv.out_hw[0]  # several pixel tiles: 19 x 23 outputs
    assert 2 * tiles.acc.rows + 2 * tiles.params.rows <= EDGE.accumulator.rows
    assert tiles.inputs.end <= EDGE.scratchpad.rows


def test_conv_uses_implicit_im2col() -> None:
    """The input is read once per output-channel block (plus the halo of its tiles), never
    as kernel-size-times-larger im2col columns."""
    qgraph = _qgraph(models.big_conv)
    conv = next(layer for layer in lower(qgraph).layers if isinstance(layer, ConvLayer))
    program = compile_int8(qgraph, Arch.load("default")).program
    input_bytes = sum(insn.op.work(program.arch, insn).dram_read
                      for insn, src in zip(program.instructions, program.source)
                      if src == "conv" and insn.op is isa.LOAD and insn.args["mem"] == 0
                      and insn.args["elem_bytes"] != insn.args["x_stride"])
    x_bytes = conv.in_channels * conv.in_hw[0] * conv.in_hw[1]
    out_blocks = ceil_div(conv.out_channels, 16)
    assert input_bytes <= 1.5 * out_blocks * x_bytes
    assert input_bytes < conv.kernel[0] * conv.kernel[1] * x_bytes


def test_depthwise_skips_all_zero_weight_tiles() -> None:
    conv = next(layer for layer in lower(_qgraph(models.mobile_block)).layers
                if layer.node == "depthwise")
    blocks = active_blocks(conv, 8, 8)
    assert all(len(b) == 1 for b in blocks)  # block-diagonal: one input block per output block


def test_unsupported_op_names_the_node_and_suggests_keep_fp32() -> None:
    proto = model([helper.make_node("Softmax", ["x"], ["y"], name="probabilities", axis=0)],
                  {"x": [2, 1, 1, 1, 10]}, {"y": [2, 1, 1, 1, 10]})  # rank 5: no lowering
    qgraph = quantized(proto, samples({"x": [2, 1, 1, 1, 10]}, 4))
    with pytest.raises(CompileError, match=r"'probabilities' \(Softmax\).*--keep-fp32"):
        compile_int8(qgraph, EDGE)
    assert gc.isenabled()  # compile_int8 pauses the cycle collector only while it runs


def test_smallest_tile_that_does_not_fit_names_layer_memory_and_sizes() -> None:
    tiny = dataclasses.replace(EDGE, scratchpad=Memory(size_bytes=8 * 40, row_bytes=8))
    with pytest.raises(CompileError, match=r"layer 'conv'.*smallest tile.*scratchpad rows"):
        compile_int8(_qgraph(models.big_conv), tiny)


def test_model_too_large_for_dram_is_an_error() -> None:
    small = dataclasses.replace(EDGE, dram=dataclasses.replace(EDGE.dram, size_bytes=4096))
    with pytest.raises(CompileError, match=r"needs \d+ bytes of DRAM.*has 4096"):
        compile_int8(_qgraph(models.big_conv), small)


def test_dram_buffers_are_reused_by_liveness() -> None:
    qgraph = _qgraph(models.mobile_block)
    summary = compile_int8(qgraph, EDGE).summary
    total = sum(t.size_bytes for t in lower(qgraph).tensors.values())
    assert summary.activation_lower_bound_bytes <= summary.activation_peak_bytes < total


def test_tokens_come_from_hazards() -> None:
    """A load, a compute that reads it and a store of a vector result: the scheduler adds
    the tokens (and a SYNC relay from load to vector), and the machine's race check agrees."""
    arch = Arch.load("default")

    def op(row, **args):
        return Op(row, args, "t")
    data = [op(isa.LOAD, mem="scratchpad", sram=0, dram=0, y_size=1, x_size=1, elem_bytes=16,
               x_stride=16, y_stride=16),
            op(isa.LUT, src=0, dst=1, rows=1, table=0),
            op(isa.STORE, mem="scratchpad", sram=1, dram=64, y_size=1, x_size=1, elem_bytes=16,
               x_stride=16, y_stride=16)]
    scheduled = schedule([[Step(tuple(data[:1]), tuple(data[1:]))]], arch)
    mnemonics = [i.op.mnemonic for i in scheduled.instructions]
    assert mnemonics == ["LOAD", "SYNC", "LUT", "STORE", "END"]
    assert scheduled.syncs == 1
    machine.run(Program(arch=arch, instructions=scheduled.instructions))


def test_double_buffer_off_uses_one_buffer_per_region() -> None:
    qgraph = _qgraph(models.big_conv)
    on = compile_int8(qgraph, EDGE).program
    off = compile_int8(qgraph, EDGE, BackendOptions(double_buffer=False)).program

    def rows(program):
        return {insn.args["sram"] for insn in program.instructions
                if insn.op is isa.LOAD and insn.args["mem"] == 0}
    assert len(rows(off)) < len(rows(on))


def test_first_conv_packs_kernel_taps_into_k() -> None:
    """A 3-channel model input read by a 3x3 conv: three kernel columns share one weight tile
    (k = 9), read from a zero-point-padded copy of the input in the DRAM image."""
    qgraph = _qgraph(models.strided)  # x: 3 channels, 3x3 kernel
    program = compile_int8(qgraph, Arch.load("default")).program
    computes = [insn for insn, src in zip(program.instructions, program.source)
                if src == "down" and insn.op is isa.COMPUTE]
    assert {insn.args["k"] for insn in computes} == {9}  # 3 columns x 3 channels
    binding = program.inputs[0]
    assert binding.dram < len(program.dram_image)  # lives in the image, inside its border
    assert binding.strides[2] > binding.shape[3] * binding.shape[1]  # padded rows


def test_consecutive_layers_use_opposite_ends_of_local_memory() -> None:
    qgraph = _qgraph(models.mobile_block)
    program = compile_int8(qgraph, EDGE).program
    first_rows = {}
    for insn, src in zip(program.instructions, program.source):
        if insn.op is isa.LOAD and insn.args["mem"] == 0:
            first_rows.setdefault(src, insn.args["sram"])
    rows = [first_rows[name] for name in ("expand", "depthwise", "project")]
    assert rows[0] < EDGE.scratchpad.rows // 2 <= rows[1] and rows[2] < rows[1]


@pytest.mark.parametrize("double_buffer", [True, False])
def test_one_token_fifos_never_deadlock(double_buffer: bool) -> None:
    """With FIFOs one token deep, the scheduler moves pushes later (or adds SYNCs) so that the
    program order never overflows a FIFO; the machine then never deadlocks."""
    arch = dataclasses.replace(EDGE, queues=Queues(token_depth=1))
    proto = models.big_conv()
    qgraph = _qgraph(models.big_conv)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in proto.graph.input}
    check_bit_exact(qgraph, compile_int8(qgraph, arch, BackendOptions(double_buffer)),
                    samples(shapes, 1, 3))


def test_nodes_kept_in_fp32_are_named_and_need_allow_host() -> None:
    proto = models.mobile_block()
    shapes = {"x": [1, 12, 9, 11]}
    qgraph = quantized(proto, samples(shapes, 3), QuantOptions(keep_fp32=("gap",)))
    with pytest.raises(CompileError, match=r"^node 'gap' \(GlobalAveragePool\).*--allow-host"):
        compile_int8(qgraph, EDGE)


def test_whole_layer_plan_reads_the_input_once() -> None:
    """A 1x1 expansion to 5 output blocks on edge keeps all its weights loaded and reads each
    input pixel once, instead of once per output-channel block."""
    qgraph = _qgraph(models.mobile_block)
    expand = next(layer for layer in lower(qgraph).layers if layer.node == "expand")
    assert tile(expand, EDGE).whole_layer
    program = compile_int8(qgraph, EDGE).program
    read = sum(insn.op.work(EDGE, insn).dram_read
               for insn, src in zip(program.instructions, program.source)
               if src == "expand" and insn.op is isa.LOAD and insn.args["mem"] == 0
               and insn.args["x_size"] > 1)  # pixels along x; weight loads have one column
    assert read == expand.in_channels * expand.in_hw[0] * expand.in_hw[1]
