"""DRAM planning (`compiler.backend.memory.plan_dram`): layers whose tensors live over known
layer spans (Before) against the addresses, peak and lower bound of the plan (Expected)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backend.layers import Binding, Lowered, LutLayer, Tensor
from compiler.backend.memory import DramPlan, live_ranges, plan_dram
from compiler.errors import CompileError

IMAGE_BYTES = 1000  # the constants: activations start at the next 64-byte boundary, 1024


def _chain(sizes: dict[str, int]) -> Lowered:
    """x → lut0 → a → lut1 → b → ...: one lookup-table layer per step, each tensor read only
    by the next layer; the first is the model input, the last its output."""
    names = list(sizes)
    layers = tuple(LutLayer(f"lut{i}", x, y, sizes[y], np.zeros(256, np.int8))
                   for i, (x, y) in enumerate(zip(names, names[1:])))

    def binding(name: str) -> Binding:
        return Binding(name, name, (sizes[name],), 1.0, 0, (1,))
    return Lowered("chain", layers, {name: Tensor(name, size) for name, size in sizes.items()},
                   (binding(names[0]),), (binding(names[-1]),))


CHAIN = {"x": 100, "a": 200, "b": 100, "y": 50}


def test_a_chain_reuses_the_bytes_of_tensors_no_longer_live() -> None:
    """Lives (layer spans): x [-1, 0] (written by the host), a [0, 1], b [1, 2], y [2, 3]
    (read by the host after the last layer). In 64-byte units x 2, a 4, b 2, y 1. Placed in
    order: x at 0, a above it at 128; b after x died, at 0; y after a died, at 128. Peak 384;
    the bound is the most bytes live at once, x + a or a + b: 300."""
    lowered = _chain(CHAIN)
    assert live_ranges(lowered) == {"x": (-1, 0), "a": (0, 1), "b": (1, 2), "y": (2, 3)}
    expected = DramPlan(addresses={"x": 1024, "a": 1024 + 128, "b": 1024, "y": 1024 + 128},
                        image_bytes=IMAGE_BYTES, arena_base=1024, peak_bytes=384,
                        lower_bound_bytes=300, total_bytes=1024 + 384)
    assert plan_dram(lowered, IMAGE_BYTES, 1 << 20, "chain") == expected


def test_a_tensor_kept_out_of_dram_gets_no_address_and_leaves_the_bound() -> None:
    """`a` kept in the scratchpad (or stored in the image): the rest pack into 2 + 2 units, x
    and b never live together, y above b."""
    plan = plan_dram(_chain(CHAIN), IMAGE_BYTES, 1 << 20, "chain", in_image={"a"})
    assert plan.addresses == {"x": 1024, "b": 1024, "y": 1024 + 128}
    assert (plan.peak_bytes, plan.lower_bound_bytes) == (192, 150)


def test_a_plan_larger_than_the_dram_names_the_model_and_the_sizes() -> None:
    with pytest.raises(CompileError, match=r"model 'chain' needs 1408 bytes of DRAM \(1000 of "
                                           r"weights and constants, 384 of activations\) but "
                                           r"the target has 1407"):
        plan_dram(_chain(CHAIN), IMAGE_BYTES, 1407, "chain")
