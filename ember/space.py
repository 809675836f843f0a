"""The design space of `ember sweep`: its file, its points and what each costs.

A space file (TOML) has a `[space]` table whose keys are the architecture file's dotted keys,
each with the values to try: a list (`"array.rows" = [8, 16, 32]`), a range whose stop is
included when reached (`{start = 8, stop = 64, step = 8}`), a geometric range
(`{start = 8, stop = 64, factor = 2}` is 8, 16, 32, 64) or one value (fixed for every point).
Every key it leaves out keeps the base target's value. The row widths of the local memories
are not knobs: one scratchpad row is one array-width vector, so each point's
`memory.scratchpad.row_bytes` is its `array.cols` and `memory.accumulator.row_bytes` four
times that, and a space file that names them is refused.

An optional `[constraints]` table bounds what an architecture costs, before anything is
compiled: `pes = {max = 1024}`, `sram_bytes = {max = 524288}`, `area_mm2 = {min = 0.5,
max = 2.0}` (`METRICS`). Points outside are not evaluated (and counted); a point whose keys
do not make an architecture (more array rows than columns) or that a model cannot be
compiled for is kept in the results as failed, with the reason.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember.errors import EmberError
from simulator.arch import KEYS, Arch

# What a point's architecture costs, known before compiling: the quantities constraints bound.
METRICS = {"pes": "processing elements (array.rows * array.cols)",
           "sram_bytes": "local memory bytes (scratchpad + accumulator)",
           "area_mm2": "estimated area in mm² (the target's [area] figures)"}
# Keys set from array.cols at every point, never from the space file.
DERIVED = {"memory.scratchpad.row_bytes": 1, "memory.accumulator.row_bytes": 4}
MAX_VALUES = 10_000  # per key: a range that long is a typo, not a sweep


@dataclass(frozen=True)
class Space:
    """The values of each key (file order) and the bounds on METRICS: metric -> (min, max)."""

    axes: dict[str, tuple]
    constraints: dict[str, tuple[float | None, float | None]]
    source: str

    @property
    def size(self) -> int:
        return math.prod(len(values) for values in self.axes.values())

    def config(self, index: int) -> dict[str, Any]:
        """The values of point `index` (first key most significant)."""
        config = {}
        for key, values in reversed(self.axes.items()):
            index, position = divmod(index, len(values))
            config[key] = values[position]
        return dict(reversed(config.items()))

    def violated(self, metrics: dict[str, float]) -> str | None:
        """The first constraint `metrics` break, spelled for a person, or None."""
        for name, (low, high) in self.constraints.items():
            if low is not None and metrics[name] < low:
                return f"{name} = {metrics[name]:g} < {low:g}"
            if high is not None and metrics[name] > high:
                return f"{name} = {metrics[name]:g} > {high:g}"
        return None

    def to_dict(self) -> dict:
        return {"axes": {key: list(values) for key, values in self.axes.items()},
                "constraints": {name: {k: v for k, v in (("min", low), ("max", high))
                                       if v is not None}
                                for name, (low, high) in self.constraints.items()}}


def load_space(path: str | Path) -> Space:
    """Read and check a space file; every mistake is one line naming the file and the key."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise EmberError(f"{path}: cannot read the space file: {err.strerror or err}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise EmberError(f"{path}: not valid TOML: {err}") from None
    return parse_space(data, str(path))


