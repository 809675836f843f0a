"""The import directions of DESIGN.md, checked by parsing every import with ast.

ember → profiler, quantizer, compiler, simulator; quantizer → profiler.format, compiler.graph,
simulator.numerics; compiler → simulator.{arch,isa,numerics,program}; profiler and simulator
import no other project package; examples only the simulator. Tests and benchmarks import the
project, never each other. Each package may also import its own `errors` module's
siblings' error classes where listed, so messages stay one line at the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("ember", "profiler", "quantizer", "compiler", "simulator", "examples")

ALLOWED = {
    "ember": ("ember", "profiler", "quantizer", "compiler", "simulator", "examples"),
    "quantizer": ("quantizer", "profiler.format", "profiler.errors", "compiler.graph",
                  "compiler.errors", "simulator.numerics", "simulator.errors"),
    "compiler": ("compiler", "simulator.arch", "simulator.isa", "simulator.numerics",
                 "simulator.program", "simulator.errors"),
    "profiler": ("profiler",),
    "simulator": ("simulator",),
    "examples": ("examples", "simulator"),  # a synthetic program written in instructions
}


def _imports(source: str, relative: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every project import in the module at `relative` (a/b/c.py)."""
    tree = ast.parse(source, filename=relative)
    module_parts = tuple(Path(relative).with_suffix("").parts)
    is_package = relative.endswith("__init__.py")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # In a package's __init__, level 1 is the package itself, not its parent.
                keep = len(module_parts) - node.level + (1 if is_package else 0)
                base = module_parts[:keep]
                name = ".".join(base + ((node.module,) if node.module else ()))
            else:
                name = node.module or ""
            # `from compiler import graph` imports compiler.graph: judge the full names.
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in PROJECT]


def _allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_layering(package: str) -> None:
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        for line, name in _imports(path.read_text(), relative):
            if not _allowed(name, ALLOWED[package]) and not _allowed(
                    name.rsplit(".", 1)[0], ALLOWED[package]):
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not violations, "imports against DESIGN.md's layering:\n" + "\n".join(violations)


@pytest.mark.parametrize("folder, other", [("tests", "benchmarks"), ("benchmarks", "tests")])
def test_tests_and_benchmarks_never_import_each_other(folder: str, other: str) -> None:
    """What both need belongs in the project (`ember.flow`, `examples`): neither imports the
    other, nor loads a file by path or patches sys.path to reach it."""
    violations = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                violations += [f"{where} imports {alias.name}" for alias in node.names
                               if alias.name.split(".")[0] == other]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == other:
                violations.append(f"{where} imports {node.module}")
            elif isinstance(node, ast.Attribute) and _loads_by_path(node):
                violations.append(f"{where} uses {ast.unparse(node)}")
    assert not violations, "\n".join(violations)


def _loads_by_path(node: ast.Attribute) -> bool:
    """`importlib.util.spec_from_file_location`, or `sys.path.insert` / `sys.path.append`."""
    return node.attr == "spec_from_file_location" or (
        node.attr in ("insert", "append") and ast.unparse(node.value) == "sys.path")


def test_the_checker_catches_an_upward_and_a_relative_import() -> None:
    found = _imports("from compiler.graph.ir import Graph\nfrom ..quantizer import x\n",
                     "simulator/units/probe.py")
    assert found == [(1, "compiler.graph.ir.Graph"), (2, "simulator.quantizer.x")]
    assert _imports("from ..compiler import graph\n", "ember/commands/probe.py") == [
        (1, "ember.compiler.graph")]
    assert not _allowed("compiler.graph.ir", ALLOWED["simulator"])
