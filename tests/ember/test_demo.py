"""`ember demo`, the README's first command, runs the flow and lists what it wrote."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ember.cli import cli


def test_demo_runs_the_flow_and_writes_its_files(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["demo", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("digits.ir.txt", "digits.profile.json", "digits.ember", "perf.json",
                 "perf.html", "trace.json", "accuracy.html", "accuracy.json"):
        assert (tmp_path / name).is_file(), name
        assert str(tmp_path / name) in result.output
    report = json.loads((tmp_path / "accuracy.json").read_text())
    assert report["top1_accuracy_fp32"] - report["top1_accuracy_int8"] <= 0.005
    assert report["bit_exact"] is True
    perf = json.loads((tmp_path / "perf.json").read_text())
    assert perf["cycles"] >= perf["bound_cycles"] > 0
    assert 'class="point"' in (tmp_path / "perf.html").read_text()  # the roofline
