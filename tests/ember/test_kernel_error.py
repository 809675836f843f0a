"""`ember accuracy --per-layer`'s kernel columns: each integer kernel against its fp32 operator
on the inputs it received (kernel SQNR), and how far below a kernel rounding once it falls
(kernel loss). On a model whose one lossy kernel is known, an int16 HardSwish interpolating
over a wide input range between the coarse knots alone (its window of finer knots off), that
kernel is flagged (the model input int16 too, so that the table's error is what the tensor
carries), in the JSON, the terminal table and the HTML page, and the requantizing Convs around
it sit at their rounding level; with the window, with an int8 output, or under an int8 input's
far larger error, the same table is not flagged."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.cli import invoke, profiled
from tests.e2e.models import wide_table


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    calib, evaluation = ({"x": np.random.default_rng(seed).standard_normal(
        (count, 1, 3, 8, 8)).astype(np.float32)} for count, seed in ((8, 0), (4, 1)))
    return profiled(tmp_path_factory.mktemp("kernel_error"), wide_table(), calib, evaluation)


def _accuracy(files, *args: str):
    return invoke("accuracy", files / "m.onnx", "--profile", files / "p.json", "--data",
                  files / "eval.npz", "--per-layer", *args)


@pytest.fixture
def coarse_knots(monkeypatch):
    """int16 tables without their window of finer knots (`int8.knot_window`) and at the
    function's own values (not fitted, `int8._fitted_knots`): 257 knots over the input's whole
    range, a kernel known to lose."""
    monkeypatch.setattr("quantizer.quantize.knot_window", lambda *args, **kwargs: (0, 0))
    monkeypatch.setattr("compiler.graph.int8._fitted_knots",
                        lambda exact, at_knots, *args: at_knots)


def test_the_lossy_table_is_flagged_and_the_convs_are_at_their_rounding(files,
                                                                        coarse_knots) -> None:
    result = _accuracy(files, "--int16", "x,pre,act", "--json", "--html", files / "a.html")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    layers = {layer["name"]: layer for layer in doc["layers"]}
    act = layers["act"]
    assert act["precision"] == "int16"  # its int16 table is not a weight
    assert act["kernel_sqnr_db"] < act["own_sqnr_db"] - 15 and act["kernel_loss_db"] > 15
    assert doc["lossy_kernels"] == ["act"]
    for conv in ("pre", "y"):  # requantizing Convs: one rounding, as their own error
        assert layers[conv]["kernel_loss_db"] < 0.05
        assert abs(layers[conv]["kernel_sqnr_db"] - layers[conv]["own_sqnr_db"]) < 1
    assert layers["x"]["kernel_sqnr_db"] is None  # a model input: no kernel computes it
    page = (files / "a.html").read_text()
    lossy = page.split("<h3>Lossy integer kernels</h3>")[1].split("</table>")[0]
    assert "<td>act</td>" in lossy and f'class="bad">{act["kernel_sqnr_db"]:.2f}<' in lossy
    assert "<td>pre</td>" not in lossy
    table = _accuracy(files, "--int16", "x,pre,act").output
    assert "kernel SQNR dB" in table and "kernels losing 10 dB or more" in table
    flagged = table.split("kernels losing 10 dB or more")[1]
    assert "act" in flagged and f"{act['kernel_loss_db']:.2f}" in flagged



def test_a_lossy_kernel_far_above_its_tensors_error_is_not_listed(files, coarse_knots) -> None:
    """The same coarse table with the model input int8: the input's rounding leaves 'act'
    far below the table's kernel SQNR, so the table, still losing, is not worth a fix."""
    doc = json.loads(_accuracy(files, "--int16", "pre,act", "--json").stdout)
    act = next(layer for layer in doc["layers"] if layer["name"] == "act")
    assert act["kernel_loss_db"] > 15
    assert act["kernel_sqnr_db"] > act["accumulated_sqnr_db"] + 20
    assert doc["lossy_kernels"] == []


def test_the_window_of_finer_knots_takes_the_table_off_the_list(files) -> None:
    result = _accuracy(files, "--int16", "pre,act", "--json")
    doc = json.loads(result.stdout)
    act = next(layer for layer in doc["layers"] if layer["name"] == "act")
    assert act["kernel_loss_db"] < 3 and doc["lossy_kernels"] == []


def test_a_table_with_an_int8_output_is_not_flagged(files, coarse_knots) -> None:
    """The same interpolation under an int8 output's rounding: no loss, nothing flagged."""
    result = _accuracy(files, "--int16", "pre", "--json", "--html", files / "b.html")
    doc = json.loads(result.stdout)
    act = next(layer for layer in doc["layers"] if layer["name"] == "act")
    assert act["kernel_loss_db"] < 0.1 and doc["lossy_kernels"] == []
    assert "No integer kernel loses 10 dB or more" in (files / "b.html").read_text()
    assert "no integer kernel loses 10 dB or more" in _accuracy(files, "--int16", "pre").output
