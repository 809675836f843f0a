"""The roofline bound counts the model's MACs: a depthwise convolution's block-diagonal zero
blocks, which the array multiplies too, make the issued MACs larger but not the bound."""

from __future__ import annotations

import numpy as np
from onnx import helper

from compiler.pipeline import compile_int8
from simulator.arch import Arch
from tests.e2e.flow import check_bit_exact, quantized, samples
from tests.onnx_builder import model


def test_the_bound_counts_the_models_macs_not_the_zero_blocks() -> None:
    rng = np.random.default_rng(0)
    channels = 32
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="depthwise", group=channels,
                              pads=[1, 1, 1, 1])]
    proto = model(nodes, {"x": [1, channels, 12, 12]}, {"y": [1, channels, 12, 12]},
                  {"w": rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)})
    shapes = {"x": [1, channels, 12, 12]}
    qgraph = quantized(proto, samples(shapes, 4))
    compiled = compile_int8(qgraph, Arch.load("default"))
    stats = check_bit_exact(qgraph, compiled, samples(shapes, 1, 1)).stats
    model_macs = 12 * 12 * channels * 9
    arch = compiled.program.arch
    assert compiled.program.model_macs == model_macs
    assert stats.macs > model_macs  # the 16x16 tiles' zero blocks are issued too
    assert stats.model_macs == stats.to_report()["model_macs"] == model_macs
    dram = -(-stats.compulsory_dram_bytes // arch.dma.bytes_per_cycle)
    assert stats.bound_cycles == max(-(-model_macs // arch.macs_per_cycle), dram)
    assert compiled.summary.bound_cycles == stats.bound_cycles
