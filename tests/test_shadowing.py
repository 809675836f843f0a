"""ember's top-level packages stay ember's after other software has changed sys.path.

`import onnxruntime.quantization` appends onnxruntime's `transformers` folder, which holds a
`profiler.py`, to the end of sys.path. Any path entry that names this checkout comes before it,
so it wins; an import hook placed behind every path entry (setuptools' editable finder for a
flat layout) does not, and `import ember.accuracy` then loaded onnxruntime's profiler. Each
test imports onnxruntime's quantization tools first and then every module of ember's packages,
in a fresh interpreter so that the import order is real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ember", "profiler", "quantizer", "compiler", "simulator")

_IMPORT_AFTER_ONNXRUNTIME = f"""
import importlib, pkgutil
import onnxruntime.quantization
for top in {PACKAGES!r}:
    package = importlib.import_module(top)
    print(top, package.__file__)
    for module in pkgutil.walk_packages(package.__path__, top + "."):
        importlib.import_module(module.name)
"""


def _package_files(args: list[str], env: dict[str, str], cwd: Path) -> dict[str, Path]:
    """Run the imports in a fresh interpreter; where each top-level package came from."""
    result = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return {top: Path(file) for top, file in (line.split(" ", 1)
                                              for line in result.stdout.splitlines())}


def test_packages_win_in_the_test_environment(tmp_path) -> None:
    """As the tests run (PYTHONPATH or the installed package), from a folder outside the
    checkout: the packages are siblings of the ember that was imported."""
    files = _package_files(["-c", _IMPORT_AFTER_ONNXRUNTIME], dict(os.environ), tmp_path)
    home = files["ember"].parents[1]
    assert {top: file.parents[1] for top, file in files.items()} == dict.fromkeys(PACKAGES, home)


def test_packages_win_in_an_editable_install(tmp_path) -> None:
    """`pip install -e .` writes a .pth naming the checkout, because pyproject.toml declares
    the root as the package directory; site-packages holds onnxruntime. Nothing else is on
    the path: no PYTHONPATH, no current folder, no other .pth."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"": "."}, "editable installs would use an import hook"
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "__editable__.ember.pth").write_text(f"{ROOT}\n")
    installed = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    setup = f"import site, sys; sys.path += {installed!r}; site.addsitedir({str(site_dir)!r})\n"
    # -I: no PYTHONPATH, user site or script folder; -S: no site-packages .pth files.
    files = _package_files(["-I", "-S", "-c", setup + _IMPORT_AFTER_ONNXRUNTIME], {}, tmp_path)
    assert files == {top: ROOT / top / "__init__.py" for top in PACKAGES}
