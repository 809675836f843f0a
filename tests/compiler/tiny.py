"""Tiny quantized graphs for the backend's unit tests: an ONNX model (`tests.onnx_builder`)
imported, optimized and quantized, calibrated on a few seeded random inputs."""

from __future__ import annotations

import numpy as np
import onnx

from compiler.frontend.onnx import import_model
from compiler.graph.ir import Graph
from compiler.pipeline import optimize
from quantizer.quantize import quantize
from tests.quantizer.util import profile_of


def quantize_model(proto: onnx.ModelProto, samples: int = 4, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in proto.graph.input}
    calibration = [{name: rng.standard_normal(shape).astype(np.float32)
                    for name, shape in shapes.items()} for _ in range(samples)]
    graph = optimize(import_model(proto))
    return quantize(graph, profile_of(proto, calibration, graph))

