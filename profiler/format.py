"""The profile file: schema, reading, writing, merging shards, and matching it to a model.

This is the only code that reads or writes `.profile.json`. The file is versioned JSON; every
histogram lies on the power-of-two grid of `profiler.histogram`, which makes merging exact.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx

from profiler import histogram
from profiler.errors import ProfileError
from profiler.fingerprint import ModelFingerprint, difference, fingerprint

FORMAT = "ember.profile"
VERSION = 1
KINDS = ("input", "weight", "activation")


@dataclass(frozen=True, eq=False)
class TensorStats:
    """Range and distribution of one tensor. Bin i of `hist` is [lo + i*w, lo + (i+1)*w)."""

    kind: str
    dtype: str
    min: float | None
    max: float | None
    count: int
    nonfinite: int
    bin_width_log2: int
    first_bin: int
    hist: np.ndarray

    @property
    def bin_width(self) -> float:
        return 2.0**self.bin_width_log2

    @property
    def lo(self) -> float:
        return self.first_bin * self.bin_width

    @property
    def bin_edges(self) -> np.ndarray:
        return self.lo + np.arange(len(self.hist) + 1) * self.bin_width

    def to_json(self) -> dict:
        return {"kind": self.kind, "dtype": self.dtype, "min": self.min, "max": self.max,
                "count": self.count, "nonfinite": self.nonfinite,
                "bin_width_log2": self.bin_width_log2, "first_bin": self.first_bin,
                "hist": self.hist.tolist()}


@dataclass(frozen=True, eq=False)
class Profile:
    """A whole profile. `runs` holds the options and data of each run merged into it."""

    model: ModelFingerprint
    tool_version: str
    samples: int
    runs: tuple[dict, ...]
    tensors: Mapping[str, TensorStats]
    path: str | None = None  # where it was loaded from, for messages; not stored

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION,
                "tool": {"name": "ember", "version": self.tool_version},
                "model": {"fingerprint": self.model.digest, "graph": self.model.graph,
                          "inputs": self.model.inputs, "weights": self.model.weights,
                          "input_shapes": self.model.input_shapes},
                "histogram": {"grid": "power-of-two", "max_bins": histogram.MAX_BINS},
                "samples": self.samples, "runs": list(self.runs),
                "tensors": {name: t.to_json() for name, t in self.tensors.items()}}


def tool_version() -> str:
    try:
        return metadata.version("ember")
    except metadata.PackageNotFoundError:
        return "unknown"


def empty_stats(kind: str, dtype: str) -> TensorStats:
    return TensorStats(kind, dtype, None, None, 0, 0, 0, 0, np.zeros(0, np.int64))


def merge_stats(a: TensorStats, b: TensorStats) -> TensorStats:
    """Exactly the stats of one run over both data sets (weights are seen once, not summed)."""
    if a.kind == "weight":
        return a
    if b.count == 0:
        return replace(a, nonfinite=a.nonfinite + b.nonfinite)
    if a.count == 0:
        return replace(b, nonfinite=a.nonfinite + b.nonfinite)
    lo, hi = min(a.min, b.min), max(a.max, b.max)
    k = histogram.width_log2(lo, hi)
    first = histogram.bin_index(lo, k)
    length = histogram.bin_index(hi, k) - first + 1
    hist = (histogram.rebin(a.hist, a.first_bin, a.bin_width_log2, first, k, length)
            + histogram.rebin(b.hist, b.first_bin, b.bin_width_log2, first, k, length))
    return TensorStats(a.kind, a.dtype, lo, hi, a.count + b.count,
                       a.nonfinite + b.nonfinite, k, first, hist)


def merge(profiles: list[Profile]) -> Profile:
    """Combine shards of one model profiled over disjoint data."""
    if not profiles:
        raise ProfileError("nothing to merge: give at least one profile")
    first = profiles[0]
    for other in profiles[1:]:
        diff = difference(first.model, other.model)
        if diff:
            raise ProfileError(f"cannot merge {_name(other)} into {_name(first)}: profiles of "
                               f"different models: {diff}")
        if set(other.tensors) != set(first.tensors):
            odd = sorted(set(other.tensors) ^ set(first.tensors))[0]
            raise ProfileError(f"cannot merge {_name(other)} into {_name(first)}: tensor "
                               f"'{odd}' is in only one of them")
    tensors = dict(first.tensors)
    for other in profiles[1:]:
        tensors = {name: merge_stats(stats, other.tensors[name]) for name, stats in tensors.items()}
    return Profile(first.model, tool_version(), sum(p.samples for p in profiles),
                   tuple(run for p in profiles for run in p.runs), tensors)


def check_matches(profile: Profile, model: onnx.ModelProto) -> None:
    """Reject a profile made for another model, batch size or set of weights."""
    diff = difference(profile.model, fingerprint(model))
    if diff:
        raise ProfileError(f"{_name(profile)} does not match the model: {diff}; "
                           f"re-run `ember quantize-profile` on this model")


def output_mode() -> int:
    """0666 minus the umask, the mode `open()` would give: every file ember writes gets it
    (mkstemp's temporary files are 0600). simulator.program, below this package, repeats it."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def save(profile: Profile, path: str | os.PathLike) -> None:
    """Write to a temporary file beside `path` and rename it, so no half file ever exists."""
    path = Path(path)
    doc = profile.to_json()
    tensors = doc.pop("tensors")
    head = json.dumps(doc, indent=1)[:-2]
    lines = [f"  {json.dumps(name)}: {json.dumps(t, separators=(',', ':'))}"
             for name, t in tensors.items()]
    text = head + ',\n "tensors": {\n' + ",\n".join(lines) + "\n }\n}\n"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise ProfileError(f"{path}: cannot write profile ({err})") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, output_mode())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load(path: str | os.PathLike) -> Profile:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ProfileError(f"{path}: cannot read profile: {err}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileError(f"{path}: not a JSON profile, or truncated ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ProfileError(f"{path}: not an ember profile (no \"format\": \"{FORMAT}\")")
    if doc.get("version") != VERSION:
        raise ProfileError(f"{path}: profile format version {doc.get('version')}, this ember "
                           f"reads version {VERSION}; re-run `ember quantize-profile`")
    try:
        return _from_json(doc, str(path))
    except KeyError as err:
        raise ProfileError(f"{path}: malformed profile: missing key {err}") from None
    except (TypeError, ValueError) as err:
        raise ProfileError(f"{path}: malformed profile: {err}") from None


def _from_json(doc: dict, path: str) -> Profile:
    if doc["histogram"] != {"grid": "power-of-two", "max_bins": histogram.MAX_BINS}:
        raise ValueError(f"histogram grid {doc['histogram']}, expected "
                         f"power-of-two with max_bins {histogram.MAX_BINS}")
    m = doc["model"]
    model = ModelFingerprint(m["graph"], m["inputs"], m["weights"], dict(m["input_shapes"]))
    if model.digest != m["fingerprint"]:
        raise ValueError("model fingerprint does not match its parts")
    tensors = {name: _stats_from_json(name, t) for name, t in doc["tensors"].items()}
    return Profile(model, doc["tool"]["version"], int(doc["samples"]), tuple(doc["runs"]),
                   tensors, path)


def _stats_from_json(name: str, t: dict) -> TensorStats:
    stats = TensorStats(t["kind"], t["dtype"], t["min"], t["max"], int(t["count"]),
                        int(t["nonfinite"]), int(t["bin_width_log2"]), int(t["first_bin"]),
                        np.asarray(t["hist"], dtype=np.int64))
    if stats.kind not in KINDS:
        raise ValueError(f"tensor '{name}': kind '{stats.kind}', expected one of {KINDS}")
    if stats.count == 0:
        expected = 0
    else:
        expected = (histogram.bin_index(stats.max, stats.bin_width_log2)
                    - stats.first_bin + 1)
    if len(stats.hist) != expected or int(stats.hist.sum()) != stats.count:
        raise ValueError(f"tensor '{name}': histogram of {len(stats.hist)} bins holding "
                         f"{int(stats.hist.sum())} values, expected {expected} bins holding "
                         f"{stats.count}")
    return stats


def _name(profile: Profile) -> str:
    return profile.path or "the profile"
