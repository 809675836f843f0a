"""Design-space exploration: compile and time one or more models on many architectures, and
keep the points no other beats on cycles and area, or on cycles and energy.

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

The space is a grid: point `index` is the mixed-radix number of its values' positions, the
first key the most significant, so the grid search runs `itertools.product`'s order and a
random search draws indices without repetition from a seeded generator. A local search
(Pareto local search) spends a quarter of its budget at random, then evaluates, batch after
batch, untried neighbours (one key moved to the next or previous value) of the points on
either front; batches have a fixed size, so its choices do not depend on the workers. Results
are exact and in index order, so where the points ran (`--cluster`) changes nothing in them.
"""

from __future__ import annotations

import math
import random
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from compiler.backend.program import BackendOptions
from compiler.errors import CompileError
from ember import cluster
from ember.errors import EmberError
from ember.flow import CompileOptions, prepare_model
from simulator import machine
from simulator.arch import KEYS, Arch
from simulator.errors import SimulatorError
from simulator.stats import Stats

SWEEP_VERSION = 1
SEARCHES = ("grid", "random", "local")
LOCAL_BATCH = 8  # points a local search chooses at once, from the results before them
# What a point's architecture costs, known before compiling: the quantities constraints bound.
METRICS = {"pes": "processing elements (array.rows * array.cols)",
           "sram_bytes": "local memory bytes (scratchpad + accumulator)",
           "area_mm2": "estimated area in mm² (the target's [area] figures)"}
OBJECTIVES = ("cycles", "energy_uj", "area_mm2")
# The two trade-offs reported as Pareto fronts: (x, y), both minimized.
FRONTS = {"cycles_area": ("area_mm2", "cycles"), "cycles_energy": ("energy_uj", "cycles")}
# Keys set from array.cols at every point, never from the space file.
DERIVED = {"memory.scratchpad.row_bytes": 1, "memory.accumulator.row_bytes": 4}
MAX_VALUES = 10_000  # per key: a range that long is a typo, not a sweep
GRID_MAX = 1_000_000  # points a grid search may have: beyond, a random search
# A random search walks a shuffled list of the space when it is at most this big, and draws
# with rejection beyond; either gives up after DRAWS_PER_POINT draws per point asked for (a
# space that the constraints leave nearly empty).
SHUFFLED_MAX = 1_000_000
DRAWS_PER_POINT = 1000


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


def draw(space: Space, search: str, seed: int | None) -> Iterator[int]:
    """Point indices in the order the search visits them: the grid's order, or a seeded
    uniform draw without repetition."""
    if search == "grid":
        yield from range(space.size)
        return
    rng = random.Random(seed)
    if space.size <= SHUFFLED_MAX:
        yield from rng.sample(range(space.size), space.size)
        return
    seen: set[int] = set()
    while True:
        index = rng.randrange(space.size)
        if index not in seen:
            seen.add(index)
            yield index


def neighbours(space: Space, index: int) -> list[int]:
    """The points one step away on one key (the previous or next value in its list)."""
    found, stride = [], 1
    for values in reversed(space.axes.values()):
        position = index // stride % len(values)
        if position > 0:
            found.append(index - stride)
        if position + 1 < len(values):
            found.append(index + stride)
        stride *= len(values)
    return sorted(found)


@dataclass(frozen=True)
class Model:
    """One model of the workload: its ONNX file, its profile, the name results use."""

    path: str
    profile: str
    name: str


