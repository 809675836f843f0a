"""The profile file: schema, reading, writing, merging shards, and matching it to a model.

This is the only code that reads or writes `.profile.json`. The file is versioned JSON; every
histogram lies on the power-of-two grid of `profiler.histogram`, which makes merging exact.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, replace
from fractions import Fraction
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
    # Per index of the last axis (a LayerNorm output's channels), when the profiler records
    # them: the quantizer's smoothing of the norm's outlier channels (`quantizer.smooth`).
    channel_min: np.ndarray | None = None
    channel_max: np.ndarray | None = None
    # Per channel of the axis a Conv, Gemm or MatMul reading the tensor contracts (Conv: 1,
    # Gemm and MatMul: the last), the exact sum of its values in units of 2^-SUM_EXPONENT
    # (every float32 value is a whole number of them), so sums merge exactly: the quantizer's
    # bias correction reads each channel's mean (`channel_means`).
    channel_sum: tuple[int, ...] | None = None

    def channel_means(self) -> np.ndarray | None:
        """Each channel's mean value, from `channel_sum` (None without it)."""
        if self.channel_sum is None or not self.count:
            return None
        per_channel = self.count // len(self.channel_sum)
        return np.array([math.ldexp(float(Fraction(s, per_channel)), -SUM_EXPONENT)
                         for s in self.channel_sum])

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
                "hist": self.hist.tolist(),
                **({} if self.channel_min is None else
                   {"channel_min": self.channel_min.tolist(),
                    "channel_max": self.channel_max.tolist()}),
                **({} if self.channel_sum is None else {"channel_sum": list(self.channel_sum)})}


@dataclass(frozen=True, eq=False)
class Profile:
    """A whole profile. `runs` holds the options and data of each run merged into it."""

    model: ModelFingerprint
    tool_version: str
    samples: int
    runs: tuple[dict, ...]
    tensors: Mapping[str, TensorStats]
    path: str | None = None  # where it was loaded from, for messages; not stored

    @property
    def synthetic(self) -> bool:
        """Whether any run profiled made-up data (`--random`) rather than real samples."""
        return any(run["data"].get("synthetic", False) for run in self.runs)

    @property
    def input_shapes(self) -> dict[str, list[int | None]]:
        """The shape each input was profiled at: what --input-shape fixed or the model
        declared, None where the data decided. Runs merged at different batch sizes leave the
        batch axis None: ranges are per sample, so the batch size does not change them."""
        shapes: dict[str, list[int | None]] = {}
        for run in self.runs:
            for name, dims in run["options"]["input_shapes"].items():
                seen = shapes.setdefault(name, list(dims))
                shapes[name] = [a if a == b else None for a, b in zip(seen, dims)]
        return shapes

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
    channels = a.channel_min is not None and b.channel_min is not None and \
        a.channel_min.shape == b.channel_min.shape
    sums = a.channel_sum is not None and b.channel_sum is not None and \
        len(a.channel_sum) == len(b.channel_sum)
    return TensorStats(a.kind, a.dtype, lo, hi, a.count + b.count,
                       a.nonfinite + b.nonfinite, k, first, hist,
                       np.minimum(a.channel_min, b.channel_min) if channels else None,
                       np.maximum(a.channel_max, b.channel_max) if channels else None,
                       tuple(x + y for x, y in zip(a.channel_sum, b.channel_sum))
                       if sums else None)


def merge(profiles: list[Profile], allow_same_data: bool = False) -> Profile:
    """Combine shards of one model profiled over disjoint data.

    Two runs over the same data (equal data digests: the same file given twice, or a shard
    profiled twice) would count its samples twice, so they are refused unless
    `allow_same_data` says that weighting is meant.
    """
    if not profiles:
        raise ProfileError("nothing to merge: give at least one profile")
    first = profiles[0]
    for other in profiles[1:]:
        diff = difference(first.model, other.model)
        if diff:
            raise ProfileError(f"cannot merge {_name(other)} into {_name(first)}: profiles of "
                               f"different models: {diff}")
        if _per_sample(other.input_shapes) != _per_sample(first.input_shapes):
            raise ProfileError(f"cannot merge {_name(other)} into {_name(first)}: profiled at "
                               f"different input shapes: {_shown(first.input_shapes)} and "
                               f"{_shown(other.input_shapes)}")
        if set(other.tensors) != set(first.tensors):
            odd = sorted(set(other.tensors) ^ set(first.tensors))[0]
            raise ProfileError(f"cannot merge {_name(other)} into {_name(first)}: tensor "
                               f"'{odd}' is in only one of them")
    if not allow_same_data:
        _check_disjoint(profiles)
    tensors = dict(first.tensors)
    for other in profiles[1:]:
        tensors = {name: merge_stats(stats, other.tensors[name]) for name, stats in tensors.items()}
    return Profile(first.model, tool_version(), sum(p.samples for p in profiles),
                   tuple(run for p in profiles for run in p.runs), tensors)


