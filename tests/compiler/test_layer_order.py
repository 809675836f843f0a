"""The layer order that keeps little memory live (`compiler.backend.layer_order`), and the DRAM
placement that packs the arena to its bound (`compiler.backend.memory.greedy_by_size`)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from compiler.backend.layer_order import depth_first, order_for_memory
from compiler.backend.lower import lower
from compiler.backend.memory import greedy_by_size, live_ranges, plan_dram
from tests.e2e.flow import compile_and_check, quantized, samples
from tests.onnx_builder import model

_NO_LIMIT = 1 << 40


def two_branches(seed: int = 0):
    """Two branches that widen the map (1x1 convs to 40 channels) then narrow it, listed by
    the model interleaved: the graph's order keeps both wide maps alive at once."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)

    nodes = [helper.make_node("Conv", ["x", "wa"], ["a1"], name="a_wide"),
             helper.make_node("Conv", ["x", "wb"], ["b1"], name="b_wide"),
             helper.make_node("Conv", ["a1", "wa2"], ["a2"], name="a_narrow"),
             helper.make_node("Conv", ["b1", "wb2"], ["b2"], name="b_narrow"),
             helper.make_node("Add", ["a2", "b2"], ["y"], name="join")]
    return model(nodes, {"x": [1, 4, 12, 12]}, {"y": [1, 4, 12, 12]},
                 {"wa": w(40, 4, 1, 1), "wb": w(40, 4, 1, 1), "wa2": w(4, 40, 1, 1),
                  "wb2": w(4, 40, 1, 1)})


def _lowered():
    return lower(quantized(two_branches(), samples({"x": [1, 4, 12, 12]}, 4)))


def test_depth_first_order_finishes_a_branch_before_the_next() -> None:
    lowered = _lowered()
    names = [layer.node for layer in lowered.layers]
    assert names == ["a_wide", "b_wide", "a_narrow", "b_narrow", "join"]
    order = [names[i] for i in depth_first(lowered)]
    assert order in (["a_wide", "a_narrow", "b_wide", "b_narrow", "join"],
                     ["b_wide", "b_narrow", "a_wide", "a_narrow", "join"])
    naive = plan_dram(lowered, 0, _NO_LIMIT, "m")
    ordered = plan_dram(order_for_memory(lowered), 0, _NO_LIMIT, "m")
    wide = 40 * 12 * 12
    assert naive.lower_bound_bytes >= 2 * wide  # both wide maps at once
    assert ordered.lower_bound_bytes < wide + 3 * 4 * 12 * 12 + 64
    assert ordered.peak_bytes < naive.peak_bytes


def test_reordered_program_is_bit_exact_and_deterministic() -> None:
    compiled, _ = compile_and_check(two_branches(), "edge")
    assert compiled.summary.activation_peak_bytes < 2 * 40 * 12 * 12
    again, _ = compile_and_check(two_branches(), "edge")
    assert again.program.to_bytes() == compiled.program.to_bytes()


def test_a_chain_keeps_the_graph_order() -> None:
    lowered = lower(quantized(two_branches(), samples({"x": [1, 4, 12, 12]}, 4)))
    chain = type(lowered)(lowered.graph, lowered.layers[::2][:2], lowered.tensors,
                          lowered.inputs, lowered.outputs)
    assert order_for_memory(chain) is chain


def test_greedy_by_size_packs_where_first_fit_fragments() -> None:
    """Lives a [0, 1] 64 B, b [0, 3] 64 B, c [2, 3] 128 B. First fit in time order puts b above
    a, and c, too big for a's freed 64 bytes, above b: 256 B. Largest first: c at 0, a at 0
    (their lives do not meet), b above both: 192 B, the bound (b and c live together)."""
    ranges = {"a": (0, 1), "b": (0, 3), "c": (2, 3)}
    sizes = {"a": 64, "b": 64, "c": 128}
    offsets, peak = greedy_by_size(ranges, sizes)
    assert peak == 192 and offsets == {"c": 0, "a": 0, "b": 128}


def test_plans_reach_the_bound_on_the_lowered_graph() -> None:
    lowered = order_for_memory(_lowered())
    plan = plan_dram(lowered, 0, _NO_LIMIT, "m")
    assert plan.peak_bytes <= plan.lower_bound_bytes + 64 * len(live_ranges(lowered))