def parse_space(data: dict, source: str) -> Space:
    unknown = sorted(set(data) - {"space", "constraints"})
    if unknown:
        raise EmberError(f"{source}: unknown table [{unknown[0]}] (expected [space] and an "
                         f"optional [constraints])")
    table = data.get("space")
    if not isinstance(table, dict) or not table:
        raise EmberError(f"{source}: the space is empty: expected a [space] table with at least "
                         f'one key, such as "array.rows" = [8, 16, 32]')
    axes = {}
    for key, spec in table.items():
        if isinstance(spec, dict) and not spec.keys() & {"start", "stop"}:
            raise EmberError(f"{source}: [space] {key}: a table; quote dotted keys "
                             f'("{key}.{next(iter(spec), "")}" = [...])')
        if key in DERIVED:
            raise EmberError(f"{source}: [space] {key!r} is derived from array.cols at every "
                             f"point (one local-memory row per array-width vector): sweep "
                             f"array.cols instead")
        if key not in KEYS or key == "name":
            raise EmberError(f"{source}: [space] unknown key {key!r}: expected a dotted key of "
                             f"the architecture file, such as array.rows, array.dataflow, "
                             f"memory.scratchpad.size_bytes, dma.bytes_per_cycle, vector.lanes, "
                             f"clock_mhz")
        values = _values(spec, f"{source}: [space] {key}")
        check, expected = KEYS[key]
        for value in values:
            if not check(value):
                raise EmberError(f"{source}: [space] {key}: value {value!r}: expected {expected}")
        if len(set(map(repr, values))) != len(values):
            raise EmberError(f"{source}: [space] {key}: a value is repeated: expected each once")
        axes[key] = values
    constraints = {}
    for name, bound in (data.get("constraints") or {}).items():
        where = f"{source}: [constraints] {name}"
        if name not in METRICS:
            raise EmberError(f"{where}: unknown metric: expected one of {', '.join(METRICS)}")
        if not isinstance(bound, dict) or not bound or set(bound) - {"min", "max"} or not all(
                _number(v) for v in bound.values()):
            raise EmberError(f"{where}: expected a table of numbers with min, max or both, "
                             f"such as {name} = {{max = 1024}}")
        constraints[name] = (bound.get("min"), bound.get("max"))
    return Space(axes, constraints, source)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _values(spec, where: str) -> tuple:
    """A list, a range table or one value, as a tuple of values."""
    if isinstance(spec, list):
        if not spec:
            raise EmberError(f"{where}: an empty list: expected at least one value")
        return tuple(spec)
    if not isinstance(spec, dict):
        return (spec,)
    allowed = {"start", "stop", "step", "factor"}
    if set(spec) - allowed or not {"start", "stop"} <= set(spec) or \
            len(set(spec) & {"step", "factor"}) != 1 or not all(map(_number, spec.values())):
        raise EmberError(f"{where}: expected a list, or a range of numbers {{start, stop, step}} "
                         f"or {{start, stop, factor}}")
    start, stop = spec["start"], spec["stop"]
    step, factor = spec.get("step"), spec.get("factor")
    if stop < start or (step is not None and step <= 0) or \
            (factor is not None and (factor <= 1 or start <= 0)):
        raise EmberError(f"{where}: expected start <= stop and a positive step (or a factor "
                         f"> 1 from a positive start)")
    values, value = [], start
    while value <= stop * (1 + 1e-12) and len(values) <= MAX_VALUES:
        values.append(value)
        value = start + len(values) * step if step is not None else value * factor
    if len(values) > MAX_VALUES:
        raise EmberError(f"{where}: more than {MAX_VALUES} values: expected a shorter range")
    return tuple(values)


def arch_at(base: dict, config: dict[str, Any]) -> Arch:
    """The architecture of a point: `base` (a target's dict) with `config`'s keys set and the
    row widths derived from array.cols. Raises SimulatorError when the keys do not fit together,
    its message without a file name (the point is named by the caller)."""
    data = _deep_copy(base)
    for key, value in config.items():
        _set(data, key, value)
    cols = data["array"]["cols"]
    for key, times in DERIVED.items():
        _set(data, key, times * cols)
    return Arch.from_dict(data, source="point")


def _deep_copy(d: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def _set(data: dict, key: str, value) -> None:
    *path, last = key.split(".")
    for part in path:
        data = data.setdefault(part, {})
    data[last] = value


def metrics(arch: Arch) -> dict[str, float]:
    return {"pes": arch.macs_per_cycle, "sram_bytes": arch.sram_bytes,
            "area_mm2": arch.area_um2 / 1e6}