def _per_sample(shapes: dict[str, list]) -> dict[str, list]:
    """Shapes without their batch axis: what a sample's ranges depend on."""
    return {name: dims[1:] for name, dims in shapes.items()}


def _shown(shapes: dict[str, list]) -> str:
    return ", ".join(f"{name}[{','.join('?' if d is None else str(d) for d in dims)}]"
                     for name, dims in shapes.items())


def _check_disjoint(profiles: list[Profile]) -> None:
    seen: dict[str, Profile] = {}
    for p in profiles:
        digests = {run["data"]["sha256"] for run in p.runs}
        for digest in digests:
            if digest in seen:
                raise ProfileError(
                    f"cannot merge {_name(p)} into {_name(seen[digest])}: both hold a run over "
                    f"the same data (sha256 {digest[:12]}), whose samples would count twice; "
                    f"merge profiles of disjoint data, or pass --allow-same-data to count it "
                    f"twice on purpose")
        seen.update(dict.fromkeys(digests, p))


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
    except OSError as err:  # its message would name the temporary file: say what failed
        raise ProfileError(f"{path}: cannot write: {err.strerror or err}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, output_mode())
        os.replace(tmp, path)
    except OSError as err:  # a full disk, a permission lost since the file was made
        os.unlink(tmp)
        raise ProfileError(f"{path}: cannot write: {err.strerror or err}") from None
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
    except (ValueError, RecursionError) as err:  # an integer of 4300+ digits, deep nesting
        raise ProfileError(f"{path}: not a JSON profile ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ProfileError(f"{path}: not an ember profile (no \"format\": \"{FORMAT}\")")
    if doc.get("version") != VERSION:
        raise ProfileError(f"{path}: profile format version {doc.get('version')}, this ember "
                           f"reads version {VERSION}; re-run `ember quantize-profile`")
    try:
        return _from_json(doc, str(path))
    except _Malformed as err:
        raise ProfileError(f"{path}: malformed profile: {err}") from None


class _Malformed(ValueError):
    """One bad key of a profile; `load` prefixes the file's name."""


# Counts stay below 2^53: exact in float64, which calibration sums them in, and in int64.
_COUNT_MAX = 2**53
_TOP_KEYS = ("format", "version", "tool", "model", "histogram", "samples", "runs", "tensors")
_TENSOR_KEYS = ("kind", "dtype", "min", "max", "count", "nonfinite", "bin_width_log2",
                "first_bin", "hist")
_CHANNEL_KEYS = ("channel_min", "channel_max")  # both or neither
# A channel sum's units: 2^-149 is float32's smallest step, so every float32 value is a whole
# number of units (`TensorStats.channel_sum`).
SUM_EXPONENT = 149


def _is_int(v, lo: int = 0, hi: int = _COUNT_MAX) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _is_finite(v) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) <= sys.float_info.max


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _require(ok: bool, where: str, value, expected: str) -> None:
    if not ok:
        raise _Malformed(f"{where} = {_show(value)}: expected {expected}")


def _object(value, where: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    """`value`, checked to be an object with exactly `keys` (and any of `optional`)."""
    _require(isinstance(value, dict), where, value, "an object")
    for k in keys:
        if k not in value:
            raise _Malformed(f"{where}: missing key {k!r}")
    extra = sorted(set(value) - set(keys) - set(optional))
    if extra:
        raise _Malformed(f"{where}: unknown key {extra[0]!r}")
    return value


def _from_json(doc: dict, path: str) -> Profile:
    """Check every key, type and range before anything is built from the file."""
    _object(doc, "profile", _TOP_KEYS)
    if doc["histogram"] != {"grid": "power-of-two", "max_bins": histogram.MAX_BINS}:
        raise _Malformed(f"histogram grid {_show(doc['histogram'])}, expected "
                         f"power-of-two with max_bins {histogram.MAX_BINS}")
    tool = _object(doc["tool"], "tool", ("name", "version"))
    _require(tool["name"] == "ember", "tool.name", tool["name"], '"ember"')
    _require(isinstance(tool["version"], str), "tool.version", tool["version"], "a string")
    m = _object(doc["model"], "model", ("fingerprint", "graph", "inputs", "weights",
                                        "input_shapes"))
    for key in ("fingerprint", "graph", "inputs", "weights"):
        _require(isinstance(m[key], str), f"model.{key}", m[key], "a string")
    shapes = m["input_shapes"]
    _require(isinstance(shapes, dict) and all(
        isinstance(dims, list) and all(d is None or isinstance(d, str) or _is_int(d)
                                       for d in dims) for dims in shapes.values()),
        "model.input_shapes", shapes, "an object of lists of dimensions")
    model = ModelFingerprint(m["graph"], m["inputs"], m["weights"], dict(shapes))
    if model.digest != m["fingerprint"]:
        raise _Malformed("model fingerprint does not match its parts")
    samples = doc["samples"]
    _require(_is_int(samples), "samples", samples, "a non-negative integer below 2^53")
    runs = doc["runs"]
    _require(isinstance(runs, list) and runs, "runs", runs, "a non-empty list of run records")
    for i, run in enumerate(runs):
        _check_run(run, f"runs[{i}]")
    if sum(run["samples"] for run in runs) != samples:
        raise _Malformed(f"samples = {samples}, but its runs hold "
                         f"{sum(run['samples'] for run in runs)}")
    _require(isinstance(doc["tensors"], dict), "tensors", doc["tensors"],
             "an object keyed by tensor name")
    tensors = {name: _stats_from_json(name, t) for name, t in doc["tensors"].items()}
    return Profile(model, tool["version"], samples, tuple(runs), tensors, path)


def _check_run(run, where: str) -> None:
    """What ember reads of a run record: its sample counts, the input shapes it fed, and its
    data's kind and digest."""
    _require(isinstance(run, dict), where, run, "an object")
    options = run.get("options")
    _require(isinstance(options, dict), f"{where}.options", options, "an object")
    shapes = options.get("input_shapes")
    _require(isinstance(shapes, dict) and all(
        isinstance(dims, list) and all(d is None or _is_int(d, 1) for d in dims)
        for dims in shapes.values()), f"{where}.options.input_shapes", shapes,
        "an object of lists of positive dimensions or null")
    for key in ("samples", "skipped_nonfinite", "dropped"):
        _require(_is_int(run.get(key)), f"{where}.{key}", run.get(key),
                 "a non-negative integer below 2^53")
    data = run.get("data")
    _require(isinstance(data, dict), f"{where}.data", data, "an object")
    _require(isinstance(data.get("kind"), str), f"{where}.data.kind", data.get("kind"),
             "a string")
    digest = data.get("sha256")
    _require(isinstance(digest, str) and re.fullmatch("[0-9a-f]{64}", digest) is not None,
             f"{where}.data.sha256", digest, "a SHA-256 in hex")
    _require(isinstance(data.get("synthetic", False), bool), f"{where}.data.synthetic",
             data.get("synthetic"), "true or false")
    # The rest of the record is kept as it is, into merged profiles: JSON only (no NaN).
    bad = _non_finite(run)
    if bad is not None:
        raise _Malformed(f"{where}.{bad[0]} = {bad[1]!r}: expected a finite number")


def _non_finite(node, path: str = "") -> tuple[str, float] | None:
    """The dotted path to the first NaN or infinity in a JSON value and that value, or None."""
    if isinstance(node, float) and not math.isfinite(node):
        return path.lstrip("."), node
    children = node.items() if isinstance(node, dict) else \
        enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        found = _non_finite(child, f"{path}.{key}")
        if found is not None:
            return found
    return None


def _stats_from_json(name: str, t) -> TensorStats:
    where = f"tensor {name!r}"
    _object(t, where, _TENSOR_KEYS, (*_CHANNEL_KEYS, "channel_sum"))
    _require(t["kind"] in KINDS, f"{where}: kind", t["kind"], f"one of {', '.join(KINDS)}")
    _require(isinstance(t["dtype"], str) and t["dtype"] != "", f"{where}: dtype", t["dtype"],
             "a non-empty string")
    for key in ("count", "nonfinite"):
        _require(_is_int(t[key]), f"{where}: {key}", t[key],
                 "a non-negative integer below 2^53")
    hist = t["hist"]
    # type() rather than isinstance(): excludes bools, and is fast over 4096 bins.
    _require(isinstance(hist, list) and all(type(c) is int for c in hist)
             and (not hist or 0 <= min(hist) and max(hist) <= _COUNT_MAX), f"{where}: hist",
             hist, "a list of non-negative integer counts")
    count, lo, hi = t["count"], t["min"], t["max"]
    if count == 0:
        # Nothing was counted: the empty histogram `empty_stats` writes.
        for key, expected in (("min", None), ("max", None), ("bin_width_log2", 0),
                              ("first_bin", 0), ("hist", [])):
            _require(t[key] == expected and type(t[key]) is type(expected), f"{where}: {key}",
                     t[key], f"{json.dumps(expected)} when count is 0")
    else:
        for key in ("min", "max"):
            _require(_is_finite(t[key]), f"{where}: {key}", t[key], "a finite number")
        if lo > hi:
            raise _Malformed(f"{where}: min {lo!r} > max {hi!r}")
        k = histogram.width_log2(lo, hi)
        _require(_is_int(t["bin_width_log2"], -2**31, 2**31) and t["bin_width_log2"] == k,
                 f"{where}: bin_width_log2", t["bin_width_log2"],
                 f"{k}, the grid's width for [min, max]")
        first = histogram.bin_index(lo, k)
        _require(_is_int(t["first_bin"], -2**62, 2**62) and t["first_bin"] == first,
                 f"{where}: first_bin", t["first_bin"], f"{first}, the bin of min")
        bins = histogram.bin_index(hi, k) - first + 1
        if len(hist) != bins or sum(hist) != count or not (hist[0] and hist[-1]):
            raise _Malformed(f"{where}: histogram of {len(hist)} bins holding {sum(hist)} "
                             f"values, expected {bins} bins holding {count}, with min in the "
                             f"first and max in the last")
    return TensorStats(t["kind"], t["dtype"], None if lo is None else float(lo),
                       None if hi is None else float(hi), count, t["nonfinite"],
                       t["bin_width_log2"], t["first_bin"], np.asarray(hist, dtype=np.int64),
                       *_channel_ranges(t, where, lo, hi), _channel_sum(t, where))


def _channel_sum(t: dict, where: str) -> tuple[int, ...] | None:
    """The optional per-channel sums: whole numbers, as many channels as divide the count,
    each no larger than its channel's values could add up to."""
    if "channel_sum" not in t:
        return None
    sums, count = t["channel_sum"], t["count"]
    _require(isinstance(sums, list) and sums and all(type(s) is int for s in sums)
             and count % len(sums) == 0, f"{where}: channel_sum", sums,
             "a non-empty list of whole numbers, one per channel, the count a multiple of it")
    largest = max(abs(t["min"] or 0.0), abs(t["max"] or 0.0))
    bound = (count // len(sums)) * (math.ldexp(largest, SUM_EXPONENT) + 1)
    _require(all(abs(s) <= bound for s in sums), f"{where}: channel_sum", sums,
             "sums no larger than the channel's count times the largest |value|")
    return tuple(sums)


def _channel_ranges(t: dict, where: str, lo, hi) -> tuple:
    """The optional per-channel minima and maxima: equal-length lists of finite numbers,
    each channel's range inside the tensor's."""
    present = [key in t for key in _CHANNEL_KEYS]
    if not any(present):
        return None, None
    _require(all(present), f"{where}: channel_min", "only one of the pair",
             "channel_min and channel_max together")
    ranges = []
    for key in _CHANNEL_KEYS:
        values = t[key]
        _require(isinstance(values, list) and values and all(_is_finite(v) for v in values),
                 f"{where}: {key}", values, "a non-empty list of finite numbers")
        ranges.append(np.asarray(values, np.float64))
    low, high = ranges
    if low.shape != high.shape or lo is None or np.any(low > high) or \
            low.min() < lo or high.max() > hi:
        raise _Malformed(f"{where}: channel_min/channel_max: expected two lists of one length, "
                         f"each channel's min <= max within [min, max]")
    return low, high


def _name(profile: Profile) -> str:
    return profile.path or "the profile"
