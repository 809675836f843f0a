"""What gets fuzzed: seed files made from the bundled digits CNN, and per seed the mutator and the
`ember` commands a user would run on the file.

A case writes one mutated seed into a fresh folder and runs its target's commands there, in
order; a command marked `after` runs only when the one before it succeeded (it reads what that
one wrote), so a mutated model that still profiles is also compiled and its program run.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ember.demo import EXAMPLE
from ember.fuzzing import mutate, sandbox
from simulator.arch import PRESETS

# The kinds of file ember reads, in the order the campaign's table lists them.
KINDS = ("program", "profile", "onnx", "data", "arch", "report")


@dataclass(frozen=True)
class Command:
    """`ember ARGS`: "{case}" stands for the mutated file, "{seeds}" for the seed folder;
    `outputs` are the files it writes when it succeeds. An `after` command runs only when the
    one before succeeded (it reads what that one wrote); a `checked` one reads nothing but what
    ember wrote and accepted, so it must succeed too (exit 2 there is a failure)."""

    args: tuple[str, ...]
    outputs: tuple[str, ...] = ()
    after: bool = False
    checked: bool = False


@dataclass(frozen=True)
class Target:
    kind: str
    seed: str           # a file in the seed folder
    case: str           # the mutated copy's name in the case folder
    mutator: Callable[[bytes, random.Random], bytes]
    commands: tuple[Command, ...]


def _cmd(*args: str, outputs: tuple[str, ...] = (), after: bool = False,
         checked: bool = False) -> Command:
    return Command(args, outputs, after or checked, checked)


_SIM = ("-i", "{seeds}/sample.npz", "-o", "out.npz")
_MODEL = "{seeds}/model.onnx"
_PROFILE = "{seeds}/digits.profile.json"

TARGETS = (
    Target("program", "digits.ember", "case.ember", mutate.mutate_program, (
        _cmd("simulate", "{case}", *_SIM, "--report", "report.json",
             outputs=("out.npz", "report.json")),
        _cmd("disasm", "{case}"),
        _cmd("accuracy", _MODEL, "{case}", "--profile", _PROFILE, "--data",
             "{seeds}/calib.npz", "--samples", "2"))),
    Target("program", "digits_host.ember", "case.ember", mutate.mutate_program, (
        _cmd("simulate", "{case}", *_SIM, outputs=("out.npz",)),
        _cmd("report", "{case}", "-i", "{seeds}/sample.npz", "-o", "report.json", "--html",
             "report.html", outputs=("report.json", "report.html"), checked=True))),
    Target("profile", "digits.profile.json", "case.profile.json", mutate.mutate_json_file, (
        _cmd("profile", "show", "{case}", "--json"),
        _cmd("profile", "merge", "{case}", "{seeds}/eval.profile.json", "-o",
             "merged.profile.json", outputs=("merged.profile.json",)),
        _cmd("compile", _MODEL, "--int8", "--profile", "{case}", "-o", "out.ember",
             outputs=("out.ember",)),
        _cmd("simulate", "out.ember", *_SIM, outputs=("out.npz",), checked=True))),
    Target("onnx", "model.onnx", "case.onnx", mutate.mutate_onnx, (
        _cmd("show", "{case}", "--json"),
        _cmd("run", "{case}", "-o", "run.npz", outputs=("run.npz",)),
        _cmd("quantize-profile", "{case}", "--random", "2", "-o", "case.profile.json",
             outputs=("case.profile.json",)),
        _cmd("compile", "{case}", "--int8", "--profile", "case.profile.json", "--allow-host",
             "--emit-onnx", "qdq.onnx", "-o", "out.ember", outputs=("out.ember", "qdq.onnx"),
             after=True),
        _cmd("disasm", "out.ember", checked=True))),
    Target("onnx", "digits.qdq.onnx", "case.onnx", mutate.mutate_onnx, (
        _cmd("show", "{case}"),
        _cmd("run", "{case}", "--json"),
        _cmd("quantize-profile", "{case}", "--random", "2", "-o", "case.profile.json",
             outputs=("case.profile.json",)))),
    Target("data", "sample.npz", "case.npz", mutate.mutate_npz, (
        _cmd("simulate", "{seeds}/digits.ember", "-i", "{case}", "-o", "out.npz",
             outputs=("out.npz",)),
        _cmd("run", _MODEL, "-i", "{case}", "-o", "run.npz", outputs=("run.npz",)))),
    Target("data", "sample.npy", "case.npy", mutate.mutate_npy, (
        _cmd("simulate", "{seeds}/digits.ember", "-i", "{case}", "-o", "out.npz",
             outputs=("out.npz",)),
        _cmd("run", _MODEL, "-i", "{case}", "-o", "run.npz", outputs=("run.npz",)))),
    Target("data", "calib.npz", "case.npz", mutate.mutate_npz, (
        _cmd("quantize-profile", _MODEL, "--data", "{case}", "-o", "case.profile.json",
             outputs=("case.profile.json",)),
        _cmd("accuracy", _MODEL, "--profile", _PROFILE, "--data", "{case}", "--samples", "4"))),
    Target("data", "labels.npy", "case.npy", mutate.mutate_npy, (
        _cmd("accuracy", _MODEL, "--profile", _PROFILE, "--data", "{seeds}/calib.npz",
             "--labels", "{case}"),)),
    Target("arch", "arch.toml", "case.toml", mutate.mutate_toml, (
        _cmd("compile", _MODEL, "--int8", "--profile", _PROFILE, "--target", "{case}", "-o",
             "out.ember", outputs=("out.ember",)),
        _cmd("simulate", "out.ember", *_SIM, outputs=("out.npz",), checked=True))),
    Target("report", "digits.report.json", "case.json", mutate.mutate_json_file, (
        _cmd("report", "{case}", "--html", "report.html", "--json"),)),
)

_SAMPLES = 8  # calibration and evaluation samples: enough to run every path, fast


def make_seeds(folder: Path) -> Path:
    """The seed files every target names, made through the CLI like a user's: the digits CNN,
    its profile over a few samples (and a second over other samples, for merging), its program
    with and without a host segment, its QDQ export, a performance report, a sample, labels and
    the default architecture file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(EXAMPLE / "model.onnx", folder / "model.onnx")
    shutil.copyfile(PRESETS / "default.toml", folder / "arch.toml")
    with np.load(EXAMPLE / "eval.npz") as data:
        images, labels = data["input"], data["labels"]
    np.savez(folder / "calib.npz", input=images[:_SAMPLES])
    np.savez(folder / "eval.npz", input=images[_SAMPLES:2 * _SAMPLES])
    np.savez(folder / "sample.npz", input=images[:1])
    np.save(folder / "sample.npy", images[:1])
    np.save(folder / "labels.npy", labels[:_SAMPLES])
    model = str(folder / "model.onnx")
    for args in (
            ["quantize-profile", model, "--data", "calib.npz", "-o", "digits.profile.json"],
            ["quantize-profile", model, "--data", "eval.npz", "-o", "eval.profile.json"],
            ["compile", model, "--int8", "--profile", "digits.profile.json", "-o",
             "digits.ember", "--emit-onnx", "digits.qdq.onnx"],
            ["simulate", "digits.ember", "-i", "sample.npz", "--report", "digits.report.json"],
            ["compile", model, "--int8", "--profile", "digits.profile.json", "--keep-fp32",
             "pool", "--allow-host", "-o", "digits_host.ember"]):
        outcome = sandbox.run(args, folder)
        if outcome.exit_code != 0:
            raise RuntimeError(f"making the fuzzing seeds: ember {' '.join(args)}: "
                               f"{outcome.stderr.strip()}")
    return folder