class _Chooser:
    """Turns point indices into shards to evaluate, once each: a point whose keys make no
    architecture is kept as failed, one the constraints exclude is counted."""

    def __init__(self, space: Space, base: Arch):
        self.space, self.base = space, base.to_dict()
        self.seen: set[int] = set()
        self.configs: dict[int, dict] = {}
        self.invalid: dict[int, str] = {}
        self.metrics: dict[int, dict] = {}  # of the points evaluated
        self.excluded = 0

    def take(self, index: int) -> tuple[int, dict, dict] | None:
        """The shard of point `index`, or None when it is seen, invalid or excluded."""
        if index in self.seen:
            return None
        self.seen.add(index)
        config = self.space.config(index)
        try:
            arch = arch_at(self.base, config)
        except SimulatorError as err:
            self.configs[index] = config
            self.invalid[index] = str(err).removeprefix("point: ")
            return None
        cost = metrics(arch)
        if self.space.violated(cost) is not None:
            self.excluded += 1
            return None
        self.configs[index] = config
        self.metrics[index] = cost
        return index, config, arch.to_dict()

    @property
    def taken(self) -> int:
        """Points that count against a budget: evaluated or invalid."""
        return len(self.metrics) + len(self.invalid)


def _batches(chooser: _Chooser, search: str, points: int, seed: int | None,
             results: dict[int, dict]) -> Iterator[list]:
    """Lists of shards to evaluate, each list after the results of those before it are in
    `results` (so that a search may choose from them; lists of a fixed size keep it
    independent of how many workers there are)."""
    space = chooser.space
    if search == "grid" and space.size > GRID_MAX:
        raise EmberError(f"{space.source}: the grid has {space.size:,} points: expected at most "
                         f"{GRID_MAX:,}; use --search random --points N")
    budget = space.size if search == "grid" else points
    order = draw(space, "grid" if search == "grid" else "random", seed)
    draws = [0]

    def fill(batch: list, size: int) -> None:  # from the grid's or the random order
        for index in order:
            draws[0] += 1
            if (shard := chooser.take(index)) is not None:
                batch.append(shard)
            if len(batch) >= size or chooser.taken >= budget or \
                    draws[0] >= DRAWS_PER_POINT * budget:
                return

    if search != "local":
        batch: list = []
        fill(batch, budget)
        yield batch
        return
    # Pareto local search: a quarter of the budget at random, then batches of the untried
    # neighbours of the points on either front (random points when there are none).
    rng = random.Random(seed)
    batch = []
    fill(batch, max(1, budget // 4))
    yield batch
    while chooser.taken < budget:
        ok = [r for r in results.values() if r["status"] == "ok"]
        front = sorted({p["index"] for x, y in FRONTS.values()
                        for p in pareto_front(ok, x, y)})
        candidates = sorted({n for i in front for n in neighbours(space, i)} - chooser.seen)
        rng.shuffle(candidates)
        batch, before = [], chooser.taken
        size = min(LOCAL_BATCH, budget - chooser.taken)
        for index in candidates:
            if len(batch) >= size or chooser.taken >= budget:
                break
            if (shard := chooser.take(index)) is not None:
                batch.append(shard)
        if len(batch) < size and chooser.taken < budget:
            fill(batch, size)
        if chooser.taken == before and not batch:
            return  # the space is exhausted
        yield batch


def run(models: Sequence[Model], space: Space, base: Arch, search: str = "grid",
        points: int | None = None, seed: int | None = None,
        where: cluster.Where = cluster.Where(), backend: BackendOptions = BackendOptions(),
        on_point: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """The sweep's document (see `ember sweep --help` for its keys). A grid search evaluates
    every point, a random or local one `points` points (failed ones included)."""
    work = Work(tuple(models), CompileOptions(backend=backend))
    shared = cluster.Shared(work)
    _prepared(shared, work)  # here first: a model or profile error is the user's, in one line
    chooser = _Chooser(space, base)
    results: dict[int, dict] = {}
    total = space.size if search == "grid" else points or 0
    done = 0
    on_point(0, total)
    with cluster.Cluster(where) as runner:
        for batch in _batches(chooser, search, points or 0, seed, results):
            for _, result in runner.run(evaluate, shared, batch):
                results[result["index"]] = {**result, **chooser.metrics[result["index"]]}
                done += 1
                on_point(done, total)
    if not chooser.metrics and chooser.excluded:
        bounds = ", ".join(f"{k} in [{'-inf' if lo is None else f'{lo:g}'}, "
                           f"{'inf' if hi is None else f'{hi:g}'}]"
                           for k, (lo, hi) in space.constraints.items())
        raise EmberError(f"{space.source}: no point satisfies the constraints ({bounds}; "
                         f"{chooser.excluded} points excluded)")
    for index, reason in chooser.invalid.items():
        results[index] = {"index": index, "status": "failed", "reason": reason}
    rows = [{"index": index, "config": chooser.configs[index], **results[index]}
            for index in sorted(results)]
    ok = [r for r in rows if r["status"] == "ok"]
    fronts = {name: [p["index"] for p in pareto_front(ok, x, y)]
              for name, (x, y) in FRONTS.items()}
    # Ties on an objective go to the point better on the others, then to the lower index.
    best = {objective: min(ok, key=lambda p: (p[objective], *(p[o] for o in OBJECTIVES),
                                              p["index"]))["index"]
            for objective in OBJECTIVES} if ok else {}
    return {"sweep_version": SWEEP_VERSION, "target": base.name,
            "models": [{"name": m.name, "path": m.path, "profile": m.profile} for m in models],
            "space": {"source": space.source, "size": space.size, **space.to_dict()},
            "search": search, "seed": seed if search != "grid" else None,
            "allow_host": backend.allow_host,
            "evaluated": len(chooser.metrics), "failed": sum(r["status"] != "ok" for r in rows),
            "excluded_by_constraints": chooser.excluded,
            "best": best, "pareto": fronts, "points": rows}


@dataclass(frozen=True)
class Work:
    """What every worker needs (sent once): the models and how to compile them."""

    models: tuple[Model, ...]
    options: CompileOptions


def evaluate(shared: cluster.Shared, shard: tuple[int, dict, dict]) -> dict:
    """One point: every model compiled for its architecture and timed (the timing needs no
    data). A model that cannot be compiled fails the point, with the compiler's reason."""
    work: Work = shared.payload
    prepared = _prepared(shared, work)
    index, _, arch_dict = shard
    arch = Arch.from_dict(arch_dict)
    per_model = {}
    for model, ready in zip(work.models, prepared):
        try:
            program = ready.compile(arch).program
        except CompileError as err:
            return {"index": index, "status": "failed", "reason": f"{model.name}: {err}"}
        stats = Stats.collect(program, machine.timing(program))
        report = stats.to_report()
        per_model[model.name] = {
            "cycles": stats.cycles, "time_ms": report["time_ms"], "energy_uj": stats.energy_uj,
            "dram_bytes": stats.dram_bytes_read + stats.dram_bytes_written,
            "mac_utilization": report["mac_utilization"],
            "bound_cycles": stats.bound_cycles}
    return {"index": index, "status": "ok",
            "cycles": sum(m["cycles"] for m in per_model.values()),
            "time_ms": sum(m["time_ms"] for m in per_model.values()),
            "energy_uj": sum(m["energy_uj"] for m in per_model.values()),
            "models": per_model}


def _prepared(shared: cluster.Shared, work: Work) -> list:
    """The quantized models, built once per worker process."""
    return cluster.cached(shared, "prepared", lambda: [
        prepare_model(m.path, m.profile, work.options) for m in work.models])


def pareto_front(points: Sequence[dict], x: str, y: str) -> list[dict]:
    """The points no other beats on both `x` and `y` (both minimized; a point beats another
    when it is no worse on both and better on one), by increasing `x`."""
    ordered = sorted(points, key=lambda p: (p[x], p[y], p["index"]))
    front: list[dict] = []
    for p in ordered:
        if not front or p[y] < front[-1][y] or (p[x], p[y]) == (front[-1][x], front[-1][y]):
            front.append(p)
    return front
