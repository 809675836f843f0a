"""Compiler test hooks: a tally of the ONNX backend node tests at the end of the run."""

from __future__ import annotations

from collections import Counter

_BACKEND = "test_backend_nodes.py::test_node["


def pytest_terminal_summary(terminalreporter) -> None:
    outcomes: Counter[str] = Counter()
    rejections: Counter[str] = Counter()
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if _BACKEND not in getattr(report, "nodeid", "") or (
                    outcome != "skipped" and report.when != "call"):
                continue
            outcomes[outcome] += 1
            if outcome == "passed":
                rejections.update(reason for key, reason in report.user_properties
                                  if key == "rejected")
    if not outcomes:
        return
    total = sum(outcomes.values())
    terminalreporter.section("ONNX backend node cases")
    terminalreporter.write_line(f"{total} collected (every op in ember's table): "
                                + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
                                + f"; {sum(rejections.values())} of the passes are rejections "
                                "for the listed reason")
    for reason, n in rejections.most_common():
        terminalreporter.write_line(f"  rejected {n:4d}  {reason}")
