"""A fused Q/K/V projection as PaddleOCR's SVTR and timm's ViT export it (`qkv` [B, S, 3C] →
Reshape [B, S, 3, H, Dh] → Transpose [3, B, H, S, Dh] → Slice + Squeeze per part): the
`split_fused_heads` pass leaves no rank-5 value, the fp32 output unchanged, and the attention
runs whole on the accelerator, bit-exact."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_constants import fold_constants
from compiler.passes.split_fused_heads import split_fused_heads
from tests.e2e.flow import compile_and_check
from tests.onnx_builder import model


def fused_attention(tokens: int = 10, width: int = 24, heads: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    dh = width // heads
    inits = {"w": (rng.standard_normal((width, 3 * width)) / np.sqrt(width)).astype(np.float32),
             "b": (rng.standard_normal(3 * width) * 0.1).astype(np.float32),
             "split": np.array([1, tokens, 3, heads, dh], np.int64),
             "merged": np.array([1, tokens, width], np.int64),
             "scale": np.float32(dh ** -0.5), "axis0": np.array([0], np.int64)}
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["qkv0"]), n("Add", ["qkv0", "b"], ["qkv"]),
             n("Reshape", ["qkv", "split"], ["r5"]),
             n("Transpose", ["r5"], ["t5"], perm=[2, 0, 3, 1, 4])]
    for i, part in enumerate("qkv"):
        inits[f"s{i}"], inits[f"e{i}"] = np.array([i], np.int64), np.array([i + 1], np.int64)
        nodes += [n("Slice", ["t5", f"s{i}", f"e{i}", "axis0"], [f"{part}5"]),
                  n("Squeeze", [f"{part}5", "axis0"], [part])]
    nodes += [n("Mul", ["q", "scale"], ["qs"]),
              n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              n("MatMul", ["qs", "kt"], ["scores"]), n("Softmax", ["scores"], ["p"], axis=-1),
              n("MatMul", ["p", "v"], ["ctx"]),
              n("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ctxt", "merged"], ["y"])]
    return model(nodes, {"x": [1, tokens, width]}, {"y": [1, tokens, width]}, inits)


def test_the_pass_leaves_no_rank_5_value_and_the_same_fp32() -> None:
    graph = fold_constants(import_model(fused_attention()))
    split = eliminate_dead(split_fused_heads(graph))
    assert max(split.type_of(o).rank for n in split.nodes for o in n.outputs) == 4
    x = {"x": np.random.default_rng(1).standard_normal((1, 10, 24)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(split, x)["y"], evaluate(graph, x)["y"], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("preset", ["edge", "default", "large"])
def test_fused_attention_runs_whole_on_the_accelerator(preset: str) -> None:
    compiled, _ = compile_and_check(fused_attention(), preset)
    assert compiled.program.host_segments == ()
