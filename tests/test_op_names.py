"""Every operator fact lives in the operator table: no module outside it names an operator.

Parses every module of the project's packages with ast and fails on a string constant equal to
an operator name of `compiler.graph.ops.OPS` outside the table (`compiler/graph/ops.py`) and its
int8 half (`compiler/graph/int8.py`). A module that needs a fact about an operator reads a column
of its row; a new operator is then one row, not an edit in every module that lists operators.
"""

from __future__ import annotations

import ast
from pathlib import Path

from compiler.graph.ops import OPS, ViewKind
from profiler import session

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("profiler", "quantizer", "compiler", "simulator", "ember")
TABLE = ("compiler/graph/ops.py", "compiler/graph/int8.py")

# (module, operator): the only names allowed outside the table, each with its reason.
ALLOWED = {
    # The profiler imports no project package (tests/test_layering.py) and runs on raw ONNX
    # models: its own list of value-preserving ops is checked against the table's view column
    # below.
    ("profiler/session.py", "Identity"): "same values as the input (checked below)",
    ("profiler/session.py", "Reshape"): "same values as the input (checked below)",
    ("profiler/session.py", "Flatten"): "same values as the input (checked below)",
    ("profiler/session.py", "Squeeze"): "same values as the input (checked below)",
    ("profiler/session.py", "Unsqueeze"): "same values as the input (checked below)",
    ("profiler/session.py", "Transpose"): "same values as the input (checked below)",
    ("profiler/session.py", "Dropout"): "same values, and its training_mode input",
    ("profiler/session.py", "LayerNormalization"): "its output's range per channel too (for "
                                                   "quantizer.smooth)",
    ("profiler/session.py", "Conv"): "its data input's per-channel sums (bias correction)",
    ("profiler/session.py", "Gemm"): "its data input's per-channel sums (bias correction)",
    ("profiler/session.py", "MatMul"): "its data input's per-channel sums (bias correction)",
    ("profiler/session.py", "Constant"): "a weight given by a Constant node is constant too",
    # The importer evaluates nodes of constant inputs early, but not a Dropout, whose reference
    # refuses training_mode=true (an error for later stages, not the importer's).
    ("compiler/frontend/onnx.py", "Dropout"): "never evaluated at import",
}


def _named_operators() -> set[tuple[str, str, int]]:
    found = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in TABLE:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=relative)):
                if isinstance(node, ast.Constant) and node.value in OPS:
                    found.add((relative, node.value, node.lineno))
    return found


def test_no_module_outside_the_table_names_an_operator() -> None:
    named = _named_operators()
    stray = sorted(f"{module}:{line}: {op!r}" for module, op, line in named
                   if (module, op) not in ALLOWED)
    assert not stray, "operator names outside the operator table (read a column of its row " \
                      "instead):\n" + "\n".join(stray)


def test_every_allowed_name_is_still_used() -> None:
    used = {(module, op) for module, op, _ in _named_operators()}
    assert set(ALLOWED) <= used, f"stale allow-list entries: {sorted(set(ALLOWED) - used)}"


def test_the_profilers_same_value_ops_are_the_tables_views() -> None:
    """The profiler copies statistics along ops whose output is its input's values in any
    order: exactly the table's views that keep every value."""
    keep_all = (ViewKind.SAME, ViewKind.RESHAPE, ViewKind.PERMUTE)
    assert session._SAME_VALUES == {name for name, op in OPS.items() if op.view in keep_all}
