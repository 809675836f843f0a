"""The ONNX backend node tests, run through ember's importer and reference interpreter.

`onnx.backend.test.case.node.collect_testcases` yields every node test case that onnx ships:
a model, input data and the expected outputs (from the ONNX reference implementation). Every
case whose model uses only operators of ember's table is collected, imported with
`import_model` and run with `evaluate`; its outputs must equal the expected ones (shape, element
type, and values within the case's rtol/atol, as the ONNX backend test runner checks them).

A case that uses a feature ember does not support must be rejected with a CompileError, and is
then skipped with the reason listed in EXPECTED_UNSUPPORTED. A CompileError that is not listed
fails, and so does a listed case that compiles: the list stays exactly the set of unsupported
features. A summary of passed and skipped-by-reason counts prints at the end of the run.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from compiler.errors import CompileError
from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.graph.ops import IMPORTABLE
from ember import ort

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # generating some cases' data overflows on purpose
    from onnx.backend.test.case.node import collect_testcases

    ALL_CASES = collect_testcases(None)

CASES = [c for c in ALL_CASES
         if c.model.graph.node and {n.op_type for n in c.model.graph.node} <= IMPORTABLE]

# Case name (re.fullmatch, ignoring case) → why ember rejects it. Keep each reason short: the
# run's summary groups skips by it.
EXPECTED_UNSUPPORTED = {
    r"test_(add|sub|mul|div)_(u?int16|uint32|uint64)":
        "element type int16/uint16/uint32/uint64",
    r"test_cast(like)?_(no_saturate_|e8m0_)?.*(bfloat16|float8|float4|u?int4|u?int2).*":
        "element type bfloat16/float8/float4/int4/int2",
    r"test_identity_(sequence|opt)": "sequence and optional types",
    r"test_training_dropout.*": "training-mode Dropout",
    r"test_batchnorm_.*_training_mode": "training-mode BatchNormalization",
    r"test_maxpool_with_argmax_.*": "MaxPool Indices output",
    r"test_resize_.*cubic.*": "Resize mode cubic",
    r"test_resize_.*_antialias": "Resize antialias",
    r"test_resize_tf_crop_and_resize.*": "Resize tf_crop_and_resize",
}

# Cases where the ONNX reference and onnxruntime disagree; ember follows onnxruntime, the fp32
# oracle its accuracy reports use, so these compare against onnxruntime's outputs instead.
ONNXRUNTIME_IS_THE_ORACLE = {
    # align_corners divides by (length_resized - 1): the ONNX reference takes length_resized as
    # size × scale (4 × 0.6 = 2.4), onnxruntime as the output size (2).
    "test_resize_downsample_scales_linear_align_corners",
}


def unsupported_reason(name: str) -> str | None:
    for pattern, reason in EXPECTED_UNSUPPORTED.items():
        if re.fullmatch(pattern, name, flags=re.IGNORECASE):
            return reason
    return None


def _array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node(case) -> None:
    reason = unsupported_reason(case.name)
    initializers = {i.name for i in case.model.graph.initializer}
    input_names = [vi.name for vi in case.model.graph.input if vi.name not in initializers]
    output_names = [vi.name for vi in case.model.graph.output]
    try:
        graph = import_model(case.model)
        runs = [evaluate(graph, {n: _array(v) for n, v in zip(input_names, inputs)})
                for inputs, _ in case.data_sets]
    except CompileError as err:
        if reason is None:
            raise AssertionError(f"CompileError not listed in EXPECTED_UNSUPPORTED: {err}")
        pytest.skip(reason)
    if reason is not None:
        pytest.fail(f"listed as unsupported ({reason}) but compiles and runs: remove it from "
                    "EXPECTED_UNSUPPORTED")

    session = ort.session(case.model) if case.name in ONNXRUNTIME_IS_THE_ORACLE else None
    for (inputs, outputs), got in zip(case.data_sets, runs):
        if session is not None:
            oracle = ort.run(session, {n: _array(v) for n, v in zip(input_names, inputs)})
            outputs = [oracle[name] for name in output_names]
        for name, want in zip(output_names, outputs):
            want = _array(want)
            assert got[name].shape == want.shape, name
            assert got[name].dtype == want.dtype, name
            np.testing.assert_allclose(got[name], want, rtol=case.rtol, atol=case.atol,
                                       err_msg=name)


def test_every_listed_reason_is_used() -> None:
    """A pattern that matches no collected case is stale."""
    names = [c.name for c in CASES]
    for pattern in EXPECTED_UNSUPPORTED:
        assert any(re.fullmatch(pattern, n, flags=re.IGNORECASE) for n in names), pattern
    assert ONNXRUNTIME_IS_THE_ORACLE <= set(names)
