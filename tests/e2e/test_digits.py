"""The digits CNN end to end (profile → optimize → quantize → compile → simulate) on all
three presets: on every eval sample the program's int8 logits equal `run_int8`'s bit for bit."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
import pytest

from compiler.backend.program import BackendOptions
from compiler.pipeline import compile_int8
from simulator.arch import Arch
from tests.cli import DIGITS
from tests.e2e.flow import check_bit_exact, quantized

PRESETS = ("default", "large", "edge")


@lru_cache(maxsize=None)
def digits():
    proto = onnx.load(DIGITS / "model.onnx")
    calib = np.load(DIGITS / "calib.npz")["input"]
    qgraph = quantized(proto, [{"input": calib[i:i + 1]} for i in range(len(calib))])
    samples = np.load(DIGITS / "eval.npz")["input"]
    return qgraph, [{"input": samples[i:i + 1]} for i in range(len(samples))]


@lru_cache(maxsize=None)
def compiled(preset: str, double_buffer: bool = True):
    return compile_int8(digits()[0], Arch.load(preset), BackendOptions(double_buffer))


@pytest.mark.parametrize("preset", PRESETS)
def test_digits_bit_exact_on_a_sample_of_eval(preset: str) -> None:
    qgraph, feeds = digits()
    check_bit_exact(qgraph, compiled(preset), feeds[::15])


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("double_buffer", [True, False])
def test_digits_bit_exact_on_every_eval_sample(preset: str, double_buffer: bool) -> None:
    qgraph, feeds = digits()
    check_bit_exact(qgraph, compiled(preset, double_buffer), feeds)


def test_same_inputs_give_byte_identical_programs() -> None:
    qgraph, _ = digits()
    first = compile_int8(qgraph, Arch.load("edge")).program.to_bytes()
    again = compile_int8(qgraph, Arch.load("edge")).program.to_bytes()
    assert first == again


def test_flatten_is_a_view_and_every_instruction_names_its_layer() -> None:
    program = compiled("default").program
    layers = {name for name in program.source if name}
    assert layers == {"conv1", "conv2", "pool", "fc"}  # no flatten: it costs no instruction
    assert program.source[-1] == ""  # END


def test_double_buffering_overlaps_dma_with_compute() -> None:
    qgraph, feeds = digits()
    on = check_bit_exact(qgraph, compiled("edge", True), feeds[:1])
    off = check_bit_exact(qgraph, compiled("edge", False), feeds[:1])
    assert on.stats.cycles < off.stats.cycles
