"""On-chip reuse (`compiler.backend.reuse`): an activation only the next layer reads stays in the
scratchpad when that layer loads it whole. The producer's STOREs and the consumer's LOADs of it
disappear, it gets no DRAM buffer, and the program stays bit-exact on every preset, with double
buffering on and off; a tensor read twice, or a model output, still goes to DRAM."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import compiler.pipeline
from compiler.backend.reuse import keep_on_chip
from simulator import isa
from tests.e2e.flow import compile_and_check
from tests.e2e.models import chain
from tests.onnx_builder import model
from tests.onnx_builder import weights as _w

PRESETS = ("default", "edge", "large")


def gemms(seed: int = 1):
    """MatMul → MatMul: rows of a matrix, the second reading the first's rows in order."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"], name="mm1"),
             helper.make_node("MatMul", ["m", "w2"], ["y"], name="mm2")]
    return model(nodes, {"x": [6, 21]}, {"y": [6, 9]},
                 {"w1": _w(rng, 21, 17), "w2": _w(rng, 17, 9)})


def read_twice(seed: int = 2):
    """conv1's output feeds conv2 and the Add, and conv2's is also a model output: both stay
    in DRAM."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="conv1", pads=[1] * 4),
             helper.make_node("Conv", ["a", "w2", "b2"], ["z"], name="conv2", pads=[1] * 4),
             helper.make_node("Add", ["a", "z"], ["y"], name="add")]
    return model(nodes, {"x": [1, 4, 6, 7]}, {"y": [1, 4, 6, 7], "z": [1, 4, 6, 7]},
                 {"w1": _w(rng, 4, 4, 3, 3), "b1": _w(rng, 4), "w2": _w(rng, 4, 4, 3, 3),
                  "b2": _w(rng, 4)})


def _dma(compiled, node: str, op) -> int:
    program = compiled.program
    return sum(1 for insn, source in zip(program.instructions, program.source)
               if source == node and insn.op is op)


def _without_reuse(monkeypatch):
    monkeypatch.setattr(compiler.pipeline, "keep_on_chip",
                        lambda lowered, tiles, arch, packable=(): (tiles, {}, [0] * len(tiles)))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("double_buffer", [True, False])
def test_chain_keeps_tensors_on_chip_bit_exact(preset: str, double_buffer: bool) -> None:
    compiled, _ = compile_and_check(chain(), preset, double_buffer=double_buffer)
    if preset == "default":  # everything fits: conv1 → conv2 and conv3 → pool are kept
        for producer, consumer in (("conv1", "conv2"), ("conv3", "pool")):
            assert _dma(compiled, producer, isa.STORE) == 0, producer
            assert _dma(compiled, consumer, isa.LOAD) < 3, consumer


@pytest.mark.parametrize("preset", PRESETS)
def test_gemm_chain_bit_exact(preset: str) -> None:
    compiled, _ = compile_and_check(gemms(), preset)
    if preset != "large":  # there the cost model streams mm2's input: no whole-input plan
        assert _dma(compiled, "mm1", isa.STORE) == 0


def test_kept_tensors_leave_dram(monkeypatch) -> None:
    kept, _ = compile_and_check(chain(), "default", count=1)
    _without_reuse(monkeypatch)
    plain, _ = compile_and_check(chain(), "default", count=1)
    assert _dma(plain, "conv1", isa.STORE) > 0
    assert kept.summary.dram_bytes_moved < plain.summary.dram_bytes_moved
    assert kept.summary.activation_peak_bytes < plain.summary.activation_peak_bytes
    assert kept.summary.activation_lower_bound_bytes < plain.summary.activation_lower_bound_bytes


@pytest.mark.parametrize("preset", ("default", "edge"))
def test_a_tensor_read_twice_or_a_model_output_stays_in_dram(preset: str) -> None:
    compiled, _ = compile_and_check(read_twice(), preset)
    assert _dma(compiled, "conv1", isa.STORE) > 0
    assert _dma(compiled, "conv2", isa.STORE) > 0


def test_keep_on_chip_reserves_the_rows_in_both_plans() -> None:
    from compiler.backend.lower import lower
    from compiler.backend.tiling import Region, alternate, tile
    from simulator.arch import Arch
    from tests.e2e.flow import quantized, samples
    qgraph = quantized(chain(), samples({"x": [1, 5, 10, 12]}, 4))
    arch = Arch.load("default")
    lowered = lower(qgraph)
    tiles, kept, reserved = keep_on_chip(lowered, [tile(l, arch) for l in lowered.layers], arch)
    assert set(kept) == {lowered.layers[0].y, lowered.layers[2].y}
    tiles = alternate(tiles, arch, reserved)
    for t, top in zip(tiles, reserved):
        own = [r for r in vars(t).values() if isinstance(r, Region) and not r.fixed
               and r.mem == "scratchpad"]
        assert all(r.end <= arch.scratchpad.rows - top for r in own)


def test_digits_keeps_conv1_conv2_and_pool_input_on_chip() -> None:
    from tests.e2e.flow import check_bit_exact
    from tests.e2e.test_digits import compiled, digits
    program = compiled("default")
    assert _dma(program, "conv1", isa.STORE) == _dma(program, "conv2", isa.STORE) == 0
    assert _dma(program, "pool", isa.LOAD) == 0  # max-pool: no parameters either
    qgraph, feeds = digits()
    check_bit_exact(qgraph, program, feeds[:3])