@dataclass(frozen=True)
class Case:
    """One mutated file and how the commands on it ended; `failure` is the first problem."""

    target: Target
    data: bytes
    outcomes: tuple[sandbox.Outcome, ...]

    @property
    def failure(self) -> sandbox.Outcome | None:
        return next((o for o in self.outcomes if o.failure), None)

    @property
    def exit_codes(self) -> tuple[int | None, ...]:
        return tuple(o.exit_code for o in self.outcomes)


def run_case(target: Target, rng: random.Random, seeds: Path, folder: Path,
             **limits) -> Case:
    """Mutate `target`'s seed with `rng`, write it into the empty `folder` and run the
    target's commands there (`limits`: `sandbox.run`'s timeout_s and memory_bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = target.mutator((seeds / target.seed).read_bytes(), rng)
    (folder / target.case).write_bytes(data)
    outcomes: list[sandbox.Outcome] = []
    for command in target.commands:
        if command.after and (not outcomes or outcomes[-1].exit_code != 0):
            continue
        args = [a.replace("{case}", target.case).replace("{seeds}", str(seeds))
                for a in command.args]
        outcome = sandbox.run(args, folder, command.outputs, **limits)
        if command.checked and outcome.exit_code == 2 and outcome.failure is None:
            outcome = replace(outcome, failure="exit 2 on what ember wrote and accepted: "
                              + outcome.stderr.strip()[-300:])
        outcomes.append(outcome)
        if outcome.failure:
            break
    return Case(target, data, tuple(outcomes))
