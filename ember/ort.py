"""onnxruntime as the fp32 reference: one place that builds sessions the same way."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
import onnxruntime as ort


def session(model: onnx.ModelProto | str, threads: int = 0) -> ort.InferenceSession:
    """A CPU session at the basic optimization level (no contrib ops, no layout changes)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 4  # fatal only, as profiler.session: ember says what failed
    if threads:
        options.intra_op_num_threads = threads
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds))))
