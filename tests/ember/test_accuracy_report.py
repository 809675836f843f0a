"""The accuracy report's three renderings: stable JSON keys, a table, escaped HTML."""

from __future__ import annotations

import io

from rich.console import Console

from ember.reports.accuracy import AccuracyReport, LayerAccuracy, OutputAccuracy


def _report() -> AccuracyReport:
    return AccuracyReport(
        model="m.onnx", samples=10,
        outputs=(OutputAccuracy("logits", 30.5, 0.999, 0.1, True, 0.9, 0.95, 0.94),),
        layers=(LayerAccuracy("<script>alert(1)</script>", "conv1", "Conv", "int8", 40.0, 35.0),
                LayerAccuracy("relu2", "relu2", "Relu", "int8", 45.0, 20.0)),
        options={"calibration": "minmax"})


def test_json_has_the_stable_keys_and_layers_worst_first() -> None:
    doc = _report().to_json()
    for key in ("samples", "top1_agreement", "top1_accuracy_fp32", "top1_accuracy_int8",
                "sqnr_db", "cosine", "max_abs_error", "layers"):
        assert key in doc
    assert [layer["name"] for layer in doc["layers"]][0] == "relu2"
    assert doc["precision"] == {"int8": 2}


def test_html_is_self_contained_and_escapes_node_names() -> None:
    page = _report().html()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;" in page and "<svg" in page and "http" not in page.split("<svg")[0]


def test_table_rendering() -> None:
    out = io.StringIO()
    _report().print(Console(file=out, width=120))
    text = out.getvalue()
    assert "logits" in text and "30.50" in text and "relu2" in text


def test_html_options_show_only_what_applied() -> None:
    """No percentile under minmax calibration, nothing unset (all samples, no program); JSON
    keeps every recorded option."""
    options = {"calibration": "minmax", "percentile": 99.99, "per_channel": True,
               "keep_fp32": [], "samples": None, "program": None, "data": "eval.npz"}
    report = AccuracyReport(model="m.onnx", samples=10, outputs=_report().outputs,
                            options=options)
    table = report.html().split("<h2>Options</h2>")[1]
    assert "minmax" in table and "eval.npz" in table
    assert 'per_channel</td><td class="text">yes' in table
    for absent in ("percentile", "99.99", "None", "keep_fp32", "samples", "program"):
        assert absent not in table, absent
    assert report.to_json()["options"] == options
    percentile = AccuracyReport(model="m.onnx", samples=10, outputs=_report().outputs,
                                options={**options, "calibration": "percentile",
                                         "keep_fp32": ["fc"]})
    table = percentile.html().split("<h2>Options</h2>")[1]
    assert "99.99" in table and "keep_fp32</td><td class=\"text\">fc<" in table


def test_kernel_columns_flag_lossy_kernels_lowest_kernel_sqnr_first() -> None:
    """A kernel 10 dB or more below one rounding once, within 20 dB of its tensor's
    accumulated SQNR, is flagged, the lowest kernel SQNR first (a 40 dB loss at 100 dB matters
    less than 15 at 35); one far above what its tensor carries is not; an exact kernel reads
    "exact", a tensor no kernel computes "—"."""
    layers = (LayerAccuracy("table", "t", "HardSwish", "int16", 70.0, 30.0, kernel_sqnr_db=35.0,
                            kernel_loss_db=15.0),
              LayerAccuracy("gate", "g", "Mul", "int16", 140.0, 90.0, kernel_sqnr_db=100.0,
                            kernel_loss_db=40.0),
              LayerAccuracy("harmless", "h", "Mul", "int16", 140.0, 30.0, kernel_sqnr_db=100.0,
                            kernel_loss_db=40.0),
              LayerAccuracy("conv", "c", "Conv", "int8", 40.0, 35.0, kernel_sqnr_db=40.5,
                            kernel_loss_db=9.9),
              LayerAccuracy("pool", "p", "MaxPool", "int8", 40.0, 35.0, kernel_sqnr_db=200.0,
                            kernel_loss_db=0.0),
              LayerAccuracy("x", "x/q", "QuantizeLinear", "int8", 50.0, 50.0))
    report = AccuracyReport(model="m.onnx", samples=10, outputs=_report().outputs,
                            layers=layers)
    doc = report.to_json()
    assert doc["lossy_kernels"] == ["table", "gate"]
    row = next(layer for layer in doc["layers"] if layer["name"] == "table")
    assert row["kernel_sqnr_db"] == 35.0 and row["kernel_loss_db"] == 15.0
    out = io.StringIO()
    report.print(Console(file=out, width=200))
    text = out.getvalue()
    flagged = text.split("kernels losing 10 dB or more")[1]
    assert flagged.index("table") < flagged.index("gate") and "conv" not in flagged
    assert "exact" in text.split("pool")[1].splitlines()[0]
    assert "—" in text.split("QuantizeLinear")[1].splitlines()[0]
    page = report.html()
    lossy = page.split("<h3>Lossy integer kernels</h3>")[1].split("</table>")[0]
    assert lossy.index("table") < lossy.index("gate") and "conv" not in lossy
    assert "<td>exact</td>" in page
    plain = AccuracyReport(model="m.onnx", samples=10, outputs=_report().outputs,
                           layers=_report().layers)
    assert "kernel" not in plain.html() and plain.to_json()["lossy_kernels"] == []


def test_the_titles_say_what_was_raised_to_int16() -> None:
    plain = _report()
    assert plain.quantized_as == "int8"
    mixed = AccuracyReport(model="m.onnx", samples=10, outputs=plain.outputs,
                           options={"int16_tensors": ["a", "b"], "int16_weights": ["conv"]})
    assert mixed.quantized_as == "int8 with 2 tensors and 1 layer's weights int16"
    title = mixed.html().split("<h1>")[1].split("</h1>")[0]
    assert title.replace("&#39;", "'") == \
        "Accuracy of <code>m.onnx</code>: int8 with 2 tensors and 1 layer's weights int16 " \
        "against fp32 onnxruntime"
