"""onnxruntime as the fp32 reference: one place that builds sessions the same way."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
import onnxruntime as ort

from ember.errors import EmberError


def session(model: onnx.ModelProto | str | bytes, threads: int = 0,
            name: str | None = None, optimize: bool = True,
            prepack: bool = True) -> ort.InferenceSession:
    """A CPU session at the basic optimization level (no contrib ops, no layout changes), or
    with `optimize` False at none (a QDQ model's fp32 arithmetic as written, no Q/DQ pair
    removed); it logs at the default logger's severity, which `ember --debug` raises (ember
    says itself what failed). `name` (the model's file, by default `model` when it is a path)
    for the error. With `prepack` False, constant weights are not repacked for the kernels,
    so a weight given as a constant sums in the same order as one computed at run time."""
    options = ort.SessionOptions()
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if optimize \
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own classes (InvalidArgument, Fail, ...)
        where = name or (model if isinstance(model, str) else "the model")
        raise EmberError(f"{where}: onnxruntime cannot load the model: {_first_line(err)}") \
            from None


def run(sess: ort.InferenceSession, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    try:
        return dict(zip(names, sess.run(names, dict(feeds))))
    except Exception as err:  # a kernel that fails on the model's own values or shapes
        raise EmberError(f"onnxruntime failed: {_first_line(err)}") from None


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
