"""The ONNX backend node tests, run through ember's importer and reference interpreter.

`onnx.backend.test.case.node.collect_testcases` yields every node test case that onnx ships:
a model, input data and the expected outputs (from the ONNX reference implementation). Every
case whose model uses only operators of ember's table is collected, imported with
`import_model` and run with `evaluate`; its outputs must equal the expected ones (shape, element
type, and values within the case's rtol/atol, as the ONNX backend test runner checks them).

A case that uses a feature ember does not support must be rejected with the CompileError that
EXPECTED_UNSUPPORTED lists for it: a rejection for another reason fails, and so does a listed
case that compiles, so the list stays exactly the set of unsupported features. A CompileError
that is not listed fails too. A summary of the outcomes, with the rejections counted by reason,
prints at the end of the run.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from compiler.errors import CompileError
from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.graph.ops import IMPORTABLE, OPS
from ember import ort

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # generating some cases' data overflows on purpose
    from onnx.backend.test.case.node import collect_testcases

    ALL_CASES = collect_testcases(None)

CASES = [c for c in ALL_CASES
         if c.model.graph.node and {n.op_type for n in c.model.graph.node} <= IMPORTABLE]


@dataclass(frozen=True)
class Rejection:
    reason: str    # what the run's summary counts rejections by: keep it short
    message: str   # a regex the CompileError's message must contain (re.search)


_ELEMENT_TYPE = r"element type {0} is not supported|Cast to {0}: element type not supported"

# Case name (re.fullmatch, ignoring case) → the rejection ember must give it.
EXPECTED_UNSUPPORTED = {
    r"test_(add|sub|mul|div|max|min|pow_types_float32|equal|greater|less)_"
    r"(u?int16|uint32|uint64)":
        Rejection("element type int16/uint16/uint32/uint64",
                  _ELEMENT_TYPE.format(r"(?i:u?int16|uint32|uint64)")),
    r"test_cast(like)?_(no_saturate_|e8m0_)?.*(bfloat16|float8|float4|u?int4|u?int2).*":
        Rejection("element type bfloat16/float8/float4/int4/int2",
                  _ELEMENT_TYPE.format(r"(?i:bfloat16|float8_?e\w+|float4_?e\w+|u?int4|u?int2)")),
    r"test_equal_string(_broadcast)?":
        Rejection("string tensors", r"element type object is not supported"),
    r"test_not_(2d|3d|4d)":  # onnx writes them at opset 1
        Rejection("opset 1 models", r"opset 1 is too old"),
    r"test_range_bfloat16_type_positive_delta":
        Rejection("element type bfloat16/float8/float4/int4/int2",
                  _ELEMENT_TYPE.format(r"(?i:bfloat16)")),
    r"test_(?!cast)\w+_bfloat16(_values)?":  # an elementwise op's bfloat16 case (Celu's, OneHot's)
        Rejection("element type bfloat16/float8/float4/int4/int2",
                  _ELEMENT_TYPE.format(r"(?i:bfloat16)")),
    r"test_einsum_(transpose|sum|batch_diagonal|inner_prod|scalar)":
        Rejection("Einsum other than a matrix product",
                  r"\(Einsum\): '.*': (.* is not a matrix product|only two operands)"),
    r"test_identity_(sequence|opt)":
        Rejection("sequence and optional types", r"is a (sequence|optional), not a tensor"),
    r"test_training_dropout.*":
        Rejection("training-mode Dropout", r"Dropout with training_mode=true is not an inference"),
    r"test_batchnorm_.*_training_mode":
        Rejection("training-mode BatchNormalization",
                  r"\(BatchNormalization\): training_mode=1 computes batch statistics"),
    r"test_maxpool_with_argmax_.*":
        Rejection("MaxPool Indices output",
                  r"\(MaxPool\) has 2 outputs; ember's MaxPool produces 1"),
    r"test_resize_.*cubic.*":
        Rejection("Resize mode cubic", r"Resize mode 'cubic' is not supported"),
    r"test_resize_.*_antialias":
        Rejection("Resize antialias", r"Resize with antialias=1 is not supported"),
    r"test_resize_tf_crop_and_resize.*":
        Rejection("Resize tf_crop_and_resize",
                  r"Resize coordinate_transformation_mode 'tf_crop_and_resize' is not supported"),
}

# Cases where the ONNX reference and onnxruntime disagree; ember follows onnxruntime, the fp32
# oracle its accuracy reports use, so these compare against onnxruntime's outputs instead.
ONNXRUNTIME_IS_THE_ORACLE = {
    # align_corners divides by (length_resized - 1): the ONNX reference takes length_resized as
    # size × scale (4 × 0.6 = 2.4), onnxruntime as the output size (2).
    "test_resize_downsample_scales_linear_align_corners",
}


def expected_rejection(name: str) -> Rejection | None:
    for pattern, rejection in EXPECTED_UNSUPPORTED.items():
        if re.fullmatch(pattern, name, flags=re.IGNORECASE):
            return rejection
    return None


def _array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value)


def _constant_weights(case):
    """An operator the importer unrolls (LSTM, GRU) needs its weights constant, as exporters
    write them; onnx's cases feed them as inputs: make every input but the data X an
    initializer of the case's (one) data set."""
    unrolled = [n for n in case.model.graph.node if OPS[n.op_type].expand is not None]
    if not unrolled or len(case.data_sets) != 1:
        return case
    model = copy.deepcopy(case.model)
    names = [vi.name for vi in model.graph.input]
    inputs, outputs = case.data_sets[0]
    weights = {name for node in unrolled for name in node.input[1:] if name}
    keep = [(vi, v) for vi, v in zip(model.graph.input, inputs) if vi.name not in weights]
    model.graph.initializer.extend(numpy_helper.from_array(_array(v), name)
                                   for name, v in zip(names, inputs) if name in weights)
    del model.graph.input[:]
    model.graph.input.extend(vi for vi, _ in keep)
    return dataclasses.replace(case, model=model, data_sets=[([v for _, v in keep], outputs)])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node(case, request) -> None:
    case = _constant_weights(case)
    initializers = {i.name for i in case.model.graph.initializer}
    input_names = [vi.name for vi in case.model.graph.input if vi.name not in initializers]
    output_names = [vi.name for vi in case.model.graph.output]

    def run() -> list[dict[str, np.ndarray]]:
        graph = import_model(case.model)
        return [evaluate(graph, {n: _array(v) for n, v in zip(input_names, inputs)})
                for inputs, _ in case.data_sets]

    rejection = expected_rejection(case.name)
    if rejection is not None:
        request.node.user_properties.append(("rejected", rejection.reason))
        with pytest.raises(CompileError, match=rejection.message):
            run()
        return
    runs = run()

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
