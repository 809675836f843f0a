"""A convolution's output-channel block whose weights are all zero (a dead channel alone in the
last block, as an STFT's imaginary part has at the Nyquist bin) has its accumulator rows cleared
by a broadcast LOAD instead of a COMPUTE. That LOAD was a step's prefetch, and prefetches run
before the work of the previous loading step: on the second image it cleared the rows (of the
same parity) that the first channel block was about to use, then the dead block read that
block's sums (-128 where the reference had -12). The LOAD is part of the work now
(`codegen.convolution`); found splitting silero-vad's STFT per part."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from ember.flow import CompileOptions, compile_model, optimized_graph
from tests.e2e.flow import check_bit_exact
from tests.onnx_builder import model
from tests.quantizer.util import profile_of

B, C = 2, 33  # two images; two channel blocks of 16 and one of a single channel


def dead_last_channel():
    """x [2, 3, 1, 41] → Conv [1, 5] stride 2 to 33 channels, the last one's weights all zero:
    two channel blocks of 16, then one holding the dead channel alone."""
    w = np.random.default_rng(0).normal(0, 1, (C, 3, 1, 5)).astype(np.float32)
    w[C - 1] = 0.0
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", strides=[1, 2])]
    return model(nodes, {"x": [B, 3, 1, 41]}, {"y": [B, C, 1, 19]}, {"w": w})


def samples(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (B, 3, 1, 41)).astype(np.float32)} for _ in range(count)]


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow),
                                    pytest.param("large", marks=pytest.mark.slow)])
def test_a_dead_channel_alone_in_its_block_is_bit_exact_on_every_image(preset: str) -> None:
    proto = dead_last_channel()
    profile = profile_of(proto, samples(4, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions(), preset)
    check_bit_exact(built.qgraph, built.compiled, samples(2, 1))
