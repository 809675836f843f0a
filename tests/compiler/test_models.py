"""The fp32 reference agrees with onnxruntime on every bundled model, before and after passes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.pipeline import optimize
from ember import ort
from ember.compare import max_relative_error
from examples import zoo
from tests.cli import DIGITS


def _digits() -> onnx.ModelProto:
    return onnx.load(DIGITS / "model.onnx")


MODELS = {"digits": _digits, "mlp": zoo.mlp, "resnet18": zoo.resnet18,
          "mobilenetv2": zoo.mobilenetv2}


@pytest.fixture(scope="module", params=sorted(MODELS))
def bundled(request):
    return request.param, MODELS[request.param]()


def test_reference_matches_onnxruntime_before_and_after_passes(bundled) -> None:
    name, proto = bundled
    graph = import_model(proto)
    optimized = optimize(graph, check=True)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(graph.type_of(n).shape).astype(np.float32)
             for n in graph.inputs}
    if name == "digits":
        with np.load(DIGITS / "eval.npz") as data:
            feeds = {"input": data["input"][:1]}
    expected = ort.run(ort.session(proto), feeds)
    for candidate in (graph, optimized):
        outputs = evaluate(candidate, feeds)
        for out in graph.outputs:
            assert max_relative_error(outputs[out], expected[out]) <= 1e-4, (name, out)


def test_passes_remove_every_batchnorm_and_shape_op(bundled) -> None:
    name, proto = bundled
    optimized = optimize(import_model(proto))
    leftover = {"BatchNormalization", "Identity", "Dropout", "Shape", "Gather", "Constant"}
    assert not leftover & set(optimized.op_counts()), name
