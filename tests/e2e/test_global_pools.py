"""Global pools over more pixels than the pooling fields' 8-bit window: their pixels, one
after another in channels-last bytes, folded into rows of a width that fits (508 as 2 x 254),
one MAXPOOL or AVGPOOL; and a global pool of a rank-3 value (a text CNN's max over positions)
as a 2-D one (`conv1d_as_2d`). Bit-exact; a width with no such factors is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.errors import CompileError
from ember.flow import CompileOptions, compile_model, optimized_graph
from simulator import isa
from tests.e2e.flow import check_bit_exact
from tests.onnx_builder import model
from tests.quantizer.util import profile_of


def pooled(op: str, shape: list[int]):
    out = shape[:2] + [1] * (len(shape) - 2)
    return model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                  helper.make_node(op, ["r"], ["y"], name="pool")],
                 {"x": shape}, {"y": out})


def samples(shape, count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(count)]


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool"])
@pytest.mark.parametrize("shape", [[1, 6, 1, 508], [1, 6, 508]])
def test_a_global_pool_wider_than_the_window_fields_runs_bit_exactly(op, shape) -> None:
    proto = pooled(op, shape)
    profile = profile_of(proto, samples(shape, 4, 0), optimized_graph(proto))
    built = compile_model(proto, profile, CompileOptions())
    windows = [(i.args["kh"], i.args["kw"]) for i in built.compiled.program.instructions
               if i.op in (isa.MAXPOOL, isa.AVGPOOL)]
    assert windows and all(kh * kw == 508 and kw <= 255 for kh, kw in windows)
    check_bit_exact(built.qgraph, built.compiled, samples(shape, 2, 1))


def test_a_prime_width_over_the_fields_is_refused_in_one_line() -> None:
    shape = [1, 6, 1, 509]  # prime: no rows of at most 255 pixels hold it
    proto = pooled("GlobalMaxPool", shape)
    profile = profile_of(proto, samples(shape, 2, 0), optimized_graph(proto))
    with pytest.raises(CompileError, match="no factors of at most 255"):
        compile_model(proto, profile, CompileOptions())
