"""SHA-256 of every program ember compiles from the example models, one row per (model, preset,
options): the check that a refactoring changed no program by a single byte.

Run it before and after a change and compare the two outputs (`diff`). Models: the digits CNN
(profiled on its calibration set) and the zoo (seeded weights, profiled on seeded random
samples); every preset with the default options, and on the default preset each quantization
and backend option that changes the program.

    .venv/bin/python benchmarks/program_digests.py [--out DIR] [--models digits,mlp,...]
                                                   [--presets default,large,edge] > digests.txt
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from examples.build import zoo_model_path

ROOT = Path(__file__).resolve().parents[1]
# The checkout this file is in, not whatever ember is installed: run from a second worktree,
# it measures that tree.
EMBER = [sys.executable, "-c", "import sys; from ember.cli import main; sys.argv[0] = 'ember'; main()"]
MODELS = ("digits", "mlp", "squeezenet", "mobilenetv2", "resnet18")
PRESETS = ("default", "large", "edge")
# Options that change the program, each tried alone on the default preset.
VARIANTS = {
    "uint8": ["--activations", "uint8"],
    "per-tensor": ["--per-tensor"],
    "symmetric": ["--symmetric"],
    "power2": ["--schema", "power2"],
    "entropy": ["--calibration", "entropy"],
    "single-buffer": ["--no-double-buffer"],
}
KEEP_FP32 = {"digits": "conv2", "mlp": "fc2"}  # a middle layer on the host (--allow-host)


def ember(*args: str) -> None:
    subprocess.run([*EMBER, *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def model_path(name: str) -> Path:
    return ROOT / "examples" / "digits" / "model.onnx" if name == "digits" else zoo_model_path(name)


def profile(name: str, out: Path) -> Path:
    path = out / f"{name}.profile.json"
    data = (["--data", "examples/digits/calib.npz"] if name == "digits"
            else ["--random", "4"])  # relative: the profile records the path
    ember("quantize-profile", str(model_path(name)), *data, "-o", str(path))
    return path


def digest(name: str, prof: Path, out: Path, label: str, options: list[str]) -> str:
    program = out / f"{name}.{label}.ember"
    ember("compile", str(model_path(name)), "--int8", "--profile", str(prof), *options,
          "-o", str(program))
    return hashlib.sha256(program.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the programs here (default: a temp dir)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--presets", default=",".join(PRESETS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        out = args.out or Path(temp)
        out.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            prof = profile(name, out)
            runs = [(preset, ["--target", preset]) for preset in args.presets.split(",")]
            runs += [(label, opts) for label, opts in VARIANTS.items()]
            if name in KEEP_FP32:
                runs.append(("host", ["--keep-fp32", KEEP_FP32[name], "--allow-host"]))
            for label, options in runs:
                print(f"{name:12} {label:14} {digest(name, prof, out, label, options)}",
                      flush=True)


if __name__ == "__main__":
    main()
