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
