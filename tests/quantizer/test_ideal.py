"""Each integer node's ideal output (`quantizer.ideal`): its fp32 operator on the dequantized
inputs it received, quantized once in its output's parameters. A kernel that rounds once gives
it code for code, so on models of such kernels (Convs with folded zero points, per-channel
weights and a fused ReLU or Clip, Gemms, a MatMul whose bias is the fold alone, Adds and Subs,
average and max pools, int8 tables, a Pad's fill code, a Concat of a rescaled input, Softmax)
the ideal is the integer output; an int16 table interpolating between 257 knots over its
input's whole range falls far short of it, and with its window of finer knots comes close. An
int16 Add rounds once (`numerics.wide_add`): of a constant far outside its input's range, or
of an int8 operand whose scale is far above its sum's."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from ember.reports.metrics import ErrorStats
from quantizer.ideal import kernel_outputs, kernels
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from tests.e2e import models
from tests.e2e.flow import model_samples, quantized
from tests.onnx_builder import model, weights


def pad_concat_softmax():
    """x → Conv → Pad (a fill of 0.7, held as a code) → Concat with input z → Softmax over
    the channels. The Conv's range is a few times narrower than z's: the Pad's output is
    rescaled to the Concat's parameters."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Pad", ["c", "pads", "fill"], ["p"], name="pad"),
             helper.make_node("Concat", ["p", "z"], ["cat"], name="cat", axis=1),
             helper.make_node("Softmax", ["cat"], ["y"], name="softmax", axis=1)]
    return model(nodes, {"x": [1, 3, 5, 4], "z": [1, 2, 6, 7]}, {"y": [1, 8, 6, 7]},
                 {"w": weights(rng, 6, 3, 3, 3, scale=0.05),
                  "pads": np.array([0, 0, 1, 2, 0, 0, 0, 1]), "fill": np.array(0.7, np.float32)})


# Each model's measured tensors: no view (Flatten, Reshape), QuantizeLinear or
# DequantizeLinear among them.
EXACT = {
    "big_conv": (models.big_conv, {"r", "y"}),
    "strided": (models.strided, {"a", "d", "p", "y"}),
    "mobile_block": (models.mobile_block, {"er", "dr", "p", "s", "t", "gr", "y"}),
    "matmul": (models.matmul, {"m", "y"}),
    "misc_ops": (models.misc_ops, {"k", "m", "h", "a", "l", "g", "p", "z", "u", "y"}),
    "pad_concat_softmax": (pad_concat_softmax, {"c", "p", "cat", "y"}),
}


def kernel_errors(proto, options: QuantOptions | None = None) -> dict[str, tuple]:
    """Per measured tensor over three samples: (kernel SQNR, ideal SQNR, the largest
    difference between the output and the ideal, in steps of the output)."""
    qgraph = quantized(proto, model_samples(proto, 8), options or QuantOptions())
    found: dict[str, list] = {}
    for sample in model_samples(proto, 3, seed=1):
        env = run_int8(qgraph, sample, keep_all=True)
        for kernel in kernels(qgraph):
            signal, ideal, actual = kernel_outputs(qgraph, kernel, env)
            step = qgraph.type_of(kernel.node.outputs[0]).quant.scale[0]
            entry = found.setdefault(kernel.name, [ErrorStats(), ErrorStats(), 0.0])
            entry[0].add(signal, actual)
            entry[1].add(signal, ideal)
            entry[2] = max(entry[2], float(np.max(np.abs(actual - ideal.astype(np.float64))))
                           / step)
    return {name: (k.sqnr_db, i.sqnr_db, steps) for name, (k, i, steps) in found.items()}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_a_kernel_that_rounds_once_gives_its_ideal_output(name: str) -> None:
    build, measured = EXACT[name]
    errors = kernel_errors(build())
    assert set(errors) == measured
    for tensor, (kernel, ideal, steps) in errors.items():
        assert steps <= 1.0 + 1e-6, (tensor, steps)
        assert ideal - kernel < 0.1, (tensor, kernel, ideal)
        # An int8 output's rounding (40 to 60 dB here): a fused ReLU the signal lacked, or a
        # saturation counted as the kernel's, would be tens of dB below.
        assert kernel > 30, (tensor, kernel)
    if name == "pad_concat_softmax":  # the Rescale before the Concat rounds: in its kernel
        assert errors["cat"][0] < 100


def test_an_int16_table_loses_to_its_interpolation_beyond_an_int8_output(monkeypatch) -> None:
    """Between the coarse knots alone (the window off), the interpolation's error is far
    beyond an int16 output's rounding, and under an int8 one's; with the window it is within
    a few dB of it. The Convs around it are exact either way."""
    proto = models.wide_table()
    kernel, ideal, steps = kernel_errors(proto, QuantOptions(int16_tensors=("pre", "act")))["act"]
    assert ideal - kernel < 3 and steps <= 2
    monkeypatch.setattr("quantizer.quantize.knot_window", lambda *args, **kwargs: (0, 0))
    wide = kernel_errors(proto, QuantOptions(int16_tensors=("pre", "act")))
    kernel, ideal, steps = wide["act"]
    assert ideal - kernel > 15 and steps > 5
    narrow = kernel_errors(proto, QuantOptions(int16_tensors=("pre",)))
    kernel, ideal, steps = narrow["act"]
    assert ideal - kernel < 0.1 and steps <= 1.0 + 1e-6
    for errors in (wide, narrow):
        for conv in ("pre", "y"):
            assert errors[conv][1] - errors[conv][0] < 0.05, (conv, errors[conv])


@pytest.mark.parametrize("op, constant_first", [("Add", False), ("Add", True), ("Sub", False),
                                                ("Sub", True)])
def test_an_int16_map_by_a_constant_of_another_scale_rounds_once(op, constant_first) -> None:
    """An int16 Add or Sub of a scalar far outside its input's range, int16 codes in and out,
    is the ADD of the constant (`numerics.wide_add`), not a table whose knots round to output
    codes before it interpolates (1.5 to 8 dB below a single rounding here, 1 to 5 dB on the DB
    detector)."""
    proto = models.wide_map_by_constant(op, constant_first)
    options = QuantOptions(int16_tensors=("h", "c", "a"))
    kernel, ideal, steps = kernel_errors(proto, options)["a"]
    assert ideal - kernel < 0.1 and steps <= 1.0 + 1e-6, (kernel, ideal, steps)
    qgraph = quantized(proto, model_samples(proto, 8), options)
    node = next(n for n in qgraph.nodes if n.name == "map")
    assert "table_of" not in node.attrs


def test_an_int16_sum_that_cancels_rounds_once() -> None:
    """An int16 Add whose int8 operand's scale is far above its output's (the sum cancels):
    one rounding, within 0.1 dB of the ideal (TFLite's alignment lost 15 dB here, three
    steps at worst). The ideal's float32 signal, a sum of terms a hundred times the output's
    range, errs by a hundredth of a step itself."""
    kernel, ideal, steps = kernel_errors(models.cancelling_sum(),
                                         QuantOptions(int16_tensors=("p", "s")))["s"]
    assert ideal - kernel < 0.1 and steps < 1.01, (kernel, ideal, steps)
