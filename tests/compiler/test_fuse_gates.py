"""Gate fusion: activations written out in primitive operators become one lookup operator,
equal to onnxruntime on the original graph, and run on the accelerator with no host segment."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.fuse_gates import fuse_gates
from compiler.pipeline import optimize
from ember import ort
from ember.compare import max_relative_error
from tests.e2e.flow import compile_and_check
from tests.onnx_builder import model, weights

n = helper.make_node
SCALARS = {"three": 3.0, "zero": 0.0, "six": 6.0, "one": 1.0, "half": 0.5,
           "sqrt2": float(np.sqrt(2.0)), "cubic": 0.044715, "sqrt2pi": float(np.sqrt(2 / np.pi))}

WRITTEN_OUT = {  # name → (nodes from c to y, the operator and attributes they become)
    "silu": ([n("Sigmoid", ["c"], ["s"], name="sig"), n("Mul", ["c", "s"], ["y"], name="mul")],
             "Swish", {}),
    "hard-swish": ([n("HardSigmoid", ["c"], ["s"], alpha=1 / 6, beta=0.5, name="hs"),
                    n("Mul", ["c", "s"], ["y"], name="mul")], "HardSwish", {}),
    "hard-swish, torch": ([n("Add", ["c", "three"], ["a"], name="add3"),
                           n("Clip", ["a", "zero", "six"], ["r6"], name="relu6"),
                           n("Mul", ["c", "r6"], ["m"], name="mul"),
                           n("Div", ["m", "six"], ["y"], name="div6")], "HardSwish", {}),
    "hard-sigmoid, torch": ([n("Add", ["c", "three"], ["a"], name="add3"),
                             n("Clip", ["a", "zero", "six"], ["r6"], name="relu6"),
                             n("Div", ["r6", "six"], ["y"], name="div6")],
                            "HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}),
    "mish": ([n("Softplus", ["c"], ["sp"], name="softplus"), n("Tanh", ["sp"], ["t"], name="tanh"),
              n("Mul", ["c", "t"], ["y"], name="mul")], "Mish", {}),
    "gelu": ([n("Div", ["c", "sqrt2"], ["d"], name="div"), n("Erf", ["d"], ["e"], name="erf"),
              n("Add", ["e", "one"], ["a"], name="add"), n("Mul", ["c", "a"], ["m"], name="mul"),
              n("Mul", ["m", "half"], ["y"], name="half")], "Gelu", {"approximate": "none"}),
    # transformers' gelu_new: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
    "gelu, tanh": ([n("Pow", ["c", "three"], ["p"], name="cube"),
                    n("Mul", ["p", "cubic"], ["q"], name="scale3"),
                    n("Add", ["c", "q"], ["s"], name="inner"),
                    n("Mul", ["s", "sqrt2pi"], ["t"], name="scale"),
                    n("Tanh", ["t"], ["th"], name="tanh"), n("Add", ["th", "one"], ["a"], name="add"),
                    n("Mul", ["c", "half"], ["hc"], name="halfx"),
                    n("Mul", ["hc", "a"], ["y"], name="mul")], "Gelu", {"approximate": "tanh"}),
}


def conv_then(nodes, outputs=("y",)):
    rng = np.random.default_rng(0)
    inits = {"w": weights(rng, 4, 3, 3, 3), "b": weights(rng, 4),
             **{k: np.array(v, np.float32) for k, v in SCALARS.items()}}
    conv = n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv")
    return model([conv, *nodes], {"x": [1, 3, 8, 8]}, {o: [1, 4, 8, 8] for o in outputs},
                 inits)


@pytest.mark.parametrize("name", sorted(WRITTEN_OUT))
def test_a_written_out_activation_becomes_one_operator(name: str) -> None:
    nodes, op, attrs = WRITTEN_OUT[name]
    proto = conv_then(nodes)
    graph = optimize(import_model(proto))
    (fused,) = [node for node in graph.nodes if node.op != "Conv"]
    assert (fused.op, fused.attrs, fused.name, fused.outputs) == (op, attrs, nodes[-1].name,
                                                                  ("y",))
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32) * 3
    for sample in x:
        feed = {"x": sample[None]}
        assert max_relative_error(evaluate(graph, feed)["y"],
                                  ort.run(ort.session(proto), feed)["y"]) <= 1e-5


@pytest.mark.parametrize("name", ["silu", "hard-swish, torch"])
def test_a_fused_activation_runs_on_the_accelerator(name: str) -> None:
    compiled, _ = compile_and_check(conv_then(WRITTEN_OUT[name][0]), "default")
    assert compiled.program.host_segments == ()


def test_a_region_no_operator_computes_stays() -> None:
    graph = import_model(conv_then([n("Tanh", ["c"], ["t"], name="tanh"),
                                    n("Mul", ["c", "t"], ["y"], name="mul")]))
    assert fuse_gates(graph) is graph


def test_a_region_whose_inner_value_is_read_elsewhere_stays() -> None:
    nodes = [n("Sigmoid", ["c"], ["s"], name="sig"), n("Mul", ["c", "s"], ["y"], name="mul")]
    graph = import_model(conv_then(nodes, outputs=("y", "s")))
    assert fuse_gates(graph) is graph
