"""LayerNormalization on the accelerator: integer mean, variance and square root over each row
(`numerics.layer_norm`, the vector unit's LAYERNORM), gamma and beta per channel; bit-exact on
every preset, with no host segment, for rows narrower and wider than the lanes, after a
residual Add as transformers place it; and within int8's own error of fp32."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.graph.int8 import layer_norm_params
from simulator import numerics
from tests.e2e.flow import compile_and_check
from tests.onnx_builder import model


def norm_block(tokens: int = 6, width: int = 40, seed: int = 0, residual: bool = True):
    """x [1, T, D] → MatMul → (+ x) → LayerNormalization (gamma, beta) → y."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.normal(0, 0.3, (width, width)).astype(np.float32),
             "gamma": rng.uniform(-1.5, 1.5, width).astype(np.float32),
             "beta": rng.normal(0, 0.2, width).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"])]
    if residual:
        nodes.append(helper.make_node("Add", ["h", "x"], ["s"]))
    nodes.append(helper.make_node("LayerNormalization", ["s" if residual else "h", "gamma",
                                                         "beta"], ["y"], name="norm",
                                  epsilon=1e-5))
    return model(nodes, {"x": [1, tokens, width]}, {"y": [1, tokens, width]}, inits)


@pytest.mark.parametrize("preset", ["edge", "default", "large"])
@pytest.mark.parametrize("width", [12, 40])
def test_layer_norm_runs_whole_on_the_accelerator(preset: str, width: int) -> None:
    compiled, _ = compile_and_check(norm_block(width=width), preset)
    assert compiled.program.host_segments == ()
    assert any(insn.op.mnemonic == "LAYERNORM" for insn in compiled.program.instructions)


def test_the_integer_kernel_is_within_int8s_error_of_fp32() -> None:
    rng = np.random.default_rng(0)
    for width in (32, 128, 768):
        x = rng.normal(0.5, 3, (64, width))
        s_x, s_y = 0.05, 4 / 127
        q = np.clip(np.round(x / s_x), -128, 127)
        real = q * s_x
        gamma, beta = rng.uniform(0.5, 1.5, width), rng.normal(0, 0.1, width)
        ref = (real - real.mean(-1, keepdims=True)) / np.sqrt(
            real.var(-1, keepdims=True) + 1e-5) * gamma + beta
        table = layer_norm_params(gamma, beta, 1e-5, width, s_x, s_y).astype(np.int64)
        y = numerics.layer_norm(q.astype(np.int8), table[0], table[1:1 + width],
                                table[1 + width:1 + 2 * width], table[1 + 2 * width:])
        error = ref - y * s_y
        assert 10 * np.log10((ref**2).sum() / (error**2).sum()) > 35, width


def test_isqrt_is_exact() -> None:
    values = np.array([0, 1, 2, 3, 4, 15, 16, 17, 2**62 - 1, 10**18, 99999999999], np.int64)
    import math
    assert list(numerics.isqrt(values)) == [math.isqrt(int(v)) for v in values]


def test_a_dead_channels_tiny_gamma_outputs_its_bias() -> None:
    """A pretrained model's LayerNorm may hold gammas of 1e-30 (all-MiniLM-L6-v2 does): the
    ratio is under quantize_multiplier's 2^-32, the product rounds to 0 either way, so the
    channel's multiplier is 0 and it outputs its bias, as in fp32; a huge gamma saturates."""
    width = 8
    gamma = np.full(width, 1.0)
    gamma[2], gamma[5] = 1e-30, 1e12
    beta = np.linspace(-0.5, 0.5, width)
    table = layer_norm_params(gamma, beta, 1e-5, width, 0.05, 0.02).astype(np.int64)
    multipliers = table[1:1 + width]
    assert multipliers[2] == 0 and multipliers[5] > 0
    x = np.random.default_rng(0).integers(-100, 100, (4, width)).astype(np.int8)
    y = numerics.layer_norm(x, table[0], multipliers, table[1 + width:1 + 2 * width],
                            table[1 + 2 * width:], 0)
    np.testing.assert_array_equal(y[:, 2], np.round(beta[2] / 0.02))
    assert set(y[:, 5].tolist()) <= {-128, 127}  # saturated
